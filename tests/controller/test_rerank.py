"""LearnedRerank: the TreePolicy contract (valid trees within budget, lossless decoding) and its selection."""

from collections.abc import Mapping

import numpy as np
import pytest
from conftest import make_model
from test_policies import DraftProbPredictor, OraclePredictor

from treewise.controller import ConfidenceTree, LearnedRerank
from treewise.decoder import TreeDecoder, TreePolicy
from treewise.predictor.online import OnlineConfig


class Constant:
    """Every candidate equally likely: all path values tie."""

    feature_names = ["depth"]

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.full(len(features["depth"]), 0.5)


@pytest.fixture(scope="module")
def dec(tokenizer):
    return TreeDecoder(make_model("llama", 0), make_model("llama", 1, layers=1), tokenizer)


@pytest.mark.parametrize("online", [True, False])
def test_rerank_contract_and_lossless(dec, online: bool) -> None:
    policy = LearnedRerank(DraftProbPredictor(), budget=6, max_depth=4, top_k=3,
                           online=OnlineConfig() if online else None)
    assert isinstance(policy, TreePolicy)
    for prompt in ("def f(x):", "hello world", "12 + 7 ="):
        ref = dec.generate_plain(prompt, max_new_tokens=24)
        out = dec.generate(prompt, max_new_tokens=24, tree=policy, domain="code")
        assert out.token_ids == ref.token_ids  # greedy output == the target's own greedy output
        for s in out.stats.steps:
            assert 0 <= s.accepted <= s.verified <= 6
            assert s.accepted <= 4 and s.verified <= s.drafted
        if online:
            assert policy._calibrator.rows > 0  # the per-request correction learned from the verified nodes
    out = dec.generate("abc", max_new_tokens=10, tree=policy, temperature=1.0, seed=1)
    assert len(out.token_ids) == 10 or out.finish_reason == "eos"


def test_rerank_drafts_the_confidence_tree_and_fills_the_budget(dec) -> None:
    """Same candidates as ConfidenceTree (drafted per step equal), exactly min(budget, drafted) verified even
    when every value ties (the tie-break keeps parents first, so the decoder cuts nothing)."""
    conf = dec.generate("abc", max_new_tokens=20, tree=ConfidenceTree(budget=5, max_depth=3, top_k=3))
    tied = dec.generate("abc", max_new_tokens=20, tree=LearnedRerank(Constant(), budget=5, max_depth=3, top_k=3))
    assert tied.token_ids == conf.token_ids
    assert tied.stats.steps[0].drafted == conf.stats.steps[0].drafted == 3 + 9 + 9
    for s in tied.stats.steps:
        assert s.verified == min(5, s.drafted)


def test_rerank_by_draft_probability_is_the_confidence_tree(dec) -> None:
    """With the draft's own probability as the predictor and no correction, the path value is the draft path
    probability: the selection, hence every step, equals EAGLE-2's."""
    conf = dec.generate("hello world", max_new_tokens=24, tree=ConfidenceTree(budget=6, max_depth=4, top_k=3))
    same = dec.generate("hello world", max_new_tokens=24,
                        tree=LearnedRerank(DraftProbPredictor(), budget=6, max_depth=4, top_k=3, online=None))
    assert [(s.drafted, s.verified, s.accepted) for s in same.stats.steps] == \
           [(s.drafted, s.verified, s.accepted) for s in conf.stats.steps]


def test_rerank_with_an_oracle_beats_the_confidence_tree(tokenizer) -> None:
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None
    dec = TreeDecoder(target, make_model("llama", 1, layers=1), tokenizer)
    prompt = "hello tree"
    greedy = dec.generate_plain(prompt, max_new_tokens=40).token_ids
    conf = dec.generate(prompt, max_new_tokens=40, tree=ConfidenceTree(budget=4, max_depth=5, top_k=4))
    oracle = dec.generate(prompt, max_new_tokens=40,
                          tree=LearnedRerank(OraclePredictor(greedy), budget=4, max_depth=5, top_k=4, online=None))
    assert oracle.token_ids == conf.token_ids == greedy
    assert oracle.stats.tau >= conf.stats.tau
    for s in oracle.stats.steps:  # whatever of the greedy path was drafted is verified, hence accepted
        assert s.accepted <= s.verified <= 4


def test_rerank_checks_its_sizes() -> None:
    from treewise.decoder import TreewiseError

    with pytest.raises(TreewiseError):
        LearnedRerank(DraftProbPredictor(), budget=0)
