"""Baselines scored on the same test rows as the predictor.

- ``draft_prob``: exp(draft_logprob), what EAGLE-2 style dynamic trees trust;
- ``entropy``: minus the draft entropy (AdaEDL / SVIP stop drafting when entropy is high); a ranking only;
- ``domain_depth_table``: mean conditional acceptance per (domain, depth) on the training prompts,
  falling back to the domain mean for cells with fewer than ``min_rows`` rows, and to the mean per depth
  (then the global mean) for a domain the training rows never saw;
- ``hf_confidence_threshold``: Hugging Face assisted generation with ``assistant_confidence_threshold``:
  keep drafting while draft prob >= threshold, and after each step refit the threshold on the request's
  accepted / rejected history by minimising fpr + 3 fnr over its ROC (transformers'
  ``AssistedCandidateGenerator.update_candidate_strategy``; needs > 5 samples and both classes; starts
  at 0.4, its default). Each request starts afresh. It is scored by the AUC of its binary decisions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .features import NodeRows

HF_INITIAL_THRESHOLD = 0.4
HF_MIN_HISTORY = 5
HF_FN_COST = 3.0


def draft_prob(rows: NodeRows) -> np.ndarray:
    """A lookup node the draft never scored (NaN: its parent was not expanded) has draft probability 0."""
    return np.nan_to_num(np.exp(rows.columns["draft_logprob"].astype(np.float64)), nan=0.0)


def neg_entropy(rows: NodeRows) -> np.ndarray:
    """Unknown entropy (a lookup node under a node the draft never expanded) ranks last."""
    return np.nan_to_num(-rows.columns["draft_entropy"].astype(np.float64), nan=-1e30)


@dataclass(frozen=True)
class DomainDepthTable:
    cells: dict[tuple[str, int], float]
    domains: dict[str, float]
    overall: float
    depths: dict[int, float] = field(default_factory=dict)  # per depth over all domains: for unseen domains

    @classmethod
    def fit(cls, rows: NodeRows, labels: np.ndarray, min_rows: int = 20) -> DomainDepthTable:
        if len(rows) == 0:
            raise ValueError("the domain x depth table needs training rows: evaluate on the training logs")
        dom, depth = rows.columns["domain"], rows.columns["depth"].astype(int)
        cells: dict[tuple[str, int], float] = {}
        domains: dict[str, float] = {}
        for d in sorted(set(dom.tolist())):
            in_dom = dom == d
            domains[d] = float(labels[in_dom].mean())
            for k in sorted(set(depth[in_dom].tolist())):
                cell = in_dom & (depth == k)
                if cell.sum() >= min_rows:
                    cells[(d, k)] = float(labels[cell].mean())
        depths = {k: float(labels[depth == k].mean()) for k in sorted(set(depth.tolist()))
                  if (depth == k).sum() >= min_rows}
        return cls(cells, domains, float(labels.mean()), depths)

    def predict(self, rows: NodeRows) -> np.ndarray:
        """The (domain, depth) cell, else the domain's mean; a domain never seen gets its depth's mean."""
        dom, depth = rows.columns["domain"].tolist(), rows.columns["depth"].astype(int).tolist()
        return np.array([
            self.cells.get((d, k), self.domains[d]) if d in self.domains else self.depths.get(k, self.overall)
            for d, k in zip(dom, depth, strict=True)
        ])


@dataclass(frozen=True)
class ThresholdDecisions:
    decisions: np.ndarray  # 1.0 where the scheme would keep the draft token
    thresholds: np.ndarray  # the threshold in force for each row
    extra: dict[str, float] = field(default_factory=dict)


def _refit_threshold(probs: np.ndarray, matches: np.ndarray) -> float:
    """Threshold minimising fpr + 3 fnr over the ROC points (an infinite threshold included)."""
    order = np.argsort(-probs, kind="mergesort")
    p, m = probs[order], matches[order]
    last = np.r_[np.flatnonzero(np.diff(p)), len(p) - 1]  # last index of each run of equal scores
    tps, fps = np.cumsum(m)[last], np.cumsum(1 - m)[last]
    fpr = np.r_[0.0, fps / fps[-1]]
    fnr = 1.0 - np.r_[0.0, tps / tps[-1]]
    thresholds = np.r_[math.inf, p[last]]
    return float(thresholds[int(np.argmin(fpr + HF_FN_COST * fnr))])


def hf_confidence_threshold(rows: NodeRows, labels: np.ndarray) -> ThresholdDecisions:
    """Replay each request step by step with an online-refit draft-prob threshold."""
    prob = draft_prob(rows)
    step = rows.columns["step"].astype(np.int64)
    decisions = np.zeros(len(rows))
    thresholds = np.zeros(len(rows))
    codes = np.unique(rows.request, return_inverse=True)[1]
    order = np.lexsort((step, codes))  # by request, then step; stable within a step
    for idx in np.split(order, np.flatnonzero(np.diff(codes[order])) + 1):
        if len(idx) == 0:
            continue
        threshold = HF_INITIAL_THRESHOLD
        hist_p: list[np.ndarray] = []
        hist_m: list[np.ndarray] = []
        for at in np.split(idx, np.flatnonzero(np.diff(step[idx])) + 1):
            decisions[at] = prob[at] >= threshold
            thresholds[at] = threshold
            hist_p.append(prob[at])
            hist_m.append(labels[at] > 0.5)
            probs, matches = np.concatenate(hist_p), np.concatenate(hist_m).astype(np.float64)
            if len(probs) > HF_MIN_HISTORY and 0 < matches.sum() < len(matches):
                threshold = _refit_threshold(probs, matches)
    accuracy = float(np.mean(decisions == (labels > 0.5))) if len(rows) else math.nan
    mean_thr = float(np.mean(thresholds[np.isfinite(thresholds)])) if len(rows) else math.nan
    return ThresholdDecisions(decisions, thresholds, {"decision_accuracy": accuracy, "mean_threshold": mean_thr})
