"""Dynamic baselines on the decoder's TreePolicy protocol: EAGLE-2's confidence tree and HF's dynamic chain."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch

from treewise.decoder import Candidates, Frontier, LevelPlan, RequestInfo, StepOutcome, TreewiseError, top_k_mask


@dataclass
class ConfidenceTree:
    """EAGLE-2's dynamic tree: expand the ``top_k`` most likely nodes of each level (by the product of draft
    probabilities along the path), each with ``top_k`` children, then keep the best ``budget`` of all drafted
    nodes by the same score."""

    budget: int = 32
    max_depth: int = 6
    top_k: int = 4
    reads_draft_entropy: ClassVar[bool] = False  # the drafter may skip computing it

    def __post_init__(self) -> None:
        if self.budget < 1 or self.max_depth < 1 or self.top_k < 1:
            raise TreewiseError(f"ConfidenceTree needs budget, max_depth and top_k >= 1, got {self}")

    def start(self, request: RequestInfo) -> None:
        return None

    def plan(self, frontier: Frontier) -> LevelPlan:
        if frontier.depth == 0:
            return LevelPlan.uniform(1, self.top_k)
        if frontier.depth >= self.max_depth:
            return LevelPlan.uniform(frontier.size, 0)
        expand = top_k_mask(frontier.path_logprob, self.top_k)
        return LevelPlan(keep=torch.ones(frontier.size, dtype=torch.bool), children=torch.where(expand, self.top_k, 0))

    def finalize(self, candidates: Candidates) -> torch.Tensor | None:
        # Path probabilities fall along every path, so the global top-budget set is a connected tree.
        return top_k_mask(candidates.path_logprob, self.budget)

    def observe(self, outcome: StepOutcome) -> None:
        return None


@dataclass
class DynamicChain:
    """Hugging Face's dynamic lookahead: draft a chain until the draft's probability of its own token falls
    under a threshold, refit online from this request's history (cost = FPR + 3 FNR over the ROC curve, as
    transformers' assisted generation does)."""

    max_length: int = 20  # HF's num_assistant_tokens
    threshold: float = 0.4  # HF's assistant_confidence_threshold
    refit: bool = True
    reads_draft_entropy: ClassVar[bool] = False
    _thr: float = field(default=0.4, init=False, repr=False)
    _probs: list[float] = field(default_factory=list, init=False, repr=False)
    _matches: list[int] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_length < 1 or not 0 <= self.threshold <= 1:
            raise TreewiseError(f"DynamicChain needs max_length >= 1 and 0 <= threshold <= 1, got {self}")
        self._thr = self.threshold

    @property
    def current_threshold(self) -> float:
        return self._thr

    def start(self, request: RequestInfo) -> None:
        self._thr, self._probs, self._matches = self.threshold, [], []

    def plan(self, frontier: Frontier) -> LevelPlan:
        if frontier.depth == 0:
            return LevelPlan.uniform(1, 1)
        prob = float(frontier.draft_logprob[0].exp())
        self._probs.append(prob)
        go_on = prob >= self._thr and frontier.depth < self.max_length
        return LevelPlan.uniform(frontier.size, 1 if go_on else 0)

    def finalize(self, candidates: Candidates) -> torch.Tensor | None:
        return None

    def observe(self, outcome: StepOutcome) -> None:
        # Accepted tokens are positives, the first rejected one a negative; unverified ones are dropped.
        self._matches.extend([1] * outcome.accepted)
        if len(self._probs) > len(self._matches):
            self._matches.append(0)
        del self._probs[len(self._matches):]
        if self.refit and len(self._probs) > 5 and 0 in self._matches and 1 in self._matches:
            self._thr = refit_threshold(np.asarray(self._probs), np.asarray(self._matches))


def refit_threshold(probs: np.ndarray, matches: np.ndarray) -> float:
    """The ROC threshold minimising FPR + 3 * FNR (false negatives cost three times false positives)."""
    thresholds = np.unique(probs)[::-1]
    pos, neg = max(int(matches.sum()), 1), max(int((1 - matches).sum()), 1)
    predicted = probs[None, :] >= thresholds[:, None]  # [t, n]
    tpr = (predicted & (matches[None, :] == 1)).sum(1) / pos
    fpr = (predicted & (matches[None, :] == 0)).sum(1) / neg
    return float(thresholds[np.argmin(fpr + 3 * (1 - tpr))])
