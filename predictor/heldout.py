"""Held-out evaluation: cross-fitted predictor vs baselines, before and after the online correction.

``evaluate_heldout`` cuts the logs into folds by prompt, by source or by domain (``predictor.crossfit``),
scores every tried row with the model that never saw its fold, replays each request in order through
the per-request correction (``predictor.replay``) and scores the baselines on the same rows; the domain
x depth table is fitted per fold on the training folds too. Returns data only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from . import baselines as bl
from .config import FEATURE_GROUPS, PredictorConfig
from .crossfit import CrossFit, Folds, SplitKind, cross_fit, make_folds
from .evaluate import AUC_GAIN_TARGET, ECE_TARGET, ScoredMetrics, scored
from .features import NodeRows, select_rows
from .metrics import binary_metrics
from .online import OnlineConfig
from .replay import replay_online
from .sources import prompt_splits, source_groups

# "predictor+online": replayed with each tried node's label, what LearnedTree learns from its accepted path;
# "predictor+online_from_counts": with labels inferred from the step's two counts (``infer_step_labels``).
PREDICTOR, ONLINE, ONLINE_COUNTS = "predictor", "predictor+online", "predictor+online_from_counts"


@dataclass(frozen=True)
class HeldoutTargets:
    auc_gain_over_draft_prob: float  # predictor (before the correction) minus draft prob, overall
    auc_gain_online: float  # the same with the correction
    max_domain_ece: float  # before the correction
    max_domain_ece_online: float
    domains_over_ece_online: list[str]


@dataclass(frozen=True)
class HeldoutReport:
    kind: str
    folds: list[dict[str, Any]]
    n_prompts: int
    scorers: dict[str, ScoredMetrics]
    targets: HeldoutTargets
    online: OnlineConfig
    by_suite_split: dict[str, dict[str, Any]] = field(default_factory=dict)
    online_grid: list[dict[str, Any]] = field(default_factory=list)
    online_gates: list[dict[str, Any]] = field(default_factory=list)  # the correction's gate, all rows scored

    def to_dict(self) -> dict[str, Any]:
        return {
            "split_by": self.kind, "folds": self.folds, "n_prompts": self.n_prompts,
            "online_config": self.online.model_dump(),
            "scorers": {k: s.to_dict() for k, s in self.scorers.items()},
            "targets": {k: (None if isinstance(v, float) and math.isnan(v) else v)
                        for k, v in vars(self.targets).items()},
            "by_suite_split": self.by_suite_split,
            "online_grid": self.online_grid,
            "online_gates": self.online_gates,
        }


@dataclass(frozen=True)
class HeldoutData:
    """The inputs of one held-out evaluation, built once and reused by its ablation."""

    rows: NodeRows  # every verified row (the replay needs whole trees)
    folds: Folds
    suite_split: np.ndarray  # the suite's split per row (train, tune, test; "" when unknown)

    @property
    def tried(self) -> np.ndarray:
        return self.rows.columns["tried"]


def prepare(logs: pa.Table, kind: SplitKind, suite: Mapping[str, Mapping[str, str]] | None = None, k: int = 3,
            seed: int = 0) -> HeldoutData:
    rows = select_rows(logs, "prompt_id", untried=True)
    sources = None
    if kind == "source" and suite is not None:
        sources = source_groups(rows.columns["prompt_id"], rows.columns["domain"], suite)
    folds = make_folds(rows, kind, k, sources, seed)
    split = prompt_splits(rows.columns["prompt_id"], suite) if suite is not None else np.full(len(rows), "", object)
    return HeldoutData(rows, folds, split)


def _table_oof(data: HeldoutData, label: str) -> np.ndarray:
    """The domain x depth table, fitted per fold on the other folds' tried rows."""
    out = np.full(len(data.rows), np.nan)
    for f in range(data.folds.k):
        test = data.folds.fold == f
        train = data.rows.subset(~test & data.tried)
        out[test] = bl.DomainDepthTable.fit(train, train.label(label)).predict(data.rows.subset(test))
    return out


def _targets(scorers: dict[str, ScoredMetrics]) -> HeldoutTargets:
    base = scorers["draft_prob"].overall.auc
    eces = {d: m.ece for d, m in scorers[PREDICTOR].per_domain.items()}
    eces_on = {d: m.ece for d, m in scorers[ONLINE].per_domain.items()}
    return HeldoutTargets(
        auc_gain_over_draft_prob=scorers[PREDICTOR].overall.auc - base,
        auc_gain_online=scorers[ONLINE].overall.auc - base,
        max_domain_ece=max(eces.values(), default=math.nan),
        max_domain_ece_online=max(eces_on.values(), default=math.nan),
        domains_over_ece_online=sorted(d for d, e in eces_on.items() if e > ECE_TARGET),
    )


def score_online(data: HeldoutData, fitted: CrossFit, online: OnlineConfig,
                 counts: bool = True) -> dict[str, np.ndarray]:
    """Predictions on every row: cross-fitted, and replayed through the correction (labels, and labels
    inferred from counts)."""
    out = {PREDICTOR: fitted.p, ONLINE: replay_online(data.rows, fitted.p, online, "exact")}
    if counts:
        out[ONLINE_COUNTS] = replay_online(data.rows, fitted.p, online, "counts")
    return out


def evaluate_heldout(data: HeldoutData, config: PredictorConfig, online: OnlineConfig | None = None,
                     grid: list[tuple[float, float]] | None = None,
                     gates: list[float] | None = None) -> HeldoutReport:
    """Cross-fit, replay and score (see the module docstring); ``grid``: (prior_offset, prior_slope) pairs
    whose replays are scored per suite split (tune selects, the other splits check); ``gates``: values of
    ``OnlineConfig.gate`` whose replays are scored on every row, overall and in the worst domain."""
    online = online or OnlineConfig()
    fitted = cross_fit(data.rows, data.folds, config)
    preds = score_online(data, fitted, online)
    t = data.tried
    test = data.rows.subset(t)
    labels = test.label(config.label)
    scorers = {name: scored(p[t], test, labels) for name, p in preds.items()}
    scorers["draft_prob"] = scored(bl.draft_prob(test), test, labels, note="exp(draft_logprob)")
    scorers["entropy"] = scored(bl.neg_entropy(test), test, labels, is_probability=False,
                                note="minus draft entropy; a ranking, so AUC only")
    scorers["domain_depth_table"] = scored(_table_oof(data, config.label)[t], test, labels,
                                           note="mean acceptance per (domain, depth) on the training folds")
    by_split = _split_scores(data, {k: preds[k] for k in (PREDICTOR, ONLINE)}, labels)
    grid_rows = [_grid_row(data, fitted, online.model_copy(update={"prior_offset": a, "prior_slope": b}), labels)
                 for a, b in (grid or [])]
    gate_rows = [_gate_row(data, fitted, online.model_copy(update={"gate": g}), test, labels) for g in (gates or [])]
    return HeldoutReport(data.folds.kind, fitted.fold_info(), len(set(test.group.tolist())), scorers,
                         _targets(scorers), online, by_split, grid_rows, gate_rows)


def _split_scores(data: HeldoutData, preds: dict[str, np.ndarray], labels: np.ndarray) -> dict[str, dict[str, Any]]:
    """Metrics per suite split (train, tune, test) of each prediction, with the worst domain's ECE."""
    t = data.tried
    split, dom, hard = data.suite_split[t], data.rows.columns["domain"][t], data.rows.hard[t]
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(set(split.tolist()) - {""}):
        m = split == name
        out[name] = {}
        for key, p in preds.items():
            q = p[t]
            met = binary_metrics(q[m], labels[m], hard[m])
            worst = max(binary_metrics(q[m & (dom == d)], labels[m & (dom == d)]).ece for d in sorted(set(dom[m])))
            out[name][key] = {"auc": met.auc, "log_loss": met.log_loss, "ece": met.ece, "max_domain_ece": worst}
    return out


def _grid_row(data: HeldoutData, fitted: CrossFit, online: OnlineConfig, labels: np.ndarray) -> dict[str, Any]:
    p = replay_online(data.rows, fitted.p, online, "exact")
    scores = _split_scores(data, {ONLINE: p}, labels)
    return {"prior_offset": online.prior_offset, "prior_slope": online.prior_slope,
            **{name: s[ONLINE] for name, s in scores.items()}}


def _gate_row(data: HeldoutData, fitted: CrossFit, online: OnlineConfig, test: NodeRows,
              labels: np.ndarray) -> dict[str, Any]:
    p = scored(replay_online(data.rows, fitted.p, online, "exact")[data.tried], test, labels)
    worst = max(p.per_domain, key=lambda d: p.per_domain[d].ece)
    return {"gate": online.gate, "auc": p.overall.auc, "log_loss": p.overall.log_loss, "ece": p.overall.ece,
            "max_domain_ece": p.per_domain[worst].ece, "worst_domain": worst}


@dataclass(frozen=True)
class HeldoutAblationRow:
    """One feature group dropped (``-group``) or added (``+group``); means over seeds, deltas vs ``none``."""

    group: str
    features: list[str]
    auc: float
    log_loss: float
    ece: float
    max_domain_ece: float
    delta_auc: float  # negative: the change hurts ranking
    delta_auc_sd: float
    delta_log_loss: float  # positive: the change hurts
    delta_log_loss_sd: float
    seeds: int


def _variants(config: PredictorConfig) -> dict[str, tuple[list[str], PredictorConfig]]:
    out: dict[str, tuple[list[str], PredictorConfig]] = {"none": ([], config)}
    for group, names in FEATURE_GROUPS.items():
        present = tuple(n for n in names if n in config.features)
        if present and len(present) < len(config.features):
            out[f"-{group}"] = (list(present), config.without(present))
        elif not present:
            out[f"+{group}"] = (list(names), config.with_features(names))
    return out


def heldout_ablation(data: HeldoutData, config: PredictorConfig, seeds: int = 3) -> list[HeldoutAblationRow]:
    """Retrain the cross-fit without (or with) each feature group, ``seeds`` LightGBM / validation seeds each."""
    t = data.tried
    test = data.rows.subset(t)
    dom = test.columns["domain"]
    scores: dict[str, list[tuple[float, float, float, float]]] = {}
    for name, (_, cfg) in _variants(config).items():
        for i in range(seeds):
            p = cross_fit(data.rows, data.folds, cfg.model_copy(update={"seed": cfg.seed + i})).p[t]
            y = test.label(cfg.label)
            m = binary_metrics(p, y, test.hard)
            worst = max(binary_metrics(p[dom == d], y[dom == d]).ece for d in sorted(set(dom.tolist())))
            scores.setdefault(name, []).append((m.auc, m.log_loss, m.ece, worst))
    base = np.asarray(scores["none"])
    rows = []
    for name, (features, _) in _variants(config).items():
        a = np.asarray(scores[name])
        d = a - base
        rows.append(HeldoutAblationRow(name, features, *(float(x) for x in a.mean(0)), float(d[:, 0].mean()),
                                       _sd(d[:, 0]), float(d[:, 1].mean()), _sd(d[:, 1]), seeds))
    return rows


def _sd(x: np.ndarray) -> float:
    return float(x.std(ddof=1)) if len(x) > 1 else math.nan


__all__ = ["AUC_GAIN_TARGET", "ECE_TARGET", "HeldoutAblationRow", "HeldoutData", "HeldoutReport",
           "evaluate_heldout", "heldout_ablation", "prepare"]
