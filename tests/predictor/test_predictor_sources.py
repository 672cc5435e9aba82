"""Node logs with lookup candidates: the predictor learns from the source features and its evaluation reports
AUC and ECE per source and the features' importance."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from treewise.predictor import PredictorConfig, train
from treewise.predictor.evaluate import evaluate
from treewise.predictor.synthetic import SyntheticSpec, make_synthetic_logs


def _with_lookup_nodes(table: pa.Table, seed: int = 0) -> pa.Table:
    """A third of the nodes become lookup nodes the draft never scored, whose lookup_prob carries the label."""
    rng = np.random.default_rng(seed)
    n = table.num_rows
    looked = rng.random(n) < 1 / 3
    label = table.column("target_argmax_match").to_numpy(zero_copy_only=False).astype(float)
    cols = {name: table.column(name) for name in table.column_names}
    cols["source"] = pa.array(np.where(looked, "lookup", "draft").tolist(), pa.string())
    cols["lookup_prob"] = pa.array(np.where(looked, np.clip(0.7 * label + 0.3 * rng.random(n), 0, 1), np.nan),
                                   pa.float32())
    cols["lookup_count"] = pa.array(np.where(looked, 1 + rng.integers(0, 4, n), 0), pa.int32())
    cols["match_len"] = pa.array(np.where(looked, 1 + rng.integers(0, 4, n), 0), pa.int16())
    draft_lp = table.column("draft_logprob").to_numpy(zero_copy_only=False)
    cols["draft_logprob"] = pa.array(np.where(looked, np.nan, draft_lp), pa.float32())
    return pa.table(cols, schema=table.schema)


def test_evaluation_reports_each_source_and_the_source_features() -> None:
    logs = _with_lookup_nodes(make_synthetic_logs(SyntheticSpec(prompts_per_domain=30, seed=2)))
    model = train(logs, PredictorConfig())
    report = evaluate(model, logs, latency_calls=0)
    per_source = report.model.per_source
    assert set(per_source) == {"draft", "lookup"}
    assert per_source["lookup"].auc > 0.9  # lookup_prob carries the label of lookup nodes
    assert all(math.isfinite(m.ece) for m in per_source.values())
    assert report.importance_gain["lookup_prob"] > 0
    out = report.to_dict()
    assert set(out["per_source"]) == {"draft", "lookup"}
    # Baselines score a node the draft never saw as draft probability 0, not NaN.
    assert math.isfinite(report.baselines["draft_prob"].overall.auc)
    blind = train(logs, PredictorConfig(features=[f for f in PredictorConfig().features if f not in (
        "source", "lookup_prob", "lookup_count", "match_len")]))
    assert evaluate(blind, logs, latency_calls=0).model.per_source["lookup"].auc < per_source["lookup"].auc - 0.05
