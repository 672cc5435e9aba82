"""One contract suite for every TreePolicy: valid trees within budget, lossless decoding; plus policy specifics."""

from collections.abc import Mapping

import numpy as np
import pytest
import torch
from conftest import make_model

from treewise.controller import (
    BudgetedTree,
    BudgetsFile,
    ConfidenceTree,
    DomainBudget,
    DynamicChain,
    Hybrid,
    LatencyProfile,
    LearnedTree,
)
from treewise.controller.learned import AcceptanceModel
from treewise.controller.policies import refit_threshold
from treewise.decoder import Chain, LookupConfig, NoDraft, StaticTree, SuffixStore, TreeDecoder, TreePolicy


class DraftProbPredictor:
    """A stand-in predictor: the draft's own probability of the token (what EAGLE-2 trusts)."""

    feature_names = ["draft_logprob", "depth", "token_type", "domain"]

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        assert set(features) == set(self.feature_names)
        return np.exp(features["draft_logprob"].astype(np.float64))


class OraclePredictor:
    """Knows the target's greedy continuation: 1 for the right token at each output position, else 0."""

    feature_names = ["token_id", "position"]

    def __init__(self, greedy: list[int]) -> None:
        self.greedy = greedy

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        pos = features["position"]
        right = np.array([self.greedy[p] if p < len(self.greedy) else -1 for p in pos])
        return (features["token_id"] == right).astype(np.float64)


def _learned(**budget) -> LearnedTree:
    return LearnedTree(DraftProbPredictor(), BudgetsFile(default=DomainBudget(**budget)))


POLICIES = {
    "static": lambda: StaticTree(2, 3),
    "chain": lambda: Chain(3),
    "none": lambda: NoDraft(),
    "confidence": lambda: ConfidenceTree(budget=6, max_depth=4, top_k=3),
    "dynamic_chain": lambda: DynamicChain(max_length=5, threshold=0.2),
    "learned": lambda: _learned(node_budget=7, max_depth=4, max_width=3, threshold=0.01, cost_scale=0.0),
    "learned_latency": lambda: LearnedTree(DraftProbPredictor(), BudgetsFile(default=DomainBudget(node_budget=10)),
                                           LatencyProfile.flat(1.0, 0.3, 0.05)),
    "budgeted": lambda: BudgetedTree(BudgetsFile(
        default=DomainBudget(policy="confidence", node_budget=6, max_depth=4, max_width=3),
        domains={"code": DomainBudget(policy="static", node_budget=6, max_width=2, max_depth=3)}),
        DraftProbPredictor()),
    "lookup": lambda: Hybrid(NoDraft(), _LOOK, min_value=0.0),
    "hybrid": lambda: Hybrid(_learned(node_budget=7, max_depth=4, max_width=3, threshold=0.01, cost_scale=0.0),
                             _LOOK, SuffixStore(_LOOK), min_value=0.0, skip_gain=1.0),
}
_LOOK = LookupConfig(max_nodes=6, max_depth=5)
BUDGET = {"none": 0, "static": 14, "chain": 3, "confidence": 6, "dynamic_chain": 5, "learned": 7, "learned_latency": 10,
          "budgeted": 6, "lookup": 6, "hybrid": 13}
DEPTH = {"none": 0, "static": 3, "chain": 3, "confidence": 4, "dynamic_chain": 5, "learned": 4, "learned_latency": 6,
         "budgeted": 4, "lookup": 5, "hybrid": 5}


@pytest.fixture(scope="module")
def dec(tokenizer):
    return TreeDecoder(make_model("llama", 0), make_model("llama", 1, layers=1), tokenizer)


@pytest.mark.parametrize("name", list(POLICIES))
def test_policy_contract(dec, name: str) -> None:
    policy = POLICIES[name]()
    assert isinstance(policy, TreePolicy)
    for prompt in ("def f(x):", "hello world", "12 + 7 ="):
        ref = dec.generate_plain(prompt, max_new_tokens=24)
        out = dec.generate(prompt, max_new_tokens=24, tree=policy, domain="code")
        assert out.token_ids == ref.token_ids  # lossless whatever the policy
        for s in out.stats.steps:
            assert 0 <= s.accepted <= s.verified <= BUDGET[name]
            assert s.accepted <= DEPTH[name]
            assert s.verified <= s.drafted
    # sampling stays valid (exactness is the decoder's; here: no crash, tokens in range)
    out = dec.generate("abc", max_new_tokens=10, tree=policy, temperature=1.0, seed=1)
    assert len(out.token_ids) == 10 or out.finish_reason == "eos"


def test_learned_with_oracle_keeps_exactly_the_accepted_path(tokenizer) -> None:
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None  # long outputs: many steps to check
    dec = TreeDecoder(target, make_model("llama", 0, layers=2), tokenizer)  # a draft that agrees: deep paths
    prompt = "hello tree"
    greedy = dec.generate_plain(prompt, max_new_tokens=40).token_ids
    policy = LearnedTree(OraclePredictor(greedy), BudgetsFile(default=DomainBudget(
        node_budget=32, max_depth=5, max_width=4, threshold=0.5, cost_scale=0.0)))
    out = dec.generate(prompt, max_new_tokens=40, tree=policy)
    assert out.token_ids == greedy
    for s in out.stats.steps:
        assert s.verified == s.accepted  # every verified node is accepted, nothing else is verified
    assert out.stats.tau == pytest.approx(6.0, abs=0.5)  # the whole path of depth 5 every step
    assert all(s.drafted == 4 * 5 for s in out.stats.steps[:-2])  # only the right node was expanded


def test_learned_skips_drafting_when_acceptance_is_hopeless(dec) -> None:
    class Never(DraftProbPredictor):
        def predict_batch(self, features):
            return np.zeros(len(features["depth"]))

    slow_draft = LatencyProfile.flat(target_ms=1.0, draft_ms=0.9)
    policy = LearnedTree(Never(), BudgetsFile(default=DomainBudget()), slow_draft, probe_every=1000)
    out = dec.generate("abc", max_new_tokens=20, tree=policy)
    drafted_steps = [s for s in out.stats.steps if s.draft_forwards > 0]
    assert len(drafted_steps) <= 2  # the first steps run on the prior, then the request drafts nothing
    assert all(s.draft_forwards == 0 for s in out.stats.steps[3:])


def test_learned_probes_back_off_while_they_do_not_pay(dec) -> None:
    class Never(DraftProbPredictor):
        def predict_batch(self, features):
            return np.zeros(len(features["depth"]))

    policy = LearnedTree(Never(), BudgetsFile(default=DomainBudget()), LatencyProfile.flat(target_ms=1.0, draft_ms=0.9),
                         probe_every=2, probe_max=8, measured=False)
    out = dec.generate("abc", max_new_tokens=60, tree=policy)
    drafted = [i for i, s in enumerate(out.stats.steps) if s.draft_forwards > 0]
    gaps = [b - a - 1 for a, b in zip(drafted, drafted[1:], strict=False)]  # plain steps between probes
    assert drafted[0] == 0 and gaps[:4] == [2, 4, 8, 8], gaps


def test_learned_resolves_auto_domain(dec) -> None:
    class Fixed:
        def resolve(self, domain: str, text: str) -> str:
            return "math" if "=" in text else "dialogue"

    budgets = BudgetsFile(default=DomainBudget(), domains={"math": DomainBudget(max_depth=2)})
    policy = LearnedTree(DraftProbPredictor(), budgets, None, Fixed())
    dec.generate("1 + 1 =", max_new_tokens=4, tree=policy, domain="auto")
    assert policy.domain == "math" and policy.budget.max_depth == 2


def test_confidence_keeps_best_budget_by_path_prob(dec) -> None:
    out = dec.generate("abc", max_new_tokens=16, tree=ConfidenceTree(budget=5, max_depth=3, top_k=3))
    full = [s for s in out.stats.steps if s.drafted == 3 + 9 + 9]  # steps not cut short by max_new_tokens
    assert len(full) >= 8 and all(s.verified == 5 for s in full)
    assert all(s.verified <= 5 for s in out.stats.steps)


def test_refit_threshold_separates_classes() -> None:
    probs = np.array([0.9, 0.8, 0.85, 0.3, 0.2, 0.1, 0.7])
    matches = np.array([1, 1, 1, 0, 0, 0, 1])
    assert 0.3 < refit_threshold(probs, matches) <= 0.7
    chain = DynamicChain(max_length=6, threshold=0.4)
    chain.start(None)
    assert chain.current_threshold == 0.4


def test_real_predictor_satisfies_the_protocol(tmp_path) -> None:
    from treewise.predictor import PredictorConfig, train
    from treewise.predictor.synthetic import make_synthetic_logs

    model = train(make_synthetic_logs(), PredictorConfig(num_boost_round=30))
    assert isinstance(model, AcceptanceModel)
    policy = LearnedTree(model, BudgetsFile(default=DomainBudget()))
    from treewise.decoder import Frontier
    f = Frontier.of(depth=1, step=0, position=0, prompt_len=5, domain="code", temperature=0.0, tree_size=0,
                 max_depth=4, tokens=torch.tensor([5, 6]), parent=torch.tensor([-1, -1]),
                 sibling_rank=torch.tensor([0, 1]), draft_logprob=torch.log(torch.tensor([0.6, 0.3])),
                 draft_entropy=torch.ones(2), draft_margin=torch.tensor([0.3, 0.3]),
                 path_logprob=torch.log(torch.tensor([0.6, 0.3])), parent_draft_prob=torch.ones(2))
    policy.start(type("R", (), {"domain": "code", "prompt": ""})())
    policy._plan_root(f)
    plan = policy.plan(f)
    assert plan.keep.dtype == np.bool_ and plan.keep.shape == (2,)


def test_budgeted_tree_picks_family_per_domain(dec) -> None:
    budgets = BudgetsFile(default=DomainBudget(policy="learned"),
                          domains={"code": DomainBudget(policy="static", node_budget=6, max_width=2, max_depth=3),
                                   "math": DomainBudget(policy="confidence", node_budget=5)})
    policy = BudgetedTree(budgets, DraftProbPredictor())
    for domain, kind in (("code", StaticTree), ("math", ConfidenceTree), ("other", LearnedTree)):
        dec.generate("x = 1", max_new_tokens=4, tree=policy, domain=domain)
        assert isinstance(policy._active, kind)
    with pytest.raises(ValueError, match="predictor"):
        BudgetedTree(budgets).start(type("R", (), {"domain": "other", "prompt": ""})())
