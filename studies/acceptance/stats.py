"""Statistics primitives for the acceptance study: tie-aware weighted Spearman, prompt-level bootstrap,
out-of-fold log-loss of group-rate models. numpy only: scipy is not a treewise dependency.

Bootstrap replicates are expressed as integer row weights (a row of a prompt drawn k times has weight
k), so ranks and group rates are recomputed in O(n) per replicate without copying or re-sorting rows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


class RankPlan:
    """Sort order and tie groups of a column, computed once; mid-ranks for any row weights."""

    def __init__(self, values: np.ndarray) -> None:
        values = np.asarray(values, dtype=np.float64)
        self.order = np.argsort(values, kind="stable")
        ordered = values[self.order]
        new_group = np.ones(len(ordered), dtype=bool)
        new_group[1:] = ordered[1:] != ordered[:-1]
        self.starts = np.flatnonzero(new_group)
        self.group_of_sorted = np.cumsum(new_group) - 1

    def ranks(self, weights: np.ndarray) -> np.ndarray:
        """Mid-ranks (1-based) in the multiset where row i appears weights[i] times."""
        w_sorted = np.asarray(weights, dtype=np.float64)[self.order]
        group_w = np.add.reduceat(w_sorted, self.starts) if len(w_sorted) else w_sorted
        before = np.cumsum(group_w) - group_w
        mid = before + (group_w + 1.0) / 2.0
        out = np.empty(len(w_sorted))
        out[self.order] = mid[self.group_of_sorted]
        return out


def weighted_pearson(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
    total = w.sum()
    if total <= 0:
        return float("nan")
    mx, my = (w * x).sum() / total, (w * y).sum() / total
    dx, dy = x - mx, y - my
    sxx, syy = (w * dx * dx).sum(), (w * dy * dy).sum()
    if sxx <= 0 or syy <= 0:
        return float("nan")  # a constant column has no rank correlation
    return float((w * dx * dy).sum() / np.sqrt(sxx * syy))


class Spearman:
    """Spearman's rho of two columns (ties get mid-ranks), for any row weights."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x_plan, self.y_plan = RankPlan(x), RankPlan(y)
        self.n = len(x)

    def __call__(self, weights: np.ndarray | None = None) -> float:
        w = np.ones(self.n) if weights is None else np.asarray(weights, dtype=np.float64)
        if self.n < 2:
            return float("nan")
        return weighted_pearson(self.x_plan.ranks(w), self.y_plan.ranks(w), w)


def spearman(x: np.ndarray, y: np.ndarray, weights: np.ndarray | None = None) -> float:
    return Spearman(np.asarray(x), np.asarray(y))(weights)


@dataclass(frozen=True)
class BootstrapResult:
    estimate: float
    ci_low: float
    ci_high: float
    reps: int
    valid_reps: int  # replicates whose statistic was defined (not NaN)


def prompt_bootstrap(
    groups: np.ndarray,
    statistic: Callable[[np.ndarray], float],
    reps: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> BootstrapResult:
    """Percentile CI of ``statistic(row_weights)`` resampling groups (prompts) with replacement.

    ``groups`` holds each row's prompt index 0..P-1. The estimate is the statistic on all rows once.
    """
    return prompt_bootstrap_many(groups, lambda w: np.array([statistic(w)]), reps, seed, level)[0]


def prompt_bootstrap_many(
    groups: np.ndarray,
    statistic: Callable[[np.ndarray], np.ndarray],
    reps: int = 1000,
    seed: int = 0,
    level: float = 0.95,
) -> list[BootstrapResult]:
    """Like ``prompt_bootstrap`` for a statistic with several outputs, all from the same draws."""
    groups = np.asarray(groups)
    n_groups = int(groups.max()) + 1 if len(groups) else 0
    estimates = np.atleast_1d(statistic(np.ones(len(groups))))
    nan = float("nan")
    if n_groups < 2 or reps < 1:
        return [BootstrapResult(float(e), nan, nan, reps, 0) for e in estimates]
    rng = np.random.default_rng(seed)
    draws = rng.multinomial(n_groups, np.full(n_groups, 1.0 / n_groups), size=reps)
    values = np.array([np.atleast_1d(statistic(c[groups].astype(np.float64))) for c in draws])
    tail = (1.0 - level) / 2.0 * 100.0
    results = []
    for j, estimate in enumerate(estimates):
        column = values[:, j][~np.isnan(values[:, j])]
        if len(column) == 0:
            results.append(BootstrapResult(float(estimate), nan, nan, reps, 0))
            continue
        low, high = np.percentile(column, [tail, 100.0 - tail])
        results.append(BootstrapResult(float(estimate), float(low), float(high), reps, len(column)))
    return results


def fold_of_groups(n_groups: int, n_folds: int, seed: int = 0) -> np.ndarray:
    """A balanced random fold number for each group (prompt)."""
    rng = np.random.default_rng(seed)
    return rng.permutation(np.arange(n_groups) % max(1, min(n_folds, n_groups)))


def oof_logloss(
    y: np.ndarray, factor: np.ndarray, fold: np.ndarray, weights: np.ndarray, prior: float = 1.0
) -> float:
    """Out-of-fold log-loss (nats per row) of a model that predicts each factor level's rate.

    Rates come from the other folds, shrunk toward those folds' overall rate with ``prior`` pseudo-rows
    (a level absent from the other folds gets the overall rate), so a factor with more levels gains
    nothing from fitting noise. ``fold`` is per row, taken from its prompt: a prompt never informs itself.
    """
    levels, n_folds = int(factor.max()) + 1, int(fold.max()) + 1
    cell = fold * levels + factor
    pos = np.bincount(cell, weights * y, n_folds * levels).reshape(n_folds, levels)
    tot = np.bincount(cell, weights, n_folds * levels).reshape(n_folds, levels)
    if n_folds == 1:
        train_pos, train_tot = pos, tot  # one fold: in-sample, nothing held out
    else:
        train_pos, train_tot = pos.sum(0) - pos, tot.sum(0) - tot
    overall = (train_pos.sum(1, keepdims=True) + 0.5) / (train_tot.sum(1, keepdims=True) + 1.0)
    rate = (train_pos + prior * overall) / (train_tot + prior)
    rate = np.clip(rate, 1e-9, 1 - 1e-9)
    loss = -(pos * np.log(rate) + (tot - pos) * np.log1p(-rate)).sum()
    total = weights.sum()
    return float(loss / total) if total > 0 else float("nan")


@dataclass(frozen=True)
class Coded:
    """A column as integer codes 0..K-1 into its sorted distinct ``levels``."""

    codes: np.ndarray
    levels: np.ndarray


def encode(values: np.ndarray) -> Coded:
    levels, inv = np.unique(np.asarray(values), return_inverse=True)
    return Coded(inv.reshape(-1), levels)
