"""The ``learned`` tree spec reads another budgets file when given one, and names a missing one."""

import pytest

from treewise.controller import BudgetsFile, DomainBudget, save_budgets
from treewise.studies.shared.treespec import TreeSpecError, parse_tree_spec


def test_learned_spec_reads_the_budgets_file_it_is_given(tmp_path) -> None:
    file = tmp_path / "budgets.json"
    tuned = DomainBudget(policy="learned", node_budget=7, max_depth=3, max_width=2, threshold=0.05)
    save_budgets(BudgetsFile(default=DomainBudget(policy="learned"), domains={"code": tuned}), file)
    policy = parse_tree_spec(f"learned:budgets={file}").build()
    assert policy.budgets.for_domain("code") == tuned
    # a budget field given with it still overrides every domain
    capped = parse_tree_spec(f"learned:budgets={file},node_budget=3").build()
    assert capped.budgets.for_domain("code").node_budget == 3


def test_learned_spec_names_a_missing_budgets_file(tmp_path) -> None:
    with pytest.raises(TreeSpecError, match="nope.json: budgets file not found"):
        parse_tree_spec(f"learned:budgets={tmp_path / 'nope.json'}").build()
