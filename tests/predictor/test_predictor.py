"""Acceptance predictor on synthetic node logs with a known signal (fast, single-threaded)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from treewise.decoder.records.nodelog import SCHEMA, write_atomic
from treewise.predictor import AcceptancePredictor, FeatureSchemaError, PredictorConfig, select_rows, train
from treewise.predictor.baselines import _refit_threshold, hf_confidence_threshold
from treewise.predictor.calibration import fit_isotonic, pool_adjacent_violators
from treewise.predictor.config import LightGBMParams
from treewise.predictor.evaluate import evaluate
from treewise.predictor.features import conditional_mask, request_keys
from treewise.predictor.metrics import auc, binary_metrics, ece
from treewise.predictor.split import split_by_prompt
from treewise.predictor.synthetic import SyntheticSpec, make_synthetic_logs


@pytest.fixture(scope="module")
def logs() -> pa.Table:
    return make_synthetic_logs(SyntheticSpec(prompts_per_domain=40, seed=1))


@pytest.fixture(scope="module")
def predictor(logs: pa.Table) -> AcceptancePredictor:
    return train(logs, PredictorConfig())


def _batch(logs: pa.Table, n: int, seed: int = 0) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rows = select_rows(logs)
    idx = np.random.default_rng(seed).choice(len(rows), size=n, replace=False)
    cols = {k: rows.columns[k][idx] for k in PredictorConfig().features}
    # The controller passes numpy string arrays, not object arrays.
    cols["domain"] = np.array(cols["domain"].tolist())
    cols["token_type"] = np.array(cols["token_type"].tolist())
    return cols, idx


def test_synthetic_logs_match_the_node_log_schema(logs: pa.Table) -> None:
    assert logs.schema.equals(SCHEMA, check_metadata=False)
    assert logs.num_rows > 10_000


def test_rows_are_verified_nodes_whose_parent_was_accepted(logs: pa.Table) -> None:
    rows = select_rows(logs)
    d = logs.to_pydict()
    on_path = {(r, p, s, i): a for r, p, s, i, a in
               zip(d["run_id"], d["prompt_id"], d["step"], d["node_id"], d["on_accepted_path"], strict=True)}
    expected = [
        v and (dep == 1 or on_path[(r, p, s, par)])
        for r, p, s, par, dep, v in zip(d["run_id"], d["prompt_id"], d["step"], d["parent_id"], d["depth"],
                                        d["verified"], strict=True)
    ]
    assert len(rows) == sum(expected)
    assert 0 < len(rows) < sum(d["verified"])  # some verified nodes had a rejected parent
    assert np.array_equal(rows.hard, np.asarray(d["target_argmax_match"])[np.asarray(expected)])


def test_soft_label_is_accept_prob_else_target_prob() -> None:
    table = make_synthetic_logs(SyntheticSpec(prompts_per_domain=3, steps=3, temperature=0.7))
    accept = np.asarray(table.column("accept_prob"), dtype=np.float64).copy()
    accept[::2] = np.nan  # nodes the sampling verifier did not try
    table = table.set_column(table.schema.get_field_index("accept_prob"), "accept_prob",
                             pa.array(accept, type=pa.float32()))
    mask = conditional_mask(table, request_keys(table))
    chosen = table.filter(pa.array(mask))
    acc = np.asarray(chosen.column("accept_prob"), dtype=np.float64)
    target = np.asarray(chosen.column("target_prob"), dtype=np.float64)
    assert np.isnan(acc).any() and not np.isnan(acc).all()
    rows = select_rows(table)
    np.testing.assert_array_equal(rows.soft, np.where(np.isnan(acc), target, acc))


def test_auc_above_0_9_on_a_known_signal(predictor: AcceptancePredictor, logs: pa.Table) -> None:
    assert predictor.metrics["test"]["auc"] > 0.9
    report = evaluate(predictor, logs, latency_calls=0)
    assert report.model.overall.auc > 0.9
    assert report.model.overall.n == predictor.metrics["rows"]["test"]
    # The same learner on an uninformative feature stays near chance: the bar above is not free.
    blind = train(logs, PredictorConfig(features=["prompt_len"]))
    assert blind.metrics["test"]["auc"] < 0.7


def test_no_prompt_on_two_sides_of_the_split(logs: pa.Table, predictor: AcceptancePredictor) -> None:
    split = predictor.split
    assert split is not None
    sides = [set(split.train), set(split.valid), set(split.test)]
    assert all(not (a & b) for i, a in enumerate(sides) for b in sides[i + 1:])
    rows = select_rows(logs)
    assert set().union(*sides) == set(rows.group.tolist())
    masks = split.masks(rows.group)
    for mask in (masks.train, masks.valid, masks.test):
        others = ~mask
        assert not set(rows.group[mask].tolist()) & set(rows.group[others].tolist())
    # Every domain has prompts on every side.
    for side in (split.valid, split.test):
        assert {g.split("-")[0] for g in side} == {"code", "math", "chat"}


def test_split_by_request_keeps_a_run_prompt_pair_together() -> None:
    group = np.array(["r1\x1fa", "r1\x1fa", "r2\x1fa", "r1\x1fb", "r2\x1fb", "r1\x1fc"] * 3, dtype=object)
    domain = np.array(["x"] * len(group), dtype=object)
    split = split_by_prompt(group, domain, 0.5, 0.2, seed=3)
    assert sorted(split.train + split.valid + split.test) == sorted(set(group.tolist()))
    assert len(set(split.train) | set(split.valid) | set(split.test)) == 5


def test_save_load_gives_identical_predictions(predictor: AcceptancePredictor, logs: pa.Table,
                                                tmp_path: Path) -> None:
    predictor.save(tmp_path)
    assert {p.name for p in tmp_path.iterdir()} >= {"model.txt", "feature_schema.json", "metrics.json"}
    loaded = AcceptancePredictor.load(tmp_path)
    rows = select_rows(logs)
    assert np.array_equal(loaded.predict_rows(rows), predictor.predict_rows(rows))
    batch, _ = _batch(logs, 32)
    assert np.array_equal(loaded.predict_batch(batch), predictor.predict_batch(batch))
    assert loaded.split == predictor.split and loaded.config == predictor.config
    assert json.loads((tmp_path / "metrics.json").read_text())["test"]["auc"] == predictor.metrics["test"]["auc"]


def test_predict_batch_equals_row_predictions(predictor: AcceptancePredictor, logs: pa.Table) -> None:
    batch, idx = _batch(logs, 64)
    rows = select_rows(logs)
    np.testing.assert_allclose(predictor.predict_batch(batch), predictor.predict_rows(rows)[idx], atol=1e-12)
    for n in (4, 16, 100):  # beyond the preallocated 64 rows too
        part, _ = _batch(logs, n, seed=n)
        p = predictor.predict_batch(part)
        assert p.shape == (n,) and np.all((p >= 0) & (p <= 1))
    batch["domain"] = np.array(["never-seen"] * 64)  # unknown categories are missing values, not errors
    assert np.isfinite(predictor.predict_batch(batch)).all()


def test_predict_batch_names_missing_and_extra_features(predictor: AcceptancePredictor, logs: pa.Table) -> None:
    features, idx = _batch(logs, 8)
    missing = {k: v for k, v in features.items() if k != "draft_entropy"}
    with pytest.raises(FeatureSchemaError, match=r"missing \['draft_entropy'\].*feature_names"):
        predictor.predict_batch(missing)
    with pytest.raises(FeatureSchemaError, match=r"extra \['token_id'\]"):
        predictor.predict_batch(features | {"token_id": select_rows(logs).columns["token_id"][idx]})
    with pytest.raises(FeatureSchemaError, match="one value per candidate"):
        predictor.predict_batch(features | {"depth": features["depth"][:3]})


def _edit_schema(directory: Path, edit: callable) -> None:
    path = directory / "feature_schema.json"
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_loading_a_mismatched_schema_names_the_difference(predictor: AcceptancePredictor, tmp_path: Path) -> None:
    predictor.save(tmp_path)
    with pytest.raises(FeatureSchemaError, match=r"missing \['draft_margin'\].*retrain"):
        AcceptancePredictor.load(tmp_path, expected_features=[n for n in predictor.feature_names
                                                              if n != "draft_margin"])

    def rename(data: dict) -> None:
        data["features"][2]["name"] = "draft_margin_v2"

    _edit_schema(tmp_path, rename)
    with pytest.raises(FeatureSchemaError, match="draft_margin_v2"):
        AcceptancePredictor.load(tmp_path)
    predictor.save(tmp_path)

    def old_logs(data: dict) -> None:
        data["node_log_schema_version"] = "0"

    _edit_schema(tmp_path, old_logs)
    with pytest.raises(FeatureSchemaError, match="node-log schema '0'"):
        AcceptancePredictor.load(tmp_path)
    with pytest.raises(ValueError, match="treewise train"):
        AcceptancePredictor.load(tmp_path / "absent")


def test_pool_adjacent_violators_and_isotonic_fit() -> None:
    # 3, 2 violate and pool to 2.5; then 4, 0 pool to 2.0 < 2.5, so 3, 2, 4, 0 pool to 2.25.
    blocks = pool_adjacent_violators(np.array([1.0, 3.0, 2.0, 4.0, 0.0]), np.ones(5))
    np.testing.assert_allclose(blocks.mean, [1.0, 2.25])
    np.testing.assert_array_equal(blocks.start, [0, 1])
    rng = np.random.default_rng(0)
    truth = rng.uniform(size=4000)
    labels = (rng.uniform(size=4000) < truth).astype(float)
    calib = fit_isotonic(truth**3, labels)  # scores distorted by a monotone map
    mapped = calib(np.linspace(0, 1, 101))
    assert np.all(np.diff(mapped) >= 0)
    assert ece(calib(truth**3), labels) < 0.5 * ece(truth**3, labels)


def test_isotonic_calibration_reduces_ece_of_a_miscalibrated_model(logs: pa.Table) -> None:
    # Up-weighting positives shifts every prediction upward: a known, systematic miscalibration.
    skewed = {"lightgbm": LightGBMParams(extra={"scale_pos_weight": 8.0}), "early_stopping_rounds": 0,
              "num_boost_round": 50}
    raw = train(logs, PredictorConfig(calibration="none", **skewed))
    calibrated = train(logs, PredictorConfig(calibration="isotonic", **skewed))
    assert raw.metrics["test"]["ece"] > 0.1
    assert calibrated.metrics["test"]["ece"] < 0.5 * raw.metrics["test"]["ece"]
    assert calibrated.metrics["test"]["auc"] > raw.metrics["test"]["auc"] - 0.01


def test_metrics_against_brute_force() -> None:
    rng = np.random.default_rng(2)
    scores = rng.integers(0, 5, size=300).astype(float)  # many ties
    labels = (rng.uniform(size=300) < scores / 5).astype(float)
    pos, neg = scores[labels == 1], scores[labels == 0]
    brute = np.mean([(p > n) + 0.5 * (p == n) for p in pos for n in neg])
    assert auc(scores, labels) == pytest.approx(brute, abs=1e-12)
    assert math.isnan(auc(scores, np.ones(300)))
    p = np.full(1000, 0.3)
    y = np.r_[np.ones(300), np.zeros(700)]
    m = binary_metrics(p, y)
    assert m.ece == pytest.approx(0.0, abs=1e-12) and m.brier == pytest.approx(0.21)
    assert binary_metrics(np.full(1000, 0.8), y).ece == pytest.approx(0.5)


def test_hf_threshold_refits_online_per_request(logs: pa.Table) -> None:
    assert _refit_threshold(np.array([0.9, 0.8, 0.7, 0.3, 0.2, 0.1]), np.array([1, 1, 1, 0, 0, 0.0])) == 0.7
    rows = select_rows(logs)
    result = hf_confidence_threshold(rows, rows.hard)
    first = rows.columns["step"] == 0
    assert np.all(result.thresholds[first] == 0.4)  # the transformers default, before any history
    assert np.any(result.thresholds[~first] != 0.4)
    assert np.array_equal(result.decisions, np.exp(rows.columns["draft_logprob"]) >= result.thresholds)


def test_training_is_deterministic(logs: pa.Table, predictor: AcceptancePredictor) -> None:
    again = train(logs, PredictorConfig())
    assert again.booster.model_to_string() == predictor.booster.model_to_string()


def test_config_rejects_unknown_features_and_bad_fractions() -> None:
    with pytest.raises(ValueError, match="unknown features"):
        PredictorConfig(features=["draft_logprob", "node_id"])
    with pytest.raises(ValueError, match="test split"):
        PredictorConfig(train_fraction=0.8, valid_fraction=0.2)


def test_cli_train_and_evaluate_end_to_end(tmp_path: Path) -> None:
    from treewise.studies.learn.cli import register

    run = tmp_path / "runs" / "syn" / "nodes"
    run.mkdir(parents=True)
    table = make_synthetic_logs(SyntheticSpec(prompts_per_domain=12, steps=6, seed=4))
    write_atomic([table.slice(0, 6000)], run / "nodes-a.parquet")
    write_atomic([table.slice(6000)], run / "nodes-b.parquet")
    (run.parent / "prompts").mkdir()  # collect writes other parquet files next to nodes/
    pq.write_table(pa.table({"id": ["x"]}), run.parent / "prompts" / "p.parquet")
    app = typer.Typer()
    register(app)
    runner = CliRunner()
    model, out = tmp_path / "model", tmp_path / "eval.json"
    res = runner.invoke(app, ["train", str(run.parent), "--out", str(model), "--json", str(tmp_path / "t.json")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "t.json").read_text())["label"] == "hard"
    res = runner.invoke(app, ["evaluate", str(run.parent), "--model", str(model), "--json", str(out),
                              "--plots", str(tmp_path / "plots"), "--ablation", "--ablation-seeds", "2",
                              "--compare-labels", "--latency-calls", "20"])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert 0.5 < report["auc"] <= 1 and 0 <= report["ece"] <= 1
    for domain in ("code", "math", "chat"):
        assert {"auc", "ece"} <= set(report["per_domain"][domain])
    assert set(report["baselines"]) == {"draft_prob", "entropy", "domain_depth_table", "hf_confidence_threshold"}
    assert all(0 <= b["auc"] <= 1 for b in report["baselines"].values())
    assert set(report["predict_batch_us"]) == {"4", "16", "64"}
    assert {a["dropped"] for a in report["ablation"]} >= {"none", "running_acceptance", "domain", "position"}
    assert all(a["seeds"] == 2 and a["delta_auc_sd"] is not None for a in report["ablation"])
    assert set(report["labels"]) == {"hard", "soft"}
    assert (tmp_path / "plots" / "calibration.png").stat().st_size > 1000
    res = runner.invoke(app, ["evaluate", str(run.parent), "--model", str(tmp_path / "nothing")])
    assert res.exit_code == 1 and "treewise train" in res.output
