"""Drafting: grow the step's tree level by level, one draft forward per level over all expanded nodes."""

from __future__ import annotations

import functools
import time
from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel

from treewise.decoder.cache.arena import ArenaCache
from treewise.decoder.cache.kvcache import Feed, ModelOut, SoloCache
from treewise.decoder.kernels.native import FLOAT_COLUMNS, INT_COLUMNS, TreeArrays, expander, kernel, tree_builder

from .capability import FULL, AttentionLayout
from .policy import Candidates, Frontier, LevelPlan, TreePolicy
from .tree import DraftTree
from .verify import DraftMode, Sampling


@dataclass(frozen=True)
class DraftResult:
    tree: DraftTree
    candidates: Candidates
    draft_probs: Mapping[int, torch.Tensor]  # tree index -> draft distribution at that node (expanded only)
    fed_slot: torch.Tensor  # [n] draft-cache slot (after the committed prefix) of each tree node, -1 if unfed
    forward_s: float  # time in draft forwards, their masks included
    policy_s: float  # time in the policy's plan calls
    forwards: int
    model_s: float = 0.0  # the part of forward_s inside the stock model calls
    extra: int = 0  # nodes merged in from other sources (decoder.candidates.merge), appended after the draft's own

    @property
    def fixed_from(self) -> int:
        """Tree index of the first node another source proposed (deterministic candidates, decoder.candidates.merge)."""
        return self.tree.size - self.extra


class DraftProbs(Mapping[int, torch.Tensor]):
    """Tree index -> the draft distribution [V] at that node (expanded nodes only), built on first read: only
    the sampled acceptance rule reads it, and a tensor view per expanded node is a cold call after a forward
    (docs/performance.md).

    ``parts``: per draft forward, the candidate index of each row (-1 for the root) and its probabilities
    [e, V]; ``tree_index``: each candidate's tree index, -1 if it left the tree (None: the root alone)."""

    def __init__(self, parts: list[tuple[np.ndarray, torch.Tensor]], tree_index: np.ndarray | None) -> None:
        self._parts, self._index = parts, tree_index
        self._map: dict[int, torch.Tensor] | None = None

    def _built(self) -> dict[int, torch.Tensor]:
        if self._map is None:
            self._map = {}
            index = self._index.tolist() if self._index is not None else []
            for cands, probs in self._parts:
                for row, c in enumerate(cands.tolist()):
                    node = 0 if c < 0 else index[c] if index else -1
                    if node >= 0:
                        self._map[node] = probs[row]
        return self._map

    def __getitem__(self, node: int) -> torch.Tensor:
        return self._built()[node]

    def __iter__(self) -> Iterator[int]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._built())


@dataclass(frozen=True)
class DraftContext:
    """Per-step facts the drafter passes to the policy."""

    step: int
    position: int
    prompt_len: int
    domain: str
    max_depth: int
    running_accept_rate: float = float("nan")
    prev_accepted: int = -1
    token_types: np.ndarray | None = None  # [V] token-type index per id, for the policy's features
    entropy: bool = True  # compute draft entropies (read by learned policies and node logs only)
    batch: int = 1  # rows decoded together in this step (their trees share the step's forwards)


@dataclass(slots=True)  # not frozen: a frozen init sets each of its fields through object.__setattr__
class _Expanded:
    """The nodes expanded at the previous depth: their distributions and bookkeeping.

    The bookkeeping is numpy: a level has a handful of nodes, where each torch op's dispatch costs more than
    its work. Torch tensors appear only where a model or a policy reads them.
    """

    probs: torch.Tensor  # [e, V] draft distribution at each expanded node (CPU)
    scores: np.ndarray | None  # [e, V] float32 C-contiguous, probs = softmax(scores); None off the native path
    counts: np.ndarray  # [e] int64 children to draft for each
    kmax: int  # max(counts), >= 1
    uniform: bool  # every count equals kmax (static and learned trees)
    cand_idx: np.ndarray  # [e] int64 candidate index (-1 for the root), increasing
    fed_slot: np.ndarray  # [e] int64 draft-cache slot among this step's fed nodes (-1 for the root)
    path_lp: np.ndarray  # [e] float32
    prob: np.ndarray  # [e] float32 the expanded node's own draft probability
    features: torch.Tensor | None = None  # [e, H] a feature draft's guess of the target's feature at each


def _children(exp: _Expanded, mode: DraftMode, gen: torch.Generator | None, entropy: bool,
              native: Any | None = None) -> dict[str, np.ndarray]:
    """Children of each expanded node: top-k (or i.i.d. samples), ``counts[i]`` for row i.

    ``entropy=False`` leaves ``draft_entropy`` NaN: a full pass over the vocabulary that only learned
    policies and node logs read. ``native``: the compiled top-k path (``native.kernel()``), taken when the
    level has its scores; the same columns as the numpy path below.
    """
    probs = exp.probs  # [e, V] on the CPU
    if native is not None and exp.scores is not None and mode == "topk":
        k = min(max(exp.kmax, 2), probs.shape[-1])
        ints, floats = native(probs.numpy(), exp.scores, exp.counts, exp.cand_idx, exp.path_lp, exp.prob, k,
                              entropy)
        return {**dict(zip(INT_COLUMNS, ints, strict=True)), **dict(zip(FLOAT_COLUMNS, floats, strict=True))}
    e, kmax = probs.shape[0], exp.kmax
    top = torch.topk(probs, min(max(kmax, 2), probs.shape[-1]), dim=-1)  # children (top-k mode) and the margin
    values = top.values.numpy()
    if mode == "sampled":
        drawn = torch.multinomial(probs, kmax, replacement=True, generator=gen)  # [e, kmax]
        tok, p = drawn.numpy(), torch.gather(probs, 1, drawn).numpy()
    else:
        tok, p = top.indices.numpy()[:, :kmax], values[:, :kmax]
    margin = values[:, 0] - (values[:, 1] if values.shape[1] > 1 else 0)
    ent = _entropy(probs) if entropy else np.full(e, np.nan, dtype=np.float32)
    # numpy from here: small arrays, where each torch op's dispatch costs more than its work
    if exp.uniform:  # every row drafts kmax children
        rows, rank = _grid(e, kmax)
        rank = rank.copy()  # the frontier hands it to the policy as a tensor: its own, writable
        tok, p = tok.ravel(), p.ravel()
    else:
        rows, rank = np.nonzero(np.arange(kmax)[None, :] < exp.counts[:, None])  # row-major: rows ascending
        tok, p = tok[rows, rank], p[rows, rank]
    lp = np.log(np.maximum(p, 1e-30))
    cols = {
        "tokens": tok, "parent": exp.cand_idx[rows], "row": rows, "sibling_rank": rank,
        "draft_logprob": lp, "draft_entropy": ent[rows], "draft_margin": margin[rows],
        "path_logprob": exp.path_lp[rows] + lp, "parent_draft_prob": exp.prob[rows],
    }
    return cols


@functools.lru_cache(maxsize=256)
def _grid(e: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Read-only row and rank of each of ``e * k`` children, row-major; cached: two Python-level numpy
    calls (``repeat``, ``tile``) are slow right after a draft forward, a cache hit is one lookup
    (docs/performance.md)."""
    rows, rank = np.repeat(np.arange(e), k), np.tile(np.arange(k), e)
    rows.flags.writeable = rank.flags.writeable = False
    return rows, rank


@functools.lru_cache(maxsize=16)
def _chain(c: int) -> torch.Tensor:
    """[c, c] bool causal chain, shared (its readers only read it): a full-attention draft never even looks at
    it (the model builds a causal mask itself), and two torch ops per step are slow after a forward
    (docs/performance.md)."""
    return torch.ones(c, c, dtype=torch.bool).tril()


def _entropy(probs: torch.Tensor) -> np.ndarray:
    """[e] float32 entropy of each row (numpy: faster than torch's reduction at this size; docs/performance.md)."""
    p = probs.numpy()
    t = np.maximum(p, 1e-30)
    np.log(t, out=t)  # in place: one [e, V] temporary instead of three
    t *= p
    return -t.sum(-1, dtype=np.float32)


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


# The root's own columns but its token: the same every step, read-only (shared by every step and policy).
_ROOT = {"parent": _frozen(np.full(1, -1)), "sibling_rank": _frozen(np.zeros(1, np.int64)),
         "draft_logprob": _frozen(np.zeros(1, np.float32)), "draft_entropy": _frozen(np.zeros(1, np.float32)),
         "draft_margin": _frozen(np.ones(1, np.float32)), "path_logprob": _frozen(np.zeros(1, np.float32)),
         "parent_draft_prob": _frozen(np.ones(1, np.float32))}

# What a drafter yields: the next forward it needs; what it is sent back: that forward's output.
DraftFeeds = Generator[Feed, ModelOut, "DraftResult"]


class Drafter:
    """One step's drafting for one sequence: the levels drafted so far and the draft-cache slots they fill.

    ``feeds()`` is a generator that yields each draft forward it needs as a ``Feed`` and is sent back that
    forward's output, so one sequence (``draft_tree``) or many in lockstep (batched decoding) can drive it.

    ``features`` [n, H]: the target's feature at each position its cache holds, for a feature draft
    (``decoder.feature_draft``). Its slot j reads the feature at position j beside token j + 1, so its cache
    runs one position behind the sequence; a tree node reads the draft's own guess at its parent. Before the
    target has read the prompt there is no feature to read: that step is a plain one.
    """

    def __init__(self, seq: torch.Tensor, cached: int, policy: TreePolicy, ctx: DraftContext,
                 sampling: Sampling, mode: DraftMode, vocab: int, gen: torch.Generator | None,
                 features: torch.Tensor | None = None) -> None:
        self.seq, self.cached, self.policy, self.ctx = seq, cached, policy, ctx
        self.features, self.lag = features, 0 if features is None else 1
        self.sampling, self.mode, self.vocab, self.gen = sampling, mode, vocab, gen
        self.device = seq.device
        self.on_cpu = self.device.type == "cpu"  # skip no-op moves: each is a dispatch after a forward
        # The native children path needs the scores on the CPU; it does not draw samples.
        self.native = kernel() if self.on_cpu and mode == "topk" and vocab >= 2 else None
        self.expand, self.tree = expander(), tree_builder()
        self.levels: list[dict[str, np.ndarray]] = []
        self.prob_parts: list[tuple[np.ndarray, torch.Tensor]] = []  # per forward: candidates, [e, V] probs
        self.fed_anc = np.zeros((32, 32), dtype=bool)  # [cap, cap] ancestry among fed slots, the first n_fed used
        self.n_fed = self.n_kept = self.offset = 0
        self.policy_s = 0.0
        self.forwards = 0
        c = ctx  # what every level's frontier shares
        self.fields = {"step": c.step, "position": c.position, "prompt_len": c.prompt_len, "domain": c.domain,
                       "temperature": sampling.temperature, "max_depth": c.max_depth,
                       "running_accept_rate": c.running_accept_rate, "prev_accepted": c.prev_accepted,
                       "token_type_table": c.token_types, "batch": c.batch}

    def feeds(self) -> DraftFeeds:
        last = self.seq.numel() - 1  # a feature draft needs the target's feature up to the root's parent
        ready = self.features is None or self.features.shape[0] >= last > self.cached
        exp = (yield from self._root()) if self.ctx.max_depth >= 1 and ready else None
        depth = 0
        while exp is not None:
            depth += 1
            exp = yield from self._level(exp, depth)
        return self._result()

    def _probs(self, out: ModelOut) -> tuple[torch.Tensor, np.ndarray | None]:
        """[e, V] draft probabilities on the CPU, and their scores when the native children path reads them."""
        self.forwards += 1
        scores = self.sampling.scores(_fit_vocab(out.logits, self.vocab))
        probs = torch.softmax(scores, dim=-1)
        if self.native is None:
            return (probs if probs.is_cpu else probs.cpu()), None
        return probs, np.ascontiguousarray(scores.numpy())

    def _plan(self, frontier: Frontier) -> LevelPlan:
        t0 = time.perf_counter()
        plan = self.policy.plan(frontier)
        if frontier.depth >= self.ctx.max_depth:
            plan = LevelPlan.of_arrays(plan.keep, np.zeros_like(plan.children))
        self.policy_s += time.perf_counter() - t0
        return plan

    def _frontier(self, depth: int, level: dict[str, np.ndarray]) -> Frontier:
        return Frontier.from_fields(self.fields, depth, self.n_kept, level)

    def _root(self) -> Generator[Feed, torch.Tensor, _Expanded | None]:
        """Ask the policy first; only if it wants children, run forward 0 over the uncached committed tokens."""
        last = self.seq.numpy()[-1:] if self.on_cpu else self.seq[-1:].cpu().numpy()  # a view: no torch op on the CPU
        k = max(int(self._plan(self._frontier(0, {"tokens": last, **_ROOT})).children[0]), 0)
        if k == 0:
            return None  # plain step: the draft cache catches up on a later step
        counts = np.array([k])
        end = self.seq.numel() - self.lag  # the draft's slots end one before the root for a feature draft
        c = end - self.cached
        pos = torch.arange(self.cached, end, device=self.device)
        feats = None if self.features is None else self.features[self.cached:end]
        out = yield Feed(self.seq[self.cached + self.lag:], pos, _chain(c), commit=c, keep=1, causal=True,
                         features=feats)
        probs, scores = self._probs(out)
        minus, zero, one = _ROOT["parent"], _ROOT["path_logprob"], _ROOT["parent_draft_prob"]
        self.prob_parts.append((minus, probs))
        guess = None if out.features is None else out.features[-1:]
        return _Expanded(probs, scores, counts, k, True, minus, minus, zero, one, guess)

    def _level(self, exp: _Expanded, depth: int) -> Generator[Feed, torch.Tensor, _Expanded | None]:
        """Draft the children of ``exp``, let the policy prune them, and feed the ones it expands in one draft
        forward: each sees the committed prefix and its ancestors."""
        level = _children(exp, self.mode, self.gen, self.ctx.entropy, self.native)
        plan = self._plan(self._frontier(depth, level))
        f, m = self.n_fed, level["tokens"].shape[0]
        if f + m > self.fed_anc.shape[0]:
            grown = np.zeros((2 * (f + m), 2 * (f + m)), dtype=bool)
            grown[:f, :f] = self.fed_anc[:f, :f]
            self.fed_anc = grown
        book = self.expand(plan.keep, plan.children, level["row"], level["tokens"], level["draft_logprob"],
                           level["path_logprob"], exp.fed_slot, self.fed_anc, f, depth, self.offset)
        level["keep"], level["depth"], level["fed_slot"] = book.keep, book.depth, book.fed_slot
        self.levels.append(level)
        self.n_kept += book.kept
        self.offset += m
        e = book.rows.shape[0]
        if e == 0:
            return None
        self.n_fed = f + e
        pos = torch.full((e,), self.seq.numel() - 1 - self.lag + depth, device=self.device)
        feed = torch.from_numpy(book.tokens)
        # A feature draft's node reads its parent's guessed feature (the parent's row among exp's).
        feats = None if exp.features is None else exp.features[torch.from_numpy(level["row"][book.rows])]
        out = yield Feed(feed if self.on_cpu else feed.to(self.device), pos, torch.from_numpy(book.visibility),
                         features=feats)
        probs, scores = self._probs(out)  # [e, V]
        self.prob_parts.append((book.candidates, probs))
        return _Expanded(probs, scores, book.counts, book.widest, book.uniform, book.candidates, book.slots,
                         book.path_logprob, book.prob, out.features)

    def _result(self) -> DraftResult:
        """Apply the policy's final selection, keep the tree connected, and index it."""
        if not self.levels:  # a plain step: the root alone
            root = self.seq[-1:].cpu()
            tree = DraftTree(tokens=root, parents=torch.full((1,), -1), depth=torch.zeros(1, dtype=torch.long),
                             ancestor_mask=torch.ones(1, 1, dtype=torch.bool))
            return DraftResult(tree, _NO_CANDIDATES, DraftProbs(self.prob_parts, None), torch.full((1,), -1), 0.0,
                               self.policy_s, self.forwards)
        cols = _stack(self.levels)
        keep, fed = cols.pop("keep"), cols.pop("fed_slot")
        self._final = cols, keep, fed
        root = int(self.seq[-1])
        arrays = self.tree(keep, cols["parent"], cols["tokens"], fed, root)
        cands = Candidates({**cols, "tree_index": arrays.index})
        t0 = time.perf_counter()
        final = self.policy.finalize(cands)
        self.policy_s += time.perf_counter() - t0
        if final is not None:  # plan() only expands kept nodes: only a final selection can orphan one
            return self.cut(final.bool().numpy())
        return self._indexed(cands, arrays)

    def cut(self, select: np.ndarray) -> DraftResult:
        """The step's tree again with only the kept candidates ``select`` marks ([m] bool; any node whose parent
        is dropped goes too): a final selection, or a batch's common cap (``decoder.loop.batch``)."""
        cols, keep, fed = self._final
        arrays = self.tree(keep & select, cols["parent"], cols["tokens"], fed, int(self.seq[-1]))
        return self._indexed(Candidates({**cols, "tree_index": arrays.index}), arrays)

    def _indexed(self, cands: Candidates, arrays: TreeArrays) -> DraftResult:
        tree = DraftTree(tokens=torch.from_numpy(arrays.tokens), parents=torch.from_numpy(arrays.parents),
                         depth=torch.from_numpy(arrays.depth), ancestor_mask=torch.from_numpy(arrays.ancestors))
        return DraftResult(tree, cands, DraftProbs(self.prob_parts, arrays.index), torch.from_numpy(arrays.fed_slot),
                           0.0, self.policy_s, self.forwards)


def draft_tree(model: PreTrainedModel, cache: DynamicCache | ArenaCache, seq: torch.Tensor, policy: TreePolicy,
               ctx: DraftContext, sampling: Sampling, mode: DraftMode, vocab: int,
               gen: torch.Generator | None = None, layout: AttentionLayout | None = None,
               dtype: torch.dtype | None = None, features: torch.Tensor | None = None) -> DraftResult:
    """Catch the draft cache up with ``seq`` (root = seq[-1]) and draft one tree under ``policy``.

    ``layout`` gives the draft's attention kinds (``capability.attention_layout``); None means all full.
    ``dtype`` is the draft's parameter dtype when the caller knows it (looking it up walks the modules).
    ``features``: the target's features a feature draft reads (``Drafter``); None for a standalone draft.
    """
    layout = layout if layout is not None else AttentionLayout((FULL,), None)
    solo = SoloCache(cache, layout, dtype if dtype is not None else next(model.parameters()).dtype)
    feeds = Drafter(seq, solo.committed, policy, ctx, sampling, mode, vocab, gen, features).feeds()
    forward_s, out = 0.0, None
    try:
        while True:
            feed = feeds.send(out)  # type: ignore[arg-type]  # the first send(None) starts the generator
            t0 = time.perf_counter()
            out = solo.run(model, feed)
            forward_s += time.perf_counter() - t0
    except StopIteration as done:
        return replace(done.value, forward_s=forward_s, model_s=solo.model_s)


def _fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Pad (with -inf) or cut draft logits to the target's vocabulary size."""
    v = logits.shape[-1]
    if v == vocab:
        return logits
    if v > vocab:
        return logits[..., :vocab]
    pad = torch.full((*logits.shape[:-1], vocab - v), float("-inf"), dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], dim=-1)


_LONG = ("tokens", "parent", "depth", "sibling_rank", "fed_slot")
_FLOAT = ("draft_logprob", "draft_entropy", "draft_margin", "path_logprob", "parent_draft_prob")
_TYPES = {"keep": np.bool_} | dict.fromkeys(_LONG, np.int64) | dict.fromkeys(_FLOAT, np.float32)


def _stack(levels: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Concatenate the per-level columns (empty columns of the right dtype when nothing was drafted)."""
    if not levels:
        return {n: np.zeros(0, dtype=dt) for n, dt in _TYPES.items()}
    return {n: np.concatenate([lv[n] for lv in levels]) for n in _TYPES}


# A plain step's candidates: none (frozen, and no consumer writes into them).
_NO_CANDIDATES = Candidates({**{n: v for n, v in _stack([]).items() if n not in ("keep", "fed_slot")},
                             "tree_index": np.zeros(0, dtype=np.int64)})
