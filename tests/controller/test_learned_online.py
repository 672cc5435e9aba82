"""LearnedTree's request-context features and per-request correction, on a real decode of a tiny pair."""

from collections.abc import Mapping

import numpy as np
import pytest
from conftest import make_model

from treewise.controller import BudgetsFile, DomainBudget, LearnedTree
from treewise.decoder import NodeLogWriter, TreeDecoder
from treewise.decoder.records.nodelog import read_node_logs
from treewise.predictor.derived import DERIVED_COLUMNS, derived_columns
from treewise.predictor.features import _np, conditional_mask, request_keys
from treewise.predictor.online import OnlineConfig

CONTEXT = ["running_accept_rate", "prev_accepted", *DERIVED_COLUMNS]


class Recorder:
    """Draft probability scaled by ``scale`` (0.3: deliberately underconfident); keeps every feature batch."""

    feature_names = ["draft_logprob", "depth", *CONTEXT]

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale
        self.batches: list[dict[str, np.ndarray]] = []

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        assert set(features) == set(self.feature_names)
        self.batches.append({k: np.asarray(v).copy() for k, v in features.items()})
        return self.scale * np.exp(features["draft_logprob"].astype(np.float64))


@pytest.fixture(scope="module")
def agreeing(tokenizer) -> TreeDecoder:
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None
    return TreeDecoder(target, make_model("llama", 0, layers=2), tokenizer)  # the target's own weights: all accepted


@pytest.fixture(scope="module")
def disagreeing(tokenizer) -> TreeDecoder:
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None
    return TreeDecoder(target, make_model("llama", 1, layers=1), tokenizer)  # an unrelated draft: few accepted


def _policy(predictor: Recorder, online: OnlineConfig | None = OnlineConfig(), threshold: float = 0.01) -> LearnedTree:
    budget = DomainBudget(node_budget=12, max_depth=4, max_width=3, threshold=threshold, cost_scale=0.0)
    return LearnedTree(predictor, BudgetsFile(default=budget), online=online)


@pytest.mark.parametrize("pair", ["agreeing", "disagreeing"])
def test_runtime_context_features_equal_the_ones_training_derives_from_logs(pair, request, tmp_path) -> None:
    dec = request.getfixturevalue(pair)
    recorder = Recorder()
    log = NodeLogWriter(tmp_path / "nodes")
    for i, prompt in enumerate(("hello tree", "def f(x):")):
        dec.generate(prompt, max_new_tokens=40, tree=_policy(recorder), prompt_id=f"p{i}", log=log)
    log.close()
    table = read_node_logs(tmp_path / "nodes")
    table = table.sort_by([("prompt_id", "ascending"), ("step", "ascending"), ("node_id", "ascending")])
    request = request_keys(table)
    cols = {n: _np(table, n) for n in ("step", "node_id", "parent_id", "draft_margin", "draft_entropy",
                                       "on_accepted_path", "verified")}
    offline = derived_columns(cols, request, conditional_mask(table, request))
    runtime = {k: np.concatenate([b[k] for b in recorder.batches]) for k in CONTEXT}
    assert len(runtime["recent_accepted"]) == table.num_rows  # one feature row per logged candidate
    assert np.isfinite(offline["recent_accepted"]).any() and np.isfinite(offline["parent_margin"]).any()
    for name in DERIVED_COLUMNS:
        np.testing.assert_array_equal(runtime[name], offline[name], err_msg=name)
    for name in ("running_accept_rate", "prev_accepted"):
        np.testing.assert_array_equal(runtime[name], _np(table, name), err_msg=name)


def test_correction_learns_from_every_drafted_step_and_stays_lossless(agreeing) -> None:
    prompt = "hello tree"
    greedy = agreeing.generate_plain(prompt, max_new_tokens=40).token_ids
    policy = _policy(Recorder(scale=0.3))  # underconfident: the correction should raise it
    out = agreeing.generate(prompt, max_new_tokens=40, tree=policy)
    assert out.token_ids == greedy
    drafted = [s for s in out.stats.steps if s.verified > 0]
    assert policy._calibrator.rows >= sum(1 for _ in drafted)  # no step's update was skipped
    assert policy._calibrator.offset > 0  # the draft mostly agrees: acceptance is above 0.3 x draft prob
    corrected = policy._calibrator(np.array([0.1, 0.2, 0.3]))
    assert np.all(corrected > np.array([0.1, 0.2, 0.3]))


def test_without_online_the_predictor_is_used_as_is(agreeing) -> None:
    plain, corrected = Recorder(scale=0.3), Recorder(scale=0.3)
    a = agreeing.generate("hello tree", max_new_tokens=30, tree=_policy(plain, online=None))
    b = agreeing.generate("hello tree", max_new_tokens=30, tree=_policy(corrected))
    assert a.token_ids == b.token_ids
    # Same first step (the correction starts at the identity), then the corrected policy, which has learned
    # that 0.3 x draft prob underrates this draft (here the target itself), keeps more nodes over the threshold.
    assert a.stats.steps[0].verified == b.stats.steps[0].verified
    assert sum(s.verified for s in b.stats.steps) > sum(s.verified for s in a.stats.steps)
