"""Binary-classification metrics in numpy: AUC, log-loss, Brier, ECE and a calibration curve.

Labels may be probabilities (soft labels): log-loss, Brier and ECE then compare with the expected
acceptance; AUC always needs 0/1 labels.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

ECE_BINS = 10
_EPS = 1e-12


@dataclass(frozen=True)
class BinaryMetrics:
    n: int
    positive_rate: float  # mean label
    mean_prediction: float
    auc: float  # NaN when one class is absent
    log_loss: float  # NaN for scores that are not probabilities
    brier: float
    ece: float

    def to_dict(self) -> dict[str, float | int | None]:
        # JSON has no NaN: absent values are null.
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in asdict(self).items()}


@dataclass(frozen=True)
class CalibrationBin:
    lo: float
    hi: float
    count: int
    mean_prediction: float
    mean_label: float


def auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """Area under the ROC curve (Mann-Whitney U with average ranks for ties)."""
    y = np.asarray(labels) > 0.5
    n_pos = int(y.sum())
    n_neg = len(y) - n_pos
    if n_pos == 0 or n_neg == 0:
        return math.nan
    order = np.argsort(scores, kind="mergesort")
    s = np.asarray(scores)[order]
    # Average rank (1-based) of each run of equal scores.
    boundaries = np.flatnonzero(np.diff(s)) + 1
    starts = np.concatenate([[0], boundaries])
    ends = np.concatenate([boundaries, [len(s)]])
    run_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(len(s))
    ranks[order] = np.repeat(run_rank, ends - starts)
    return float((ranks[y].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def log_loss(p: np.ndarray, labels: np.ndarray) -> float:
    q = np.clip(p, _EPS, 1 - _EPS)
    return float(-np.mean(labels * np.log(q) + (1 - labels) * np.log(1 - q)))


def brier(p: np.ndarray, labels: np.ndarray) -> float:
    return float(np.mean((p - labels) ** 2))


def calibration_curve(p: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS) -> list[CalibrationBin]:
    """Equal-width bins on [0, 1]; empty bins are left out."""
    idx = np.clip((np.asarray(p) * bins).astype(int), 0, bins - 1)
    count = np.bincount(idx, minlength=bins)
    psum = np.bincount(idx, weights=p, minlength=bins)
    ysum = np.bincount(idx, weights=labels, minlength=bins)
    return [
        CalibrationBin(b / bins, (b + 1) / bins, int(count[b]), psum[b] / count[b], ysum[b] / count[b])
        for b in range(bins)
        if count[b]
    ]


def ece(p: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS) -> float:
    """Expected calibration error: count-weighted mean |mean prediction - mean label| over bins."""
    n = len(p)
    if n == 0:
        return math.nan
    return float(sum(b.count * abs(b.mean_prediction - b.mean_label) for b in calibration_curve(p, labels, bins)) / n)


def binary_metrics(scores: np.ndarray, labels: np.ndarray, auc_labels: np.ndarray | None = None,
                   is_probability: bool = True) -> BinaryMetrics:
    """All metrics; ``auc_labels`` (0/1) default to ``labels`` rounded, for soft-label evaluation."""
    scores = np.asarray(scores, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.float64)
    hard = labels if auc_labels is None else np.asarray(auc_labels, dtype=np.float64)
    if len(scores) == 0:
        return BinaryMetrics(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)
    prob = is_probability
    return BinaryMetrics(
        n=len(scores),
        positive_rate=float(labels.mean()),
        mean_prediction=float(scores.mean()) if prob else math.nan,
        auc=auc(scores, hard),
        log_loss=log_loss(scores, labels) if prob else math.nan,
        brier=brier(scores, labels) if prob else math.nan,
        ece=ece(scores, labels) if prob else math.nan,
    )
