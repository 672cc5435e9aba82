"""Verification is pure: target (and draft) probabilities in, accepted path and bonus token out.

Two lossless rules, matched to how the children were drawn (mixing them loses exactness):
- ``topk``: children are the draft's deterministic top-k. At a node, try the children in turn, accept
  child x with probability r(x) under the current residual target distribution r; on rejection set
  r(x) = 0 and renormalise; if all are rejected the bonus token is drawn from r.
- ``sampled``: children were drawn i.i.d. from the draft distribution q (SpecInfer). Accept x with
  probability min(1, r(x) / q(x)); on rejection r = norm(max(r - q, 0)).
Greedy (temperature 0) accepts the longest path whose every token is the target's argmax at its parent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .errors import TreewiseError
from .tree import DraftTree

DraftMode = Literal["topk", "sampled"]


@dataclass(frozen=True)
class Sampling:
    """How tokens are chosen; the same warping applies to the draft and the target."""

    temperature: float = 0.0
    top_k: int | None = None  # None: no top-k cut (unlike HF generate's default of 50)
    top_p: float | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise TreewiseError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise TreewiseError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise TreewiseError(f"top_p must be in (0, 1] or None, got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def scores(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, V] float32 warped logits: the logits when greedy, else HF's warpers in generate's order (cut
        tokens at -inf)."""
        scores = logits.float()
        if not self.greedy:
            scores = TemperatureLogitsWarper(self.temperature)(None, scores)
            if self.top_k is not None:
                scores = TopKLogitsWarper(self.top_k)(None, scores)
            if self.top_p is not None and self.top_p < 1:
                scores = TopPLogitsWarper(self.top_p)(None, scores)
        return scores

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """[n, V] float32 probabilities: softmax of ``scores`` (at T=1 when greedy)."""
        return torch.softmax(self.scores(logits), dim=-1)


@dataclass(frozen=True)
class VerifyInput:
    tree: DraftTree
    target_logits: torch.Tensor  # [n, V] at every tree node, root first
    sampling: Sampling
    draft_mode: DraftMode = "topk"
    # Draft distributions at expanded nodes (tree index -> [V]); needed by the ``sampled`` rule only.
    draft_probs: Mapping[int, torch.Tensor] = field(default_factory=dict)
    generator: torch.Generator | None = None
    # Nodes from this index on are deterministic proposals of another source (decoder.candidates.merge): under the
    # ``sampled`` rule they are tried first, by the ``topk`` rule, before the draft's i.i.d. samples.
    fixed_from: int | None = None


@dataclass(frozen=True)
class Acceptance:
    path: list[int]  # tree node indices from the root (0) to the last accepted node
    bonus: int  # the target's own token after the path
    target_probs: torch.Tensor | None  # [n, V] the (warped) target distribution at each node; None when greedy
    accept_prob: torch.Tensor  # [n] probability each node was accepted with when tried; NaN if never tried

    @property
    def accepted(self) -> int:
        """Draft tokens accepted (the bonus token not counted)."""
        return len(self.path) - 1


Verifier = Callable[[VerifyInput], Acceptance]


def verify(inp: VerifyInput) -> Acceptance:
    """Dispatch to the lossless rule that matches the sampling settings and draft mode."""
    if inp.sampling.greedy:
        return verify_greedy(inp)
    if inp.draft_mode == "topk":
        return _verify_walk(inp, _try_topk)
    if inp.draft_mode == "sampled":
        return _verify_walk(inp, _try_sampled, inp.fixed_from)
    raise TreewiseError(f"unknown draft mode {inp.draft_mode!r}: use 'topk' or 'sampled'")


def verify_greedy(inp: VerifyInput) -> Acceptance:
    tree = inp.tree
    argmax = _LazyArgmax(inp.target_logits)
    nan = torch.full((tree.size,), float("nan"))
    if tree.size == 1:  # a plain step: the target's token after the root
        return Acceptance(path=[0], bonus=argmax[0], target_probs=None, accept_prob=nan)
    # A node is accepted iff its parent is and its token is the target's argmax at the parent. Plain Python:
    # a tree has a few dozen nodes, fewer than the numpy calls a vectorised walk would take.
    parents, tokens = tree.parents.tolist(), tree.tokens.tolist()
    depth = [0] * tree.size  # depth of an accepted node, -1 for the rest
    best = 0  # the first accepted node of the greatest depth
    for i in range(1, tree.size):
        p = parents[i]
        if depth[p] >= 0 and tokens[i] == argmax[p]:  # argmax read only at accepted nodes
            depth[i] = depth[p] + 1
            if depth[i] > depth[best]:
                best = i
        else:
            depth[i] = -1
    path = [best]
    while path[-1] != 0:
        path.append(parents[path[-1]])
    # The greedy rule reads only the argmax: no softmax over the vocabulary (node logs compute it themselves).
    return Acceptance(path=path[::-1], bonus=argmax[best], target_probs=None, accept_prob=nan)


class _LazyArgmax:
    """Row argmaxes of logits [n, V], each computed on first read. On the CPU only the accepted nodes' rows
    are read (about tau of a tree's n rows), each one numpy pass; elsewhere all rows at once, one transfer."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.rows = logits.detach().numpy() if logits.device.type == "cpu" else None
        self.all = row_argmax(logits).tolist() if self.rows is None else None
        self.known: dict[int, int] = {}

    def __getitem__(self, i: int) -> int:
        if self.all is not None:
            return self.all[i]
        if i not in self.known:
            self.known[i] = int(self.rows[i].argmax())  # type: ignore[index]
        return self.known[i]


def row_argmax(logits: torch.Tensor) -> np.ndarray:
    """[n] argmax of each row; on the CPU through numpy, several times faster than torch's for small n."""
    if logits.device.type == "cpu":
        return logits.detach().numpy().argmax(-1)
    return logits.argmax(-1).cpu().numpy()


def _children(tree: DraftTree) -> list[list[int]]:
    kids: list[list[int]] = [[] for _ in range(tree.size)]
    for child, parent in enumerate(tree.parents.tolist()[1:], start=1):
        kids[parent].append(child)
    return kids


# A try-rule gets (residual target row, child token, draft row) and returns (accept prob, new residual).
TryRule = Callable[[torch.Tensor, int, torch.Tensor | None], "tuple[float, torch.Tensor]"]


def _try_topk(residual: torch.Tensor, token: int, _q: torch.Tensor | None) -> tuple[float, torch.Tensor]:
    total = float(residual.sum())
    prob = float(residual[token]) / total if total > 0 else 0.0
    rejected = residual.clone()
    rejected[token] = 0.0
    return prob, rejected


def _try_sampled(residual: torch.Tensor, token: int, q: torch.Tensor | None) -> tuple[float, torch.Tensor]:
    if q is None:
        raise TreewiseError("the 'sampled' rule needs the draft distribution of every expanded node")
    total = float(residual.sum())
    if total <= 0:
        return 0.0, residual
    r = residual / total
    qx = float(q[token])
    prob = 1.0 if qx <= 0 else min(1.0, float(r[token]) / qx)
    return prob, torch.clamp(r - q, min=0.0)


def _verify_walk(inp: VerifyInput, try_child: TryRule, fixed_from: int | None = None) -> Acceptance:
    """Walk down from the root, trying each node's children in turn; with ``fixed_from``, the children from
    that index on (fixed proposals) go first and by the ``topk`` rule: rejecting them leaves the residual the
    target's distribution without their tokens, which the sampled children are then judged against."""
    tree = inp.tree
    probs = inp.sampling.probs(inp.target_logits)  # [n, V]
    kids = _children(tree)
    if fixed_from is not None and fixed_from < tree.size:
        kids = [[k for k in ks if k >= fixed_from] + [k for k in ks if k < fixed_from] for ks in kids]
    tokens = tree.tokens.tolist()
    accept_prob = torch.full((tree.size,), float("nan"))
    gen = inp.generator
    node, path = 0, [0]
    while True:
        residual = probs[node].double().cpu()
        q = inp.draft_probs.get(node)
        q = q.double().cpu() if q is not None else None
        moved = False
        for child in kids[node]:
            rule = _try_topk if fixed_from is not None and child >= fixed_from else try_child
            prob, rejected = rule(residual, tokens[child], q)
            accept_prob[child] = prob
            if float(torch.rand((), generator=gen, dtype=torch.float64)) < prob:
                node, moved = child, True
                path.append(child)
                break
            residual = rejected
        if not moved:
            if float(residual.sum()) <= 0:  # numerically exhausted residual: fall back to the full row
                residual = probs[node].double().cpu()
            bonus = int(torch.multinomial(residual / residual.sum(), 1, generator=gen))
            return Acceptance(path=path, bonus=bonus, target_probs=probs, accept_prob=accept_prob)
