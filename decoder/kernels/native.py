"""A draft level's work in native calls: its children (top-k, margin, entropy and the candidate columns), then,
once the policy has planned, its bookkeeping (what is kept, what is fed next and what each fed node sees); and,
once a step, the step's tree from its candidates.

In numpy the children of a level are slow right after a draft forward (docs/performance.md, "A draft level"):
``torch.topk``, a pass of logarithms over [e, V] for the entropies, then a dozen small array ops for the
columns, each starting cold. Here numba compiles them into one function: a top-k scan that skips 32-token
chunks whose maximum cannot enter the top k (draft distributions are peaked: most chunks are skipped), the
entropy from one dot product per row instead of V logarithms, and the columns written into two blocks.

Entropy without logarithms: with p = softmax(s) and the row's top token t (p_t the largest probability,
s_t the largest score), log p_i = s_i - s_t + log p_t, so H = -sum p_i log p_i = (s_t - log p_t) sum p_i - sum p_i s_i.
A row with a -inf score (a top-k or top-p cut, a padded vocabulary) makes the dot NaN; that row takes the
direct sum over its nonzero probabilities instead.

``children`` is an accelerator, not a second rule: ``decoder.draft`` takes it for top-k drafting on the CPU when
numba imports, and ``tests/decoder/test_native.py`` holds it to the numpy path's columns. ``expand`` and
``tree_arrays`` have one source each: numba compiles it, or it runs as plain Python where numba is missing.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

_CHUNK = 32  # tokens per block of the top-k scan: a block is read only if its maximum beats the k-th best
# The kernel's two output blocks, row by row: each name's [m] column is one row of its block.
INT_COLUMNS = ("tokens", "parent", "row", "sibling_rank")
FLOAT_COLUMNS = ("draft_logprob", "draft_entropy", "draft_margin", "path_logprob", "parent_draft_prob")


def _compiled(fn: Any) -> Any:
    """``fn`` compiled by numba when it imports, else ``fn`` as written (the same source either way)."""
    try:
        import numba
    except ImportError:
        return fn
    return numba.njit(cache=True, nogil=True)(fn)


class LevelBook(NamedTuple):
    """What ``expand`` returns for one level, by name: [m] columns over its candidates, then [e] over the e it
    expands (kept, children > 0), then three counts."""

    keep: np.ndarray  # [m] bool
    depth: np.ndarray  # [m] int64
    fed_slot: np.ndarray  # [m] int64, -1: not fed
    rows: np.ndarray  # [e] each expanded candidate's row in the level
    counts: np.ndarray  # [e] its children to draft
    tokens: np.ndarray  # [e] its token (fed to the draft)
    visibility: np.ndarray  # [e, f + e] bool: the fed slots each sees, itself included
    candidates: np.ndarray  # [e] its index among the step's candidates
    slots: np.ndarray  # [e] its fed slot
    path_logprob: np.ndarray  # [e] float32
    prob: np.ndarray  # [e] float32, its own draft probability
    kept: int
    widest: int  # the largest children count
    uniform: bool  # every count equals ``widest``


class TreeArrays(NamedTuple):
    """What ``tree_arrays`` returns: each candidate's tree index [m] (-1: out), then [n] over the tree's nodes."""

    index: np.ndarray
    parents: np.ndarray  # -1 for the root
    tokens: np.ndarray
    depth: np.ndarray
    ancestors: np.ndarray  # [n, n] bool: a node and its ancestors
    fed_slot: np.ndarray  # the draft-cache slot each node was fed at, -1: not fed


@functools.cache
def expander() -> Callable[..., LevelBook]:
    """``expand`` (compiled where numba imports: one call instead of ~25 numpy ones a level), its result named."""
    raw = _compiled(expand)
    return lambda *args: LevelBook(*raw(*args))


def expand(keep_in: np.ndarray, children_in: np.ndarray, level_row: np.ndarray, tokens: np.ndarray,
           logprob: np.ndarray, path_lp: np.ndarray, parent_slot: np.ndarray, fed_anc: np.ndarray, f: int,
           depth: int, start: int) -> tuple:
    """One level's bookkeeping after the policy's plan ``keep_in`` / ``children_in`` [m] over its candidates.

    ``level_row`` [m]: each candidate's parent row among the expanded nodes, whose draft-cache slots are
    ``parent_slot``; ``fed_anc`` [cap, cap] bool: ancestry among the step's ``f`` fed slots so far (cap >= f + m),
    into which the rows of this level's fed nodes are written. Returns, in order: keep [m] bool, the depth
    column [m], the fed slot column [m] (-1: not fed), then for the e expanded candidates (kept, children > 0)
    their rows [e], children counts [e], tokens [e] and visibility [e, f + e] (the fed slots each sees, itself
    included), their candidate indices in the step [e] (``start`` + row), fed slots [e], path log probabilities
    [e] and own draft probabilities [e] (exp of ``logprob``), then the kept count, the largest count and
    whether every count equals it.
    """
    m = keep_in.shape[0]
    keep = np.empty(m, np.bool_)
    depth_col = np.full(m, depth, np.int64)
    fed = np.full(m, -1, np.int64)
    kept = e = 0
    for i in range(m):
        keep[i] = keep_in[i] != 0
        if keep[i]:
            kept += 1
            if children_in[i] > 0:
                e += 1
    rows, counts, feed = np.empty(e, np.int64), np.empty(e, np.int64), np.empty(e, np.int64)
    cand, slots = np.empty(e, np.int64), np.empty(e, np.int64)
    lp, prob = np.empty(e, np.float32), np.empty(e, np.float32)
    anc = np.zeros((e, f + e), np.bool_)
    j, kmax, kmin = 0, 0, 1 << 30
    for i in range(m):
        c = int(children_in[i])
        if keep[i] and c > 0:
            rows[j], counts[j], feed[j] = i, c, tokens[i]
            cand[j], slots[j], lp[j], prob[j] = start + i, f + j, path_lp[i], np.exp(logprob[i])
            kmax, kmin = max(kmax, c), min(kmin, c)
            ps = parent_slot[level_row[i]]
            if ps >= 0:
                anc[j, :f] = fed_anc[ps, :f]  # the parent's ancestry (its own slot included)
            anc[j, f + j] = True
            fed[i] = f + j
            j += 1
    fed_anc[f:f + e, :f + e] = anc
    return keep, depth_col, fed, rows, counts, feed, anc, cand, slots, lp, prob, kept, kmax, kmin == kmax


def tree_arrays(keep: np.ndarray, parent: np.ndarray, tokens: np.ndarray, fed: np.ndarray,
                root: int) -> tuple:
    """The step's tree from its candidates (parents before children) and the selection ``keep`` [m].

    A selected candidate whose parent is not in the tree leaves it too, so the tree stays connected. Returns
    each candidate's tree index [m] (1, 2, ... in candidate order; -1 if out) and, for the n tree nodes (the
    root first, token ``root``): parents [n] (-1 for the root), tokens [n], depths [n], ancestor mask [n, n]
    (a node and its ancestors) and the draft-cache slots [n] the nodes were fed at (-1: not fed).
    """
    m = keep.shape[0]
    index = np.full(m, -1, np.int64)
    n = 1
    for i in range(m):
        p = parent[i]
        if keep[i] and (p < 0 or index[p] > 0):
            index[i] = n
            n += 1
    parents, toks, depth = np.empty(n, np.int64), np.empty(n, np.int64), np.zeros(n, np.int64)
    slots, anc = np.empty(n, np.int64), np.zeros((n, n), np.bool_)
    parents[0], toks[0], slots[0], anc[0, 0] = -1, root, -1, True
    for i in range(m):
        t = index[i]
        if t > 0:
            pt = index[parent[i]] if parent[i] >= 0 else 0
            parents[t], toks[t], slots[t], depth[t] = pt, tokens[i], fed[i], depth[pt] + 1
            anc[t, :t] = anc[pt, :t]  # the parent's ancestors and the parent
            anc[t, t] = True
    return index, parents, toks, depth, anc, slots


@functools.cache
def tree_builder() -> Callable[..., TreeArrays]:
    """``tree_arrays``, compiled where numba imports, its result named."""
    raw = _compiled(tree_arrays)
    return lambda *args: TreeArrays(*raw(*args))


@functools.cache
def kernel() -> Any | None:
    """The compiled children function, or None when numba is missing (the drafter then runs numpy)."""
    try:
        import numba
    except ImportError:
        return None
    fast = numba.njit(cache=True, nogil=True, fastmath=True)  # reassociation lets LLVM vectorise the reductions
    exact = numba.njit(cache=True, nogil=True)
    return exact(_source(fast(_dot), fast(_chunk_max), exact(_direct_entropy), exact))


def _dot(p: np.ndarray, s: np.ndarray) -> tuple[float, float]:
    """(sum p[j] * s[j], sum p[j]) in float64."""
    ps = total = 0.0
    for j in range(p.shape[0]):
        pj = np.float64(p[j])
        ps += pj * np.float64(s[j])
        total += pj
    return ps, total


def _chunk_max(row: np.ndarray, a: int, b: int) -> float:
    m = row[a]
    for j in range(a + 1, b):
        m = max(m, row[j])
    return m


def _direct_entropy(row: np.ndarray) -> float:
    """-sum p log p over the nonzero p, in float64 (rows with cut or padded tokens)."""
    acc = 0.0
    for j in range(row.shape[0]):
        p = np.float64(row[j])
        if p > 0:
            acc -= p * math.log(p)
    return acc


def _source(dot: Any, chunk_max: Any, direct_entropy: Any, jit: Any) -> Any:
    """The kernel over its compiled parts (numba inlines native calls between jitted functions)."""

    @jit
    def topk(row: np.ndarray, k: int, val: np.ndarray, idx: np.ndarray) -> None:
        """The k largest of ``row`` into val/idx, descending; among equal values the lower index first."""
        for i in range(k):
            val[i], idx[i] = -1.0, -1
        thr = np.float32(-1.0)  # the k-th best so far: probabilities are >= 0, so any token beats it at first
        n = row.shape[0]
        for a in range(0, n, _CHUNK):
            b = min(a + _CHUNK, n)
            if chunk_max(row, a, b) <= thr:
                continue
            for j in range(a, b):
                v = row[j]
                if v > thr:
                    i = k - 1
                    while i > 0 and val[i - 1] < v:
                        val[i], idx[i] = val[i - 1], idx[i - 1]
                        i -= 1
                    val[i], idx[i] = v, j
                    thr = val[k - 1]

    def children(probs: np.ndarray, scores: np.ndarray, counts: np.ndarray, cand_idx: np.ndarray,
                 path_lp: np.ndarray, prob: np.ndarray, k: int, entropy: bool) -> tuple[np.ndarray, np.ndarray]:
        """probs, scores [e, V] float32 (probs = softmax(scores)); counts [e] children per row (<= k); k >= 2
        (the margin reads the second best). Returns ints [4, m] (INT_COLUMNS) and floats [5, m] (FLOAT_COLUMNS),
        children row-major: row 0's in rank order, then row 1's."""
        e = probs.shape[0]
        m = 0
        for r in range(e):
            m += counts[r]
        ints = np.empty((4, m), np.int64)
        floats = np.empty((5, m), np.float32)
        val, idx = np.empty(k, np.float32), np.empty(k, np.int64)
        o = 0
        for r in range(e):
            row = probs[r]
            topk(row, k, val, idx)
            margin = val[0] - val[1]
            ent = np.float32(np.nan)
            if entropy:
                ps, total = dot(row, scores[r])  # float32 probabilities sum to 1 only within ~1e-6: keep the sum
                h = (np.float64(scores[r, idx[0]]) - math.log(max(np.float64(val[0]), 1e-30))) * total - ps
                ent = np.float32(h if math.isfinite(h) else direct_entropy(row))
            for c in range(counts[r]):
                lp = np.float32(math.log(max(val[c], np.float32(1e-30))))
                ints[0, o], ints[1, o], ints[2, o], ints[3, o] = idx[c], cand_idx[r], r, c
                floats[0, o], floats[1, o], floats[2, o] = lp, ent, margin
                floats[3, o], floats[4, o] = path_lp[r] + lp, prob[r]
                o += 1
        return ints, floats

    return children
