"""``treewise profile``: stages that add up to the step, the predictor timed apart from its policy, JSON."""

import json

import pytest
from conftest import DraftProb, make_model, write_suite

from treewise.controller import BudgetsFile, DomainBudget, LearnedTree
from treewise.decoder import TreeDecoder
from treewise.studies.bench.profile import (
    STAGES,
    _Row,
    _rows,
    _summary,
    _TimedMatrixPredictor,
    _TimedPredictor,
    run_profile,
)
from treewise.studies.shared.config import ProfileConfig


@pytest.fixture(scope="module")
def dec(tokenizer) -> TreeDecoder:
    return TreeDecoder(make_model("llama", 0), make_model("llama", 0, layers=1), tokenizer)


def test_profile_stages_add_up_and_serialise(dec, tmp_path) -> None:
    cfg = ProfileConfig(suite=write_suite(tmp_path), per_domain=1, max_new_tokens=16,
                        trees={"static": "static:width=2,depth=2", "chain": "chain:length=3"})
    result = run_profile(cfg, dec)
    assert result.prompts == 2 and set(result.policies) == {"static", "chain"}
    for p in result.policies.values():
        assert list(p.stages) == list(STAGES)
        assert sum(s.ms_per_step for s in p.stages.values()) == pytest.approx(p.ms_per_step, rel=1e-6)
        assert sum(s.share for s in p.stages.values()) == pytest.approx(1.0, abs=1e-6)
        assert p.stages["predictor"].ms_per_step == 0.0  # no predictor in these policies
        assert p.stages["target_model"].ms_per_step > 0 and p.stages["draft_model"].ms_per_step > 0
        assert 0 < p.outside_forwards_share < 1 and p.tau >= 1 and p.steps > 0
    again = json.loads(result.model_dump_json())
    assert again["policies"]["static"]["stages"]["masks"]["share"] >= 0


def test_predictor_time_is_split_out_of_the_policy(dec, tmp_path) -> None:
    policy = LearnedTree(DraftProb(), BudgetsFile(default=DomainBudget(node_budget=6, max_depth=3, threshold=0.0,
                                                                       cost_scale=0.0)))
    timer = _TimedPredictor(policy.predictor)
    policy.predictor = timer
    row = _Row("learned", lambda p: dec.generate(p, 16, tree=policy), timer, [])
    row.results.append(row.run("hello tree"))
    s = _summary(row)
    assert timer.calls > 0 and timer.seconds > 0
    policy_s = sum(st.policy_s for st in row.results[0].stats.steps)
    assert s.stages["predictor"].ms_per_step * s.steps == pytest.approx(1000 * timer.seconds)
    assert (s.stages["policy"].ms_per_step + s.stages["predictor"].ms_per_step) * s.steps == pytest.approx(
        1000 * policy_s)


def test_rows_wrap_only_policies_with_a_predictor(dec) -> None:
    rows = _rows(dec, ProfileConfig(trees={"static": "static:width=2,depth=2"}))
    assert rows["static"].timer is None


@pytest.mark.parametrize("native", [False, True])
def test_the_shipped_learned_tree_keeps_its_path_under_the_timer(dec, native: bool) -> None:
    """The timer wraps ``predict_prefix`` too and must not change the path: the Python level still scores encoded
    rows (those calls are counted); the native level still finds the forest's arrays through the wrapper."""
    assert isinstance(_rows(dec, ProfileConfig(trees={"learned": "learned"}))["learned"].timer, _TimedMatrixPredictor)
    policy = LearnedTree.default()
    policy.native = native
    timer = _TimedMatrixPredictor(policy.predictor)
    policy.predictor = timer
    dec.generate("hello tree", 16, tree=policy)
    if native and policy.predictor.backend == "numba":
        assert policy.native_level and timer.calls == 0  # the forest ran inside the level's native call
        row = _Row("learned", lambda p: dec.generate(p, 8, tree=policy), timer, [], policy)
        row.results.append(row.run("hello"))
        assert _summary(row).predictor_backend == "numba in the native level"
    else:
        assert not policy.native_level and timer.calls > 0 and timer.seconds > 0


def test_forest_bench_times_both_evaluators_and_names_a_missing_model(tmp_path) -> None:
    from treewise.decoder.errors import TreewiseError
    from treewise.decoder.paths import data_dir
    from treewise.predictor.forest import compiled_predict
    from treewise.studies.bench.forest import time_forest

    result = time_forest(data_dir() / "predictor", rows=(3, 5), calls=2)
    assert [t.rows for t in result.timings] == [3, 5] and result.trees > 0 and result.nodes > result.trees
    for t in result.timings:
        assert t.lightgbm_us > 0 and (t.numba_us is None) == (compiled_predict() is None)
    with pytest.raises(TreewiseError, match="--model"):
        time_forest(tmp_path, calls=1)


def test_split_rows_send_rows_both_ways_at_the_root() -> None:
    import lightgbm as lgb
    import numpy as np

    from treewise.decoder.paths import data_dir
    from treewise.predictor.forest import FEATURE, ForestArrays
    from treewise.studies.bench.forest import split_rows

    booster = lgb.Booster(model_file=str(data_dir() / "predictor" / "model.txt"))
    forest = ForestArrays.from_booster(booster)
    x = split_rows(forest, booster.num_feature(), 400, np.random.default_rng(1))
    root = forest.roots[0]
    f, threshold = forest.nodes[root, FEATURE], forest.values[root, 0]
    assert (x[:, f] <= threshold).any() and (x[:, f] > threshold).any()
