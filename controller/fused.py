"""LearnedTree's work on one level in one native call: features, compiled forest, calibration, keep and expand.

In Python the level costs ~130 us on this CPU (docs/performance.md): a dozen numpy calls for the features,
the forest, the isotonic map, the path values and the keep/expand rules, each starting cold after a draft
forward. Here numba compiles those steps into one function that writes the features into a matrix of the
request's arena, calls the lleaves-compiled forest through its address, and applies the same rules as
``LearnedTree._keep`` and ``_expand``: one dispatch a level. After the step, a second function labels its
tried nodes and updates the request's correction (``observer``): one more dispatch a step. numba caches the
machine code on disk (``cache=True``), so only a machine's first run compiles it (a few seconds).

It is an accelerator, not a second policy: ``LearnedTree`` takes it only when numba imports, the predictor
has a compiled forest with an entry point and its features can be filled by ``FeatureRows``; otherwise it
runs the Python path. ``tests/controller/test_fused.py`` holds the two to the same plans, values and
predictions on real decodes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from treewise.decoder import Frontier
from treewise.predictor.derived import RequestFeatures
from treewise.predictor.online import OnlineCalibrator, newton

from .budgets import DomainBudget
from .features import SPECIAL, STEP_SCALARS, FeatureRows, raw_step_scalars

# The per-level sources the kernel writes, in the order of ``FusedLevel.cols`` (-1: the model does not read it).
SOURCES = ("sibling_rank", "draft_logprob", "draft_entropy", "draft_margin", "path_logprob", "parent_draft_prob",
           "token_id", "token_type", "parent_margin", "parent_entropy", "depth", "position")
# The request's memory is one byte arena (``FusedLevel.mem``) that both sides read through the same views
# (``views``): the kernel takes it and the level's fresh columns (14 arguments, not 22) and writes no other
# object's buffers. In decodes a level's call took 37-46 us against 39-50 before (four back-to-back pairs): the
# rest of a cold call is numba's dispatch (a no-op costs ~13 us right after a forward, with 4 or 14 arguments
# alike) and the forest's code (cut to 30 trees, ~7-12 us less). Header: the byte offset of each section in
# _SECTIONS order and of the end, the step's capacity (candidates) and the feature matrix's width.
_SECTIONS = ("ints", "floats", "state", "cal", "x", "parent_rows", "value", "raw", "children", "parent", "keep")
_S_CAL, _S_RAW, _S_PARENT, _S_KEEP = (_SECTIONS.index(n) for n in ("cal", "raw", "parent", "keep"))  # for observe
_H_CAP, _H_WIDTH = len(_SECTIONS) + 1, len(_SECTIONS) + 2
_HEAD = _H_WIDTH + 1
# ints[]: the forest's address, the step map's row count, the cols table, the step map; floats[]: the counts of
# what follows, the budget's rules (the _THRESHOLD... indices), the token types' codes, the isotonic map, and the
# target and draft ms by node count.
_I_FOREST, _I_STEP, _I_COLS = range(3)
_F_TYPES, _F_ISO, _F_TARGET, _F_DRAFT, _F_RULES = range(5)
_THRESHOLD, _COST_SCALE, _NODE_BUDGET, _MAX_WIDTH, _MAX_DEPTH, _TIMED = range(6)
# state[]: the step's running state (read and written by the kernel; BEST written only), this level's depth
# and estimate, the step's first position and the request's correction (on, e^-offset, slope).
# RAW0...: the step's shared scalars untyped, in features.STEP_SCALARS order.
GAIN, NODES, DRAFT_MS, BEST, EST, DEPTH, POS0, CAL_ON, CAL_SCALE, CAL_SLOPE, RAW0 = range(11)
_STATE = RAW0 + len(STEP_SCALARS)
_CAL = 7  # observe's posterior (5) and settings (iterations, slope floor)
_CLIP = 1e-4  # as predictor.online


@functools.cache
def kernel() -> Any | None:
    """The compiled level function, or None when numba is missing (LearnedTree then runs in Python)."""
    try:
        import numba
        from llvmlite import ir
        from numba.extending import intrinsic
    except ImportError:
        return None

    @intrinsic
    def call_forest(typingctx: Any, fn: Any, rows: Any, out: Any, n: Any) -> Any:
        """lleaves' ``forest_root(double *rows, double *out, int start, int end)`` called at address ``fn``."""
        sig = numba.types.void(numba.types.intp, numba.types.intp, numba.types.intp, numba.types.int32)

        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            dbl, i32 = ir.DoubleType().as_pointer(), ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [dbl, dbl, i32, i32])
            target = builder.inttoptr(args[0], fnty.as_pointer())
            builder.call(target, [builder.inttoptr(args[1], dbl), builder.inttoptr(args[2], dbl),
                                  ir.Constant(i32, 0), args[3]])
            return context.get_dummy_value()

        return sig, codegen

    jit = numba.njit(cache=True, nogil=True)  # the parts are native calls from the level, inlined by LLVM
    return jit(_level_source(call_forest, jit(views), jit(_unpack), jit(_fill), jit(_calibrate), jit(_keep),
                             jit(_expand)))


A = np.ndarray  # every array argument of the kernel's parts (numba types them from the call)


@functools.cache
def observer() -> Any | None:
    """The compiled step update of the request's correction (``FusedLevel.observe``), or None without numba."""
    try:
        import numba
    except ImportError:
        return None
    jit = numba.njit(cache=True, nogil=True)
    arena, tried, update = jit(views), jit(tried_rows), jit(newton)

    def observe(mem: A, count: int, verified: int, path: A) -> int:
        """The step's tried rows into ``newton`` from the posterior in ``cal[:5]`` (iterations, slope floor in
        ``cal[5:7]``), written back to ``cal[:5]``; returns the rows taken in (-1: a cut, nothing learned)."""
        sections = arena(mem)
        cal, raw, parent, keep = sections[_S_CAL], sections[_S_RAW], sections[_S_PARENT], sections[_S_KEEP]
        p, y = np.empty(count), np.empty(count)
        n = tried(raw, keep, parent, count, verified, path, p, y)
        if n > 0:
            cal[0], cal[1], cal[2], cal[3], cal[4] = update(p[:n], y[:n], np.ones(n), cal[0], cal[1], cal[2], cal[3],
                                                            cal[4], int(cal[5]), cal[6])
        return n

    return jit(observe)


def views(mem: A) -> tuple[A, A, A, A, A, A, A, A, A, A, A]:
    """The arena's sections as typed arrays, in _SECTIONS order (numba compiles it for the kernel; Python takes
    the same views for its side): ints, floats, state, cal, x [cap, width], parent_rows [cap + 1, 2], then the
    step buffers by candidate index: value, raw, children, parent, keep."""
    h = mem[:8 * _HEAD].view(np.int64)
    f8, i8 = np.float64, np.int64
    return (mem[h[0]:h[1]].view(i8), mem[h[1]:h[2]].view(f8), mem[h[2]:h[3]].view(f8), mem[h[3]:h[4]].view(f8),
            mem[h[4]:h[5]].view(f8).reshape(-1, h[_H_WIDTH]), mem[h[5]:h[6]].view(f8).reshape(-1, 2),
            mem[h[6]:h[7]].view(f8), mem[h[7]:h[8]].view(f8), mem[h[8]:h[9]].view(i8), mem[h[9]:h[10]].view(i8),
            mem[h[10]:h[10] + h[_H_CAP]].view(np.bool_))


def _named(mem: A) -> dict[str, A]:
    """The arena's sections by their ``_SECTIONS`` name (the Python side's one way to read ``views``)."""
    return dict(zip(_SECTIONS, views(mem), strict=True))


def _arena(ints: A, floats: A, cap: int, width: int) -> A:
    """A zeroed arena for ``cap`` candidates a step and a feature matrix ``width`` wide, constants written."""
    sizes = [len(ints), len(floats), _STATE, _CAL, cap * width, 2 * (cap + 1), cap, cap, cap, cap, (cap + 7) // 8]
    offsets = np.cumsum([8 * _HEAD, *(8 * n for n in sizes)])  # every section 8-byte aligned
    mem = np.zeros(int(offsets[-1]), dtype=np.uint8)
    mem[:8 * _HEAD].view(np.int64)[:] = [*offsets, cap, width]
    sections = _named(mem)
    sections["ints"][:], sections["floats"][:] = ints, floats
    sections["parent_rows"][0] = np.nan  # a root child's parent row: missing, as RequestFeatures has it
    return mem


def tried_rows(raw: A, keep: A, parent: A, count: int, verified: int, path: A, p: A, y: A) -> int:
    """A step's tried nodes (kept, their parent accepted) among its first ``count`` candidates, in candidate
    order: the global prediction to ``p``, 1.0 / 0.0 (on the accepted ``path`` of tree indices or not) to ``y``.
    Returns how many, or -1 when the kept candidates are not the ``verified`` tree (the decoder cut it).

    Scalar loops only: numba compiles it for ``observer``, and ``learned.tried_nodes`` runs it as it is."""
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


def _unpack(ints: A, floats: A) -> tuple[A, A, A, A, A, A, A, A]:
    """Views of the packed constants: cols, type codes, step map, rules, isotonic x and y, target and draft ms."""
    t = _I_COLS + len(SOURCES)
    n, k, nt, nd = int(floats[_F_TYPES]), int(floats[_F_ISO]), int(floats[_F_TARGET]), int(floats[_F_DRAFT])
    r = _F_RULES + 6
    i = r + n
    return (ints[_I_COLS:t], floats[r:i], ints[t:].reshape(int(ints[_I_STEP]), 3), floats[_F_RULES:r],
            floats[i:i + k], floats[i + k:i + 2 * k], floats[i + 2 * k:i + 2 * k + nt],
            floats[i + 2 * k + nt:i + 2 * k + nt + nd])


def _fill(x: A, m: int, cols: A, step_map: A, tokens: A, rank: A, logprob: A, entropy: A, margin: A, path_lp: A,
          parent_prob: A, parent: A, parent_rows: A, push_at: int, type_table: A, type_codes: A, state: A) -> None:
    """Row i of ``x`` <- candidate i (the domain column is already there); the level's margins and entropies
    go to ``parent_rows`` from ``push_at`` as the next level's parents."""
    depth = state[DEPTH]
    for i in range(m):
        r = x[i]
        for s in range(step_map.shape[0]):  # (column, raw index, logged as float32)
            v = state[RAW0 + step_map[s, 1]]
            r[step_map[s, 0]] = np.float64(np.float32(v)) if step_map[s, 2] else v
        p = parent[i] + 1
        f = np.float64  # one element type: numba iterates a homogeneous tuple
        for c, v in ((cols[0], f(rank[i])), (cols[1], f(logprob[i])), (cols[2], f(entropy[i])), (cols[3], f(margin[i])),
                     (cols[4], f(path_lp[i])), (cols[5], f(parent_prob[i])), (cols[6], f(tokens[i])),
                     (cols[8], f(parent_rows[p, 0])), (cols[9], f(parent_rows[p, 1])), (cols[10], f(depth)),
                     (cols[11], f(state[POS0] + depth))):
            if c >= 0:
                r[c] = v
        if cols[7] >= 0:  # a one-entry table: the frontier came without one, every token reads as "special"
            r[cols[7]] = type_codes[type_table[tokens[i]] if type_table.shape[0] > 1 else type_table[0]]
        parent_rows[push_at + i, 0] = margin[i]
        parent_rows[push_at + i, 1] = entropy[i]


def _calibrate(raw: A, at: int, m: int, iso_x: A, iso_y: A, parent: A, value: A, state: A) -> None:
    """The forest's outputs through the isotonic map (``np.interp``'s arithmetic, written back to ``raw``) and
    the request's correction, then path values: times the parent's value below depth 1. Sets ``state[BEST]``."""
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
        if state[CAL_ON] > 0.0:
            q = min(max(p, _CLIP), 1.0 - _CLIP)
            p = 1.0 / (1.0 + state[CAL_SCALE] * ((1.0 - q) / q) ** state[CAL_SLOPE])
        if i == 0 or p > best:
            best = p
        value[at + i] = p if state[DEPTH] == 1.0 else value[parent[i]] * p
    state[BEST] = best


def _keep(value: A, at: int, m: int, keep: A, children: A, rules: A, target: A, state: A) -> int:
    """``LearnedTree._keep``: best value first while it clears the threshold, the node budget and its verify
    cost; updates the step's gain and node count in ``state``, returns the kept count."""
    v = value[at:at + m]
    order = np.empty(m, dtype=np.int64)  # best first, ties by index (as Python's stable sorted): insertion
    for i in range(m):  # sort, a dozen values a level (no temporaries, unlike a mergesort argsort)
        j = i
        while j > 0 and v[order[j - 1]] < v[i]:
            order[j] = order[j - 1]
            j -= 1
        order[j] = i
    keep[at:at + m] = False
    children[at:at + m] = 0
    gain, nodes, draft_ms = state[GAIN], state[NODES], state[DRAFT_MS]
    kept = 0
    for i in order:
        n = int(nodes)
        if nodes >= rules[_NODE_BUDGET] or v[i] < rules[_THRESHOLD]:
            break
        if rules[_TIMED] > 0.0 and v[i] < rules[_COST_SCALE] * (target[n + 2] - target[n + 1]) * gain / (
                draft_ms + target[n + 1]):
            break
        keep[at + i] = True
        gain += v[i]
        nodes += 1.0
        kept += 1
    state[GAIN], state[NODES] = gain, nodes
    return kept


def _expand(value: A, at: int, m: int, keep: A, children: A, rules: A, target: A, draft: A, state: A) -> None:
    """``LearnedTree._expand``: children under kept nodes whose best child may clear the threshold, when the
    level's expected gain pays for one more draft forward; updates the step's draft time in ``state``."""
    if state[DEPTH] >= rules[_MAX_DEPTH] or state[NODES] >= rules[_NODE_BUDGET]:
        return
    want, total = 0, 0.0
    for i in range(m):
        g = value[at + i] * state[EST]
        if keep[at + i] and g >= rules[_THRESHOLD]:
            want += 1
            total += g
    if want == 0:
        return
    timed = rules[_TIMED] > 0.0
    level_ms = draft[want] if timed else 0.0
    step_ms = state[DRAFT_MS] + target[int(state[NODES]) + 1] if timed else 1.0
    if total < (rules[_COST_SCALE] * level_ms * state[GAIN] / step_ms if timed else 0.0):
        return
    state[DRAFT_MS] += level_ms
    for i in range(m):
        if keep[at + i] and value[at + i] * state[EST] >= rules[_THRESHOLD]:
            children[at + i] = int(rules[_MAX_WIDTH])


def _level_source(call_forest: Any, views: Any, unpack: Any, fill: Any, calibrate: Any, keep: Any,
                  expand: Any) -> Any:
    """The level as a Python function over numpy arrays, calling its compiled parts (numba compiles it)."""

    def level(mem: A, m: int, at: int, depth: int, est: float, type_table: A, tokens: A, rank: A, logprob: A,
              entropy: A, margin: A, path_lp: A, parent_prob: A, parent: A) -> float:
        ints, floats, state, _, x, parent_rows, value, raw, children, parents, kept = views(mem)
        state[DEPTH], state[EST] = depth, est
        cols, type_codes, step_map, rules, iso_x, iso_y, target, draft = unpack(ints, floats)
        fill(x, m, cols, step_map, tokens, rank, logprob, entropy, margin, path_lp, parent_prob, parent,
             parent_rows, at + 1, type_table, type_codes, state)  # this level: rows at + 1... as next's parents
        call_forest(ints[_I_FOREST], x.ctypes.data, raw[at:].ctypes.data, np.int32(m))
        calibrate(raw, at, m, iso_x, iso_y, parent, value, state)
        if keep(value, at, m, kept, children, rules, target, state) > 0:
            expand(value, at, m, kept, children, rules, target, draft, state)
        for i in range(m):  # the step's values by candidate index hold 0 where pruned
            parents[at + i] = parent[i]
            if not kept[at + i]:
                value[at + i] = 0.0
        return state[BEST]

    return level


@dataclass
class FusedLevel:
    """Per request: the arena the kernel reads and writes (``mem``, see ``views``); ``step`` at each step's root,
    ``run`` per level, ``observe`` after the step.

    The step buffers (value, raw, children, parent, keep) are indexed by the candidate's index in the step, like
    ``LearnedTree``'s path values, so each level's answer is a view that later levels do not overwrite; a step
    that outgrows them moves to a larger arena, and earlier answers keep the old one."""

    mem: np.ndarray  # uint8: header, constants, state, feature matrix and step buffers (``views``)
    level: Any  # the compiled kernel (``kernel()``)
    observer: Any  # the compiled correction update (``observer()``)
    type_table: np.ndarray = field(default_factory=lambda: np.full(1, SPECIAL, dtype=np.int8))  # a frontier
    # without a token-type table reads "special"
    ints: np.ndarray = field(init=False, repr=False)  # int64: the forest's address and the column tables
    floats: np.ndarray = field(init=False, repr=False)  # float64: rules, isotonic map, latency profile
    state: np.ndarray = field(init=False, repr=False)  # see GAIN... RAW0
    cal: np.ndarray = field(init=False, repr=False)  # observe's posterior and settings
    x: np.ndarray = field(init=False, repr=False)  # [cap, width] the level's feature rows, the forest's input
    parent_rows: np.ndarray = field(init=False, repr=False)  # [cap + 1, 2] row c + 1: candidate c's margin, entropy
    value: np.ndarray = field(init=False, repr=False)  # the step's path values (0 where pruned)
    raw: np.ndarray = field(init=False, repr=False)  # the predictor's (isotonic) outputs
    children: np.ndarray = field(init=False, repr=False)
    parent: np.ndarray = field(init=False, repr=False)  # parent's candidate index, -1 for the root
    keep: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._adopt(self.mem)

    @classmethod
    def build(cls, rows: FeatureRows, predictor: object, target: list[float], draft: list[float],
              budget: DomainBudget) -> FusedLevel | None:
        """The fused level for this request, or None when numba, an entry point or the isotonic map is missing."""
        forest = getattr(predictor, "forest", None)
        address = getattr(forest, "entry_address", None)
        calibrator = getattr(predictor, "calibrator", None)
        level, update = kernel(), observer()
        missing = level is None or update is None or (calibrator is not None and not hasattr(calibrator, "x"))
        if address is None or missing:
            return None
        iso_x, iso_y = ([], []) if calibrator is None else (calibrator.x, calibrator.y)
        codes, step_map = rows.type_codes(), np.asarray(rows.step_map(), dtype=np.int64).reshape(-1, 3)
        ints = np.concatenate([[address, len(step_map)], rows.source_columns(SOURCES), step_map.ravel()])
        rules = [budget.threshold, budget.cost_scale, budget.node_budget, budget.max_width, budget.max_depth,
                 1.0 if target else 0.0]
        floats = np.concatenate([[len(codes), len(iso_x), len(target), len(draft)], rules, codes, iso_x, iso_y,
                                 target, draft])
        template = rows.matrix[0]  # the domain column, which the kernel never writes
        fused = cls(_arena(ints.astype(np.int64), floats.astype(np.float64), 64, template.shape[0]), level, update)
        fused.x[:] = template
        return fused

    def _adopt(self, mem: np.ndarray) -> None:
        self.mem = mem
        for name, section in _named(mem).items():  # the attributes are named as the sections
            setattr(self, name, section)

    def step(self, root: Frontier, context: RequestFeatures, gain: float, nodes: int, draft_ms: float,
             correction: tuple[bool, float, float] | None) -> None:
        """Start a step: its shared feature values, LearnedTree's running state and the correction
        (active, offset, slope; None: no correction)."""
        on, offset, slope = correction if correction is not None else (False, 0.0, 1.0)
        # POS0: the position feature at depth 0 (position + depth - 1), an integer exact in float64 as logged
        self.state[:] = (gain, nodes, draft_ms, 0.0, 0.0, 0.0, root.position - 1, 1.0 if on else 0.0,
                         math.exp(-offset), slope, *raw_step_scalars(root, context))

    def run(self, frontier: Frontier, cols: Mapping[str, np.ndarray], at: int, est: float) -> float:
        """Value, keep and expand one level: ``cols`` are ``frontier.arrays()``, written at candidate ``at`` of
        the step buffers; returns the level's best (corrected) prediction, 0 for an empty level."""
        m = len(cols["parent"])
        if at + m > self.keep.shape[0]:
            self._grow(at, 2 * (at + m))
        table = frontier.token_type_table
        return self.level(self.mem, m, at, frontier.depth, est, self.type_table if table is None else table,
                          cols["tokens"], cols["sibling_rank"], cols["draft_logprob"], cols["draft_entropy"],
                          cols["draft_margin"], cols["path_logprob"], cols["parent_draft_prob"], cols["parent"])

    def _grow(self, count: int, cap: int) -> None:
        """A new arena for ``cap`` candidates: the constants, the state and the step's first ``count`` entries
        (later levels read their parents' rows, observe reads the whole step)."""
        old = _named(self.mem)
        self._adopt(_arena(self.ints, self.floats, cap, self.x.shape[1]))
        self.state[:], self.cal[:], self.x[:] = old["state"], old["cal"], old["x"][0]
        self.parent_rows[:count + 1] = old["parent_rows"][:count + 1]
        for name in ("value", "raw", "children", "parent", "keep"):
            getattr(self, name)[:count] = old[name][:count]

    def observe(self, count: int, verified: int, path: tuple[int, ...], calibrator: OnlineCalibrator) -> None:
        """Update ``calibrator`` with the step's first ``count`` candidates as ``LearnedTree`` labels them (tried
        nodes by the accepted ``path``), in one native call; nothing when the decoder cut the tree."""
        config = calibrator.config
        self.cal[:] = (*calibrator.posterior, config.iterations, config.slope_floor)
        n = self.observer(self.mem, count, verified, np.asarray(path, dtype=np.int64))
        if n > 0:
            calibrator.absorb(self.cal[:5].tolist(), n)
