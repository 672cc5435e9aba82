"""Evaluate a predictor on the test prompts of some node logs, against baselines; returns data only.

Test rows are those whose prompt group the model's saved split did not put in train or validation
(all rows, for logs the model never saw). AUC always scores the hard label (target argmax match);
log-loss, Brier and ECE score the label kind the model was trained on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from . import baselines as bl
from .config import FEATURE_GROUPS, PredictorConfig
from .features import FeatureSchema, NodeRows, select_rows
from .latency import LatencyResult, measure_predict_batch
from .metrics import BinaryMetrics, CalibrationBin, binary_metrics, calibration_curve
from .model import AcceptancePredictor, PredictorError, fit
from .online import OnlineConfig
from .replay import replay_online
from .split import PromptSplit, SplitMasks, split_by_prompt

AUC_GAIN_TARGET = 0.03
ECE_TARGET = 0.03


@dataclass(frozen=True)
class ScoredMetrics:
    """Metrics overall and per domain for one scorer (the predictor or a baseline)."""

    overall: BinaryMetrics
    per_domain: dict[str, BinaryMetrics]
    note: str = ""
    extra: dict[str, float] = field(default_factory=dict)
    # who proposed the node (decoder.candidates.merge)
    per_source: dict[str, BinaryMetrics] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = self.overall.to_dict()
        out["per_domain"] = {d: m.to_dict() for d, m in self.per_domain.items()}
        out["per_source"] = {s: m.to_dict() for s, m in self.per_source.items()}
        out.update(self.extra)
        if self.note:
            out["note"] = self.note
        return out


@dataclass(frozen=True)
class AblationRow:
    """One feature group dropped; deltas are ablated minus full, averaged over split seeds."""

    dropped: str  # feature group name, "none" for the full model
    features: list[str]
    test: BinaryMetrics  # on the model's own split (the first seed)
    delta_auc: float  # negative: the group helps
    delta_log_loss: float  # positive: the group helps
    delta_auc_sd: float  # spread over seeds (NaN for one seed)
    delta_log_loss_sd: float
    seeds: int


@dataclass(frozen=True)
class LabelComparison:
    label: str
    auc: float  # vs the hard label
    ece_hard: float
    ece_soft: float
    brier_soft: float
    log_loss_hard: float


@dataclass(frozen=True)
class TargetCheck:
    auc_gain_over_draft_prob: float
    domains_with_auc_gain: list[str]  # domains whose gain is at least AUC_GAIN_TARGET
    domains: int
    max_domain_ece: float
    domains_over_ece_target: list[str]
    max_domain_ece_online: float = math.nan  # with the per-request correction (when evaluated)
    domains_over_ece_target_online: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class EvaluationReport:
    label: str
    n_prompts: int
    model: ScoredMetrics
    per_depth: dict[str, BinaryMetrics]
    calibration_curve: list[CalibrationBin]
    importance_gain: dict[str, float]
    baselines: dict[str, ScoredMetrics]
    targets: TargetCheck
    latency: list[LatencyResult]
    ablation: list[AblationRow] | None = None
    labels: list[LabelComparison] | None = None
    online: ScoredMetrics | None = None  # the predictor through the per-request correction, replayed in order

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"label": self.label, "n_prompts": self.n_prompts}
        out.update(self.model.to_dict())
        out["per_depth"] = {k: m.to_dict() for k, m in self.per_depth.items()}
        out["calibration_curve"] = [vars(b) for b in self.calibration_curve]
        out["importance_gain"] = self.importance_gain
        out["baselines"] = {k: b.to_dict() for k, b in self.baselines.items()}
        out["targets"] = _nan_to_none(vars(self.targets))
        out["predict_batch_us"] = {str(r.batch): r.median_us for r in self.latency}
        out["predict_batch_latency"] = [r.to_dict() for r in self.latency]
        if self.ablation is not None:
            out["ablation"] = [
                {"dropped": a.dropped, "features": a.features, "seeds": a.seeds, **a.test.to_dict(),
                 **_nan_to_none({"delta_auc": a.delta_auc, "delta_log_loss": a.delta_log_loss,
                                 "delta_auc_sd": a.delta_auc_sd, "delta_log_loss_sd": a.delta_log_loss_sd})}
                for a in self.ablation
            ]
        if self.labels is not None:
            out["labels"] = {c.label: _nan_to_none(vars(c)) for c in self.labels}
        if self.online is not None:
            out["online"] = self.online.to_dict()
        return out


def _nan_to_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}


def scored(scores: np.ndarray, rows: NodeRows, labels: np.ndarray, is_probability: bool = True,
           note: str = "", extra: dict[str, float] | None = None) -> ScoredMetrics:
    """Metrics of one scorer overall, per domain and per source (AUC on the hard label, the rest on ``labels``)."""
    def per(column: str) -> dict[str, BinaryMetrics]:
        values = rows.columns[column]
        return {v: binary_metrics(scores[values == v], labels[values == v], rows.hard[values == v], is_probability)
                for v in sorted(set(values.tolist()))}

    overall = binary_metrics(scores, labels, rows.hard, is_probability)
    return ScoredMetrics(overall, per("domain"), note, extra or {}, per("source"))


def _masks(predictor: AcceptancePredictor, rows: NodeRows) -> SplitMasks:
    split = predictor.split or PromptSplit([], [], [])
    return split.masks(rows.group)


def evaluate(predictor: AcceptancePredictor, logs: pa.Table, ablation: bool = False,
             compare_labels: bool = False, latency_calls: int = 300, ablation_seeds: int = 1,
             online: OnlineConfig | None = None) -> EvaluationReport:
    """Score the predictor and the baselines on the test prompts; optionally retrain for studies.

    The ablation uses the model's split, then ``ablation_seeds - 1`` fresh prompt splits of the same logs
    (seed + i), so a feature group's effect comes with its spread across splits. ``online``: also score
    the predictor through the per-request correction, replaying each test request in order with each
    tried node's label, what LearnedTree learns from the step's accepted path (``predictor.replay``).
    """
    every = select_rows(logs, predictor.config.split_by, untried=True)
    rows = every.subset(every.columns["tried"])
    masks = _masks(predictor, rows)
    test = rows.subset(masks.test)
    if len(test) == 0:
        raise PredictorError("no test rows: these logs hold only the model's training and validation prompts")
    labels = test.label(predictor.config.label)
    p = predictor.predict_rows(test)
    depth = test.columns["depth"].astype(int)
    model = scored(p, test, labels)
    report = EvaluationReport(
        label=predictor.config.label,
        n_prompts=len(set(test.group.tolist())),
        model=model,
        per_depth={str(k): binary_metrics(p[depth == k], labels[depth == k], test.hard[depth == k])
                   for k in sorted(set(depth.tolist()))},
        calibration_curve=calibration_curve(p, labels),
        importance_gain=predictor.importance(),
        baselines=_baselines(rows, masks, test, labels, predictor.config.label),
        targets=TargetCheck(math.nan, [], 0, math.nan, []),
        latency=measure_predict_batch(predictor, test, calls=latency_calls) if latency_calls else [],
        ablation=_ablation(predictor, rows, masks, ablation_seeds) if ablation else None,
        labels=_compare_labels(predictor, rows, masks) if compare_labels else None,
        online=_online(predictor, every, online, test, labels) if online is not None else None,
    )
    return _with_targets(report)


def _online(predictor: AcceptancePredictor, every: NodeRows, online: OnlineConfig, test: NodeRows,
            labels: np.ndarray) -> ScoredMetrics:
    """The test requests replayed through the correction; scored on the same rows as the predictor."""
    sub = every.subset(_masks(predictor, every).test)
    q = replay_online(sub, predictor.predict_rows(sub), online, "exact")  # the labels LearnedTree learns from
    return scored(q[sub.columns["tried"]], test, labels, note="per-request online correction, replayed in order")


def _baselines(rows: NodeRows, masks: SplitMasks, test: NodeRows, labels: np.ndarray,
               label_kind: str) -> dict[str, ScoredMetrics]:
    out = {
        "draft_prob": scored(bl.draft_prob(test), test, labels, note="exp(draft_logprob)"),
        "entropy": scored(bl.neg_entropy(test), test, labels, is_probability=False,
                           note="minus draft entropy; a ranking, so AUC only"),
    }
    train = rows.subset(masks.train)
    if len(train):
        table = bl.DomainDepthTable.fit(train, train.label(label_kind))
        out["domain_depth_table"] = scored(table.predict(test), test, labels,
                                            note="mean acceptance per (domain, depth) on the training prompts")
    hf = bl.hf_confidence_threshold(test, test.hard)
    out["hf_confidence_threshold"] = scored(
        hf.decisions, test, labels, is_probability=False, extra=hf.extra,
        note="online-refit draft-prob threshold; AUC of its keep/stop decisions",
    )
    return out


def _with_targets(report: EvaluationReport) -> EvaluationReport:
    base = report.baselines["draft_prob"]
    gains = {d: m.auc - base.per_domain[d].auc for d, m in report.model.per_domain.items()}
    eces = {d: m.ece for d, m in report.model.per_domain.items()}
    eces_on = {d: m.ece for d, m in report.online.per_domain.items()} if report.online is not None else {}
    targets = TargetCheck(
        auc_gain_over_draft_prob=report.model.overall.auc - base.overall.auc,
        domains_with_auc_gain=sorted(d for d, g in gains.items() if g >= AUC_GAIN_TARGET),
        domains=len(gains),
        max_domain_ece=max(eces.values(), default=math.nan),
        domains_over_ece_target=sorted(d for d, e in eces.items() if e > ECE_TARGET),
        max_domain_ece_online=max(eces_on.values(), default=math.nan),
        domains_over_ece_target_online=sorted(d for d, e in eces_on.items() if e > ECE_TARGET),
    )
    return EvaluationReport(**{**vars(report), "targets": targets})


def _sub_schema(schema: FeatureSchema, names: list[str]) -> FeatureSchema:
    """The model's schema restricted to some features (same category lists)."""
    return FeatureSchema([f for f in schema.features if f.name in names], schema.version,
                         schema.node_log_schema_version)


def _require_training_rows(masks: SplitMasks) -> None:
    if not masks.train.any() or not masks.valid.any():
        raise PredictorError("ablations retrain on the model's split: evaluate on the logs the model was trained on")


@dataclass(frozen=True)
class _GroupScore:
    dropped: list[str]
    test: BinaryMetrics


def _sd(values: np.ndarray) -> float:
    return float(values.std(ddof=1)) if len(values) > 1 else math.nan


def _ablation_deltas(rows: NodeRows, split: PromptSplit, schema: FeatureSchema, config: PredictorConfig,
                     full_model: AcceptancePredictor | None) -> dict[str, _GroupScore]:
    """Test metrics of the full model and of each ablated model on one split."""
    test = rows.subset(split.masks(rows.group).test)
    full = full_model or fit(rows, split, schema, config)
    out = {"none": _GroupScore(list(config.features),
                               binary_metrics(full.predict_rows(test), test.label(config.label), test.hard))}
    for group, names in FEATURE_GROUPS.items():
        dropped = tuple(n for n in names if n in config.features)
        if not dropped or len(dropped) == len(config.features):
            continue
        cfg = config.without(dropped)
        model = fit(rows, split, _sub_schema(schema, cfg.features), cfg)
        out[group] = _GroupScore(list(dropped),
                                 binary_metrics(model.predict_rows(test), test.label(cfg.label), test.hard))
    return out


def _ablation(predictor: AcceptancePredictor, rows: NodeRows, masks: SplitMasks, seeds: int) -> list[AblationRow]:
    _require_training_rows(masks)
    config, split = predictor.config, predictor.split
    assert split is not None  # _require_training_rows saw train rows, so there is a split
    runs = [_ablation_deltas(rows, split, predictor.schema, config, predictor)]
    for i in range(1, seeds):
        cfg = config.model_copy(update={"seed": config.seed + i})
        fresh = split_by_prompt(rows.group, rows.columns["domain"], cfg.train_fraction, cfg.valid_fraction, cfg.seed)
        runs.append(_ablation_deltas(rows, fresh, predictor.schema, cfg, None))
    out = []
    for group, first in runs[0].items():
        d_auc = np.array([r[group].test.auc - r["none"].test.auc for r in runs])
        d_ll = np.array([r[group].test.log_loss - r["none"].test.log_loss for r in runs])
        out.append(AblationRow(group, first.dropped, first.test, float(d_auc.mean()), float(d_ll.mean()),
                               _sd(d_auc), _sd(d_ll), len(runs)))
    return out


def _compare_labels(predictor: AcceptancePredictor, rows: NodeRows,
                    masks: SplitMasks) -> list[LabelComparison]:
    _require_training_rows(masks)
    assert predictor.split is not None
    test = rows.subset(masks.test)
    out = []
    for kind in ("hard", "soft"):
        if kind == predictor.config.label:
            model = predictor
        else:
            cfg = predictor.config.model_copy(update={"label": kind})
            model = fit(rows, predictor.split, _sub_schema(predictor.schema, cfg.features), cfg)
        p = model.predict_rows(test)
        hard = binary_metrics(p, test.hard)
        soft = binary_metrics(p, test.soft, test.hard)
        out.append(LabelComparison(kind, hard.auc, hard.ece, soft.ece, soft.brier, hard.log_loss))
    return out
