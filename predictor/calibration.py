"""Isotonic calibration by pool-adjacent-violators in numpy (scikit-learn is not a dependency).

The fitted map is piecewise linear between the pooled blocks' mean scores, so it keeps more of the
ranking than a step function would (fewer ties), and is constant beyond the end blocks. Each block's
value is shrunk toward its mean score by ``PRIOR_ROWS`` pseudo-rows: a small end block of all-0 or
all-1 labels would otherwise map to exactly 0 or 1 and make the test log-loss explode.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PRIOR_ROWS = 2.0


@dataclass(frozen=True)
class IsotonicCalibrator:
    x: np.ndarray  # block mean scores, increasing
    y: np.ndarray  # block mean labels, non-decreasing

    def __call__(self, p: np.ndarray) -> np.ndarray:
        return np.interp(p, self.x, self.y)

    def to_dict(self) -> dict[str, list[float]]:
        return {"x": self.x.tolist(), "y": self.y.tolist()}

    @classmethod
    def from_dict(cls, data: dict[str, list[float]]) -> IsotonicCalibrator:
        return cls(np.asarray(data["x"], dtype=np.float64), np.asarray(data["y"], dtype=np.float64))


@dataclass(frozen=True)
class PooledBlocks:
    start: np.ndarray  # index of each block's first value
    mean: np.ndarray  # the fitted (non-decreasing) value of each block
    weight: np.ndarray


def pool_adjacent_violators(values: np.ndarray, weights: np.ndarray) -> PooledBlocks:
    """Blocks of the weighted least-squares non-decreasing fit of ``values``."""
    starts: list[int] = []
    means: list[float] = []
    wsum: list[float] = []
    for i, (v, w) in enumerate(zip(values.tolist(), weights.tolist(), strict=True)):
        starts.append(i)
        means.append(v)
        wsum.append(w)
        # Merge backwards while the last block is below the one before it.
        while len(means) > 1 and means[-2] > means[-1]:
            w_new = wsum[-2] + wsum[-1]
            means[-2] = (means[-2] * wsum[-2] + means[-1] * wsum[-1]) / w_new
            wsum[-2] = w_new
            del means[-1], wsum[-1], starts[-1]
    return PooledBlocks(np.asarray(starts), np.asarray(means), np.asarray(wsum))


def fit_isotonic(scores: np.ndarray, labels: np.ndarray) -> IsotonicCalibrator:
    """Fit labels (0/1 or probabilities) as a non-decreasing function of scores."""
    if len(scores) < 2:
        raise ValueError("isotonic calibration needs at least two validation rows: set calibration='none'")
    # Equal scores share one value: pool them first, weighted by their count.
    uniq, inverse, counts = np.unique(scores, return_inverse=True, return_counts=True)
    label_sum = np.bincount(inverse, weights=labels, minlength=len(uniq))
    blocks = pool_adjacent_violators(label_sum / counts, counts.astype(np.float64))
    ends = np.append(blocks.start[1:], len(uniq))
    score_sum = uniq * counts
    x = np.array([score_sum[s:e].sum() / counts[s:e].sum() for s, e in zip(blocks.start, ends, strict=True)])
    y = (blocks.mean * blocks.weight + PRIOR_ROWS * x) / (blocks.weight + PRIOR_ROWS)
    return IsotonicCalibrator(x=x, y=np.clip(np.maximum.accumulate(y), 0.0, 1.0))
