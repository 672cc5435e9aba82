"""treewise.load: one call loads a named pair (or the user's own) with its shipped policy, and generate() without
tree= decodes with it; the result names the policy that ran. On the micro pair (the real one is fetched)."""

from __future__ import annotations

from pathlib import Path

import pytest

import treewise
from treewise import Chain, ConfidenceTree, StaticTree, TreewiseError
from treewise.controller import BudgetedTree
from treewise.studies.shared.pairs import _policy
from treewise.studies.shared.paths import PAIR_NAMES, PAIR_POLICIES

MODELS = Path(treewise.data_dir()) / "models"
PROMPT = "def fib(n):"


@pytest.fixture(scope="module")
def micro() -> treewise.TreeDecoder:
    return treewise.load(pair="micro", device="cpu")


def test_a_named_pair_decodes_with_its_shipped_policy_by_default(micro: treewise.TreeDecoder) -> None:
    assert micro.default_policy == StaticTree(width=2, depth=3) and micro.default_domain == "auto"
    out = micro.generate(PROMPT, max_new_tokens=24)
    assert out.policy == PAIR_POLICIES["micro"] == "static:width=2,depth=3"
    assert out.stats.tau > 1.0  # the shipped tree drafted and had tokens accepted
    assert out.token_ids == micro.generate_plain(PROMPT, max_new_tokens=24).token_ids


def test_tree_overrides_the_default_and_the_result_names_it(micro: treewise.TreeDecoder) -> None:
    out = micro.generate(PROMPT, max_new_tokens=16, tree=Chain(length=2))
    assert out.policy == "Chain"
    assert max(s.verified for s in out.stats.steps) == 2  # the chain ran, not the default tree
    assert micro.generate_plain(PROMPT, max_new_tokens=4).policy == "plain"


def test_generate_batch_uses_the_default_policy(micro: treewise.TreeDecoder) -> None:
    prompts = [PROMPT, "The capital of France is"]
    rows = micro.generate_batch(prompts, max_new_tokens=16)
    assert [r.policy for r in rows] == [PAIR_POLICIES["micro"]] * 2
    assert max(s.verified for r in rows for s in r.stats.steps) > 3  # StaticTree(2, 3) nodes, not a chain
    assert [r.token_ids for r in rows] == [micro.generate_plain(p, max_new_tokens=16).token_ids for p in prompts]


def test_a_pair_of_your_own_gets_the_confidence_tree() -> None:
    dec = treewise.load(target=MODELS / "target", draft=MODELS / "draft", device="cpu")
    assert isinstance(dec.default_policy, ConfidenceTree) and dec.default_domain == "unknown"
    out = dec.generate(PROMPT, max_new_tokens=16)
    assert out.policy == "confidence"
    assert out.token_ids == dec.generate_plain(PROMPT, max_new_tokens=16).token_ids


def test_a_given_policy_spec_or_instance_replaces_the_shipped_one() -> None:
    dec = treewise.load(pair="micro", policy="chain:length=3", device="cpu")
    assert dec.default_policy == Chain(length=3) and dec.generate(PROMPT, max_new_tokens=8).policy == "chain:length=3"
    assert _policy(StaticTree(3, 2), "budgeted", "micro") == (None, StaticTree(3, 2))


def test_the_real_pairs_shipped_policy_is_its_budgets() -> None:
    spec, tree = _policy(None, PAIR_POLICIES["smollm2"], "smollm2")
    assert spec == "budgeted" and isinstance(tree, BudgetedTree)
    assert set(PAIR_POLICIES) == set(PAIR_NAMES)


def test_an_unknown_pair_names_the_choices() -> None:
    with pytest.raises(TreewiseError, match="unknown model pair 'nope': choose one of smollm2, micro"):
        treewise.load(pair="nope")


def test_a_missing_folder_says_so(tmp_path: Path) -> None:
    with pytest.raises(TreewiseError, match="does not exist"):
        treewise.load(target=tmp_path / "no-target", draft=MODELS / "draft")
    with pytest.raises(TreewiseError, match="does not exist"):
        treewise.load(pair="micro", draft=tmp_path / "no-draft")


def test_a_bad_policy_spec_fails_before_the_models_load(tmp_path: Path) -> None:
    with pytest.raises(TreewiseError, match="width"):
        treewise.load(pair="micro", target=tmp_path / "never-loaded", policy="static:width=0,depth=2")
