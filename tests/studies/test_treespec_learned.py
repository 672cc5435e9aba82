"""The ``learned`` tree spec reads another budgets file when given one, and names a missing one."""

import json

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


def test_learned_spec_reads_the_predictor_folder_it_is_given(tmp_path) -> None:
    import shutil

    from treewise.controller.pairs import pair_files

    other = tmp_path / "other-predictor"
    shutil.copytree(pair_files("micro").predictor, other)
    calibration = json.loads((other / "calibration.json").read_text())
    calibration["y"] = [min(1.0, y * 0.5 + 0.25) for y in calibration["y"]]  # a map the shipped one is not
    (other / "calibration.json").write_text(json.dumps(calibration))
    policy = parse_tree_spec(f"learned:predictor={other}").build(pair="micro")
    default = parse_tree_spec("learned").build(pair="micro")
    assert policy.predictor.feature_names == default.predictor.feature_names
    assert list(policy.predictor.isotonic[1]) == calibration["y"]
    assert list(default.predictor.isotonic[1]) != calibration["y"]
    with pytest.raises(TreeSpecError, match="missing"):
        parse_tree_spec(f"learned:predictor={tmp_path / 'missing'}").build(pair="micro")
