"""LearnedTree's work on one level, written once: features, forest, calibration, keep and expand.

``make_level`` assembles the level from its parts (``fill``, a forest, ``calibrate``, ``keep_best``,
``expand``); the parts are scalar loops over plain arrays, so numba compiles the same source into one native
call (``kernels()``, when numba imports and the predictor's forest is available as arrays) and Python runs it
as it is otherwise (the forest then through the predictor's own entry point). A level that runs right after
a draft forward pays a fixed cost for each cold call, whatever its arguments (docs/performance.md, "LearnedTree's
level"), so the compiled level is one call; ``observe`` is the step's second (the tried nodes and the
correction's update).

``LevelState`` holds a request's arrays: its constants (feature columns, budget rules, isotonic map, latency
profile, forest) and the step's buffers by candidate index (values, predictions, keep, children, parents),
so later levels read their parents' rows and ``observe`` reads the whole step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from treewise.predictor.forest import ForestTables
from treewise.predictor.online import newton

from .budgets import DomainBudget
from .features import SPECIAL, STEP_SCALARS, FeatureLayout

A = np.ndarray
# rules[]: the budget's rules
THRESHOLD, COST_SCALE, NODE_BUDGET, MAX_WIDTH, MAX_DEPTH, TIMED = range(6)
# scalars[]: the step's running state (read and written by the level; BEST written only), this level's depth and
# estimate, the step's first position, the request's correction (on, e^-offset, slope), then the step's shared
# feature values untyped, in STEP_SCALARS order.
GAIN, NODES, DRAFT_MS, BEST, EST, DEPTH, POS0, CAL_ON, CAL_SCALE, CAL_SLOPE, RAW0 = range(11)
_CLIP = 1e-4  # as predictor.online


def fill(x: A, m: int, cols: A, step_map: A, tokens: A, rank: A, logprob: A, entropy: A, margin: A, path_lp: A,
         parent_prob: A, parent: A, parent_rows: A, push_at: int, type_table: A, type_codes: A, scalars: A) -> None:
    """Row i of ``x`` <- candidate i (the domain column is already there); the level's margins and entropies
    go to ``parent_rows`` from ``push_at`` as the next level's parents (row 0: NaN, a root child's parent)."""
    depth = scalars[DEPTH]
    for i in range(m):
        r = x[i]
        for s in range(step_map.shape[0]):  # (column, raw index, logged as float32)
            v = scalars[RAW0 + step_map[s, 1]]
            r[step_map[s, 0]] = np.float64(np.float32(v)) if step_map[s, 2] else v
        p = parent[i] + 1
        f = np.float64  # one element type: numba iterates a homogeneous tuple
        for c, v in ((cols[0], f(rank[i])), (cols[1], f(logprob[i])), (cols[2], f(entropy[i])), (cols[3], f(margin[i])),
                     (cols[4], f(path_lp[i])), (cols[5], f(parent_prob[i])), (cols[6], f(tokens[i])),
                     (cols[8], f(parent_rows[p, 0])), (cols[9], f(parent_rows[p, 1])), (cols[10], f(depth)),
                     (cols[11], f(scalars[POS0] + depth))):
            if c >= 0:
                r[c] = v
        if cols[7] >= 0:  # a one-entry table: the frontier came without one, every token reads as "special"
            r[cols[7]] = type_codes[type_table[tokens[i]] if type_table.shape[0] > 1 else type_table[0]]
        parent_rows[push_at + i, 0] = margin[i]
        parent_rows[push_at + i, 1] = entropy[i]


def calibrate(raw: A, at: int, m: int, iso_x: A, iso_y: A, parent: A, value: A, scalars: A) -> None:
    """The predictions through the isotonic map (``np.interp``'s arithmetic, written back to ``raw``) and the
    request's correction, then path values: times the parent's value below depth 1. Sets ``scalars[BEST]``."""
    k = iso_x.shape[0]
    best = 0.0
    for i in range(m):
        p = raw[at + i]
        if k > 0:
            if p >= iso_x[k - 1]:
                p = iso_y[k - 1]
            elif p <= iso_x[0]:
                p = iso_y[0]
            else:
                j = np.searchsorted(iso_x, p, side="right") - 1
                if iso_x[j] == p:
                    p = iso_y[j]
                else:
                    p = (iso_y[j + 1] - iso_y[j]) / (iso_x[j + 1] - iso_x[j]) * (p - iso_x[j]) + iso_y[j]
            raw[at + i] = p
        if scalars[CAL_ON] > 0.0:
            q = min(max(p, _CLIP), 1.0 - _CLIP)
            p = 1.0 / (1.0 + scalars[CAL_SCALE] * ((1.0 - q) / q) ** scalars[CAL_SLOPE])
        if i == 0 or p > best:
            best = p
        value[at + i] = p if scalars[DEPTH] == 1.0 else value[parent[i]] * p
    scalars[BEST] = best


def keep_best(value: A, at: int, m: int, keep: A, children: A, rules: A, target: A, scalars: A) -> int:
    """Best value first while it clears the threshold, the node budget and its verify cost (expected tokens at
    the step's rate: gain / time); updates the step's gain and node count, returns the kept count."""
    v = value[at:at + m]
    order = np.empty(m, dtype=np.int64)  # best first, ties by index: an insertion sort of a dozen values
    for i in range(m):
        j = i
        while j > 0 and v[order[j - 1]] < v[i]:
            order[j] = order[j - 1]
            j -= 1
        order[j] = i
    keep[at:at + m] = False
    children[at:at + m] = 0
    gain, nodes, draft_ms = scalars[GAIN], scalars[NODES], scalars[DRAFT_MS]
    kept = 0
    for i in order:
        n = int(nodes)
        if nodes >= rules[NODE_BUDGET] or v[i] < rules[THRESHOLD]:
            break
        if rules[TIMED] > 0.0 and v[i] < rules[COST_SCALE] * (target[n + 2] - target[n + 1]) * gain / (
                draft_ms + target[n + 1]):
            break
        keep[at + i] = True
        gain += v[i]
        nodes += 1.0
        kept += 1
    scalars[GAIN], scalars[NODES] = gain, nodes
    return kept


def expand(value: A, at: int, m: int, keep: A, children: A, rules: A, target: A, draft: A, scalars: A) -> None:
    """Children under kept nodes whose best child may clear the threshold, when the level's expected gain pays
    for one more draft forward; updates the step's draft time."""
    if scalars[DEPTH] >= rules[MAX_DEPTH] or scalars[NODES] >= rules[NODE_BUDGET]:
        return
    want, total = 0, 0.0
    for i in range(m):
        g = value[at + i] * scalars[EST]
        if keep[at + i] and g >= rules[THRESHOLD]:
            want += 1
            total += g
    if want == 0:
        return
    timed = rules[TIMED] > 0.0
    level_ms = draft[want] if timed else 0.0
    step_ms = scalars[DRAFT_MS] + target[int(scalars[NODES]) + 1] if timed else 1.0
    if total < (rules[COST_SCALE] * level_ms * scalars[GAIN] / step_ms if timed else 0.0):
        return
    scalars[DRAFT_MS] += level_ms
    for i in range(m):
        if keep[at + i] and value[at + i] * scalars[EST] >= rules[THRESHOLD]:
            children[at + i] = int(rules[MAX_WIDTH])


def tried_rows(raw: A, keep: A, parent: A, count: int, verified: int, path: A, p: A, y: A) -> int:
    """A step's tried nodes (kept, their parent accepted) among its first ``count`` candidates, in candidate
    order: the prediction to ``p``, 1.0 / 0.0 (on the accepted ``path`` of tree indices or not) to ``y``.
    Returns how many, or -1 when the kept candidates are not the ``verified`` tree (the decoder cut it)."""
    tree = np.full(count, -1, dtype=np.int64)  # candidate index -> tree index (kept ones 1, 2, ... in order)
    kept = n = 0
    for c in range(count):
        if not keep[c]:
            continue
        kept += 1
        tree[c] = kept
        up = 0 if parent[c] < 0 else tree[parent[c]]  # the root (0) is accepted; an unkept parent is -1
        parent_on = up == 0
        on = False
        for t in path:
            parent_on = parent_on or t == up
            on = on or t == kept
        if parent_on:
            p[n], y[n] = raw[c], 1.0 if on else 0.0
            n += 1
    return n if kept == verified else -1


def make_observe(tried: Callable, update: Callable) -> Callable:
    def observe(raw: A, keep: A, parent: A, cal: A, count: int, verified: int, path: A) -> int:
        """The step's tried rows into ``newton`` from the posterior in ``cal[:5]`` (iterations and slope floor in
        ``cal[5:7]``), written back to ``cal[:5]``; returns the rows taken in (-1: a cut, nothing learned)."""
        p, y = np.empty(count), np.empty(count)
        n = tried(raw, keep, parent, count, verified, path, p, y)
        if n > 0:
            cal[0], cal[1], cal[2], cal[3], cal[4] = update(p[:n], y[:n], np.ones(n), cal[0], cal[1], cal[2], cal[3],
                                                            cal[4], int(cal[5]), cal[6])
        return n

    return observe


def make_level(fill: Callable, forest: Callable, calibrate: Callable, keep_best: Callable,
               expand: Callable) -> Callable:
    """The level from its parts: compiled parts give a function numba compiles, plain ones a Python function."""

    def level(x: A, parent_rows: A, value: A, raw: A, children: A, parents: A, keep: A, scalars: A, cols: A,
              step_map: A, type_codes: A, rules: A, iso_x: A, iso_y: A, target: A, draft: A, nodes: A, splits: A,
              bits: A, roots: A, sigmoid: float, m: int, at: int, depth: int, est: float, type_table: A, tokens: A,
              rank: A, logprob: A, entropy: A, margin: A, path_lp: A, parent_prob: A, parent: A) -> float:
        scalars[DEPTH], scalars[EST] = depth, est
        fill(x, m, cols, step_map, tokens, rank, logprob, entropy, margin, path_lp, parent_prob, parent, parent_rows,
             at + 1, type_table, type_codes, scalars)  # this level: rows at + 1... as the next level's parents
        forest(x, m, raw[at:], nodes, splits, bits, roots, sigmoid)
        calibrate(raw, at, m, iso_x, iso_y, parent, value, scalars)
        if keep_best(value, at, m, keep, children, rules, target, scalars) > 0:
            expand(value, at, m, keep, children, rules, target, draft, scalars)
        for i in range(m):  # the step's values by candidate index hold 0 where pruned
            parents[at + i] = parent[i]
            if not keep[at + i]:
                value[at + i] = 0.0
        return scalars[BEST]

    return level


@dataclass(frozen=True)
class Kernels:
    level: Callable
    observe: Callable
    native: bool


@functools.cache
def kernels() -> Kernels | None:
    """The level and the step's update compiled by numba (machine code cached on disk), or None without it."""
    from treewise.predictor.forest import compiled_predict

    forest = compiled_predict()
    if forest is None:
        return None
    import numba

    jit = numba.njit(cache=True, nogil=True)  # the parts are native calls from the level, inlined by LLVM
    return Kernels(jit(make_level(jit(fill), forest, jit(calibrate), jit(keep_best), jit(expand))),
                   jit(make_observe(jit(tried_rows), jit(newton))), True)


def python_kernels(score: Callable[[A, int], A]) -> Kernels:
    """The same level as plain Python, the forest replaced by ``score(x, m)`` (the predictor's entry point)."""

    def forest(x: A, m: int, out: A, *_: Any) -> None:
        out[:m] = score(x, m)

    return Kernels(make_level(fill, forest, calibrate, keep_best, expand), make_observe(tried_rows, newton), False)


@dataclass(eq=False)
class LevelState:
    """One request's arrays for the level (see the module docstring); ``args`` are the level's first arguments."""

    x: A  # [cap, width] the level's feature rows
    parent_rows: A  # [cap + 1, 2] row c + 1: candidate c's margin and entropy
    value: A  # [cap] the step's path values (0 where pruned)
    raw: A  # [cap] the predictor's (isotonic) outputs
    children: A  # [cap] int64
    parent: A  # [cap] int64 the parent's candidate index, -1 for the root
    keep: A  # [cap] bool
    scalars: A  # see GAIN... RAW0
    cols: A
    step_map: A
    type_codes: A
    rules: A
    iso_x: A
    iso_y: A
    target: A  # target ms by verified nodes
    draft: A  # draft ms by fed nodes
    nodes: A  # the forest's arrays (predictor.forest), empty when the forest runs in Python
    splits: A
    bits: A
    roots: A
    sigmoid: float
    cal: A  # observe's posterior (5) and settings (iterations, slope floor)

    @classmethod
    def build(cls, layout: FeatureLayout, budget: DomainBudget, target: list[float], draft: list[float],
              forest: ForestTables | None, isotonic: tuple[A, A], cap: int = 64) -> LevelState:
        f8 = np.float64
        rules = np.asarray([budget.threshold, budget.cost_scale, budget.node_budget, budget.max_width,
                            budget.max_depth, 1.0 if target else 0.0], dtype=f8)
        nodes, splits, bits, roots, sigmoid = forest if forest is not None else (
            np.zeros((0, 6), dtype=np.int64), np.zeros((0, 2)), np.zeros(1, dtype=np.uint32),
            np.zeros(0, dtype=np.int64), 0.0)
        x = np.empty((cap, len(layout.names)), dtype=f8)
        x[:] = layout.template
        parent_rows = np.zeros((cap + 1, 2), dtype=f8)
        parent_rows[0] = np.nan  # a root child's parent row: missing, as the node log has it
        return cls(x, parent_rows, np.zeros(cap), np.zeros(cap), np.zeros(cap, dtype=np.int64),
                   np.zeros(cap, dtype=np.int64), np.zeros(cap, dtype=np.bool_),
                   np.zeros(RAW0 + len(STEP_SCALARS)), layout.cols, layout.step_map, layout.type_codes, rules,
                   np.asarray(isotonic[0], dtype=f8), np.asarray(isotonic[1], dtype=f8),
                   np.asarray(target or [0.0], dtype=f8), np.asarray(draft or [0.0], dtype=f8), nodes, splits, bits,
                   roots, float(sigmoid), np.zeros(7))

    @property
    def capacity(self) -> int:
        return self.keep.shape[0]

    def args(self) -> tuple:
        """The level's arguments up to ``sigmoid``, in field order."""
        return tuple(getattr(self, f.name) for f in fields(self)[:-1])

    def grow(self, count: int, cap: int) -> None:
        """Room for ``cap`` candidates a step, keeping the step's first ``count`` entries (later levels read
        their parents' rows, observe reads the whole step)."""
        x = np.empty((cap, self.x.shape[1]), dtype=np.float64)
        x[:] = self.x[0]
        rows = np.zeros((cap + 1, 2))
        rows[:count + 1] = self.parent_rows[:count + 1]
        self.x, self.parent_rows = x, rows
        for name in ("value", "raw", "children", "parent", "keep"):
            old = getattr(self, name)
            new = np.zeros(cap, dtype=old.dtype)
            new[:count] = old[:count]
            setattr(self, name, new)

    def begin_step(self, gain: float, nodes: int, draft_ms: float, position: int,
                   correction: tuple[bool, float, float] | None, step_scalars: tuple[float, ...]) -> None:
        """A step's running state, its shared feature values and the correction (active, offset, slope)."""
        on, offset, slope = correction if correction is not None else (False, 0.0, 1.0)
        # POS0: the position feature at depth 0 (position + depth - 1), an integer exact in float64 as logged
        self.scalars[:] = (gain, nodes, draft_ms, 0.0, 0.0, 0.0, position - 1, 1.0 if on else 0.0,
                           math.exp(-offset), slope, *step_scalars)


DEFAULT_TYPES = np.full(1, SPECIAL, dtype=np.int8)  # a frontier without a token-type table reads "special"
