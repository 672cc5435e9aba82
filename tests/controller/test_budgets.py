"""Budgets file: round trip, built-in defaults, and errors that name the file, the field and the fix."""

import json

import pytest

from treewise.controller.budgets import (
    BudgetError,
    BudgetsFile,
    DomainBudget,
    Provenance,
    load_budgets,
    save_budgets,
)
from treewise.decoder import TreewiseError


def _write(tmp_path, data) -> object:
    path = tmp_path / "budgets.json"
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


def test_round_trip(tmp_path) -> None:
    budgets = BudgetsFile(
        default=DomainBudget(node_budget=24),
        domains={"code": DomainBudget(policy="confidence", node_budget=64, max_depth=8, threshold=0.1),
                 "dialogue": DomainBudget(policy="static", max_width=2, cost_scale=0.0)},
        provenance=Provenance(command="treewise tune --trials 5", trials=5, wall_s=12.5,
                              created="2026-11-29T12:00:00Z", study_name="s1", storage=None),
    )
    path = save_budgets(budgets, tmp_path / "sub" / "budgets.json")
    assert load_budgets(path) == budgets
    assert not [p for p in path.parent.iterdir() if p.name != "budgets.json"]  # no temp file left behind
    assert path.stat().st_mode & 0o777 == 0o644


def test_missing_default_file_gives_builtin_defaults(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path))
    budgets = load_budgets()
    assert budgets.provenance is None and budgets.domains == {}
    assert budgets.default == DomainBudget()


def test_default_file_is_read_when_present(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path))
    _write(tmp_path, {"version": 1, "default": {"node_budget": 7}})
    assert load_budgets().default.node_budget == 7


def test_for_domain_falls_back_to_default() -> None:
    budgets = BudgetsFile(default=DomainBudget(node_budget=10), domains={"math": DomainBudget(node_budget=50)})
    assert budgets.for_domain("math").node_budget == 50
    assert budgets.for_domain("poetry").node_budget == 10
    assert budgets.for_domain("auto").node_budget == 10


@pytest.mark.parametrize(
    ("data", "needles"),
    [
        ({"default": {"node_budget": -3}}, ["default.node_budget", "-3", "1..1024"]),
        ({"default": {}, "domains": {"code": {"max_depth": 99}}}, ["domains.code.max_depth", "99", "1..32"]),
        ({"default": {"nodes": 8}}, ["default.nodes", "remove it", "node_budget"]),
        ({"default": {}, "extra": 1}, ["'extra'", "remove it", "domains"]),
        ({"version": 2, "default": {}}, ["'version'", "version 1"]),
        ({"default": {"policy": "greedy"}}, ["default.policy", "'greedy'"]),
        ({"domains": {}}, ["'default'", "add it"]),
        ("{not json", ["not valid JSON", "line 1"]),
        ("[1, 2]", ["not an object"]),
    ],
)
def test_invalid_files_name_file_and_field(tmp_path, data, needles) -> None:
    path = _write(tmp_path, data)
    with pytest.raises(BudgetError) as info:
        load_budgets(path)
    message = str(info.value)
    assert str(path) in message
    for needle in needles:
        assert needle in message, message


def test_missing_explicit_file_is_an_error(tmp_path) -> None:
    path = tmp_path / "nope.json"
    with pytest.raises(BudgetError, match="not found") as info:
        load_budgets(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, TreewiseError) and isinstance(info.value, ValueError)


def test_domain_budget_is_frozen() -> None:
    budget = DomainBudget()
    with pytest.raises(ValueError):
        budget.node_budget = 5  # type: ignore[misc]


def test_budgeted_default_loads_a_predictor_only_when_a_budget_names_learned(tmp_path, monkeypatch) -> None:
    from treewise.controller import BudgetedTree

    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path))  # no predictor folder here
    static = {"policy": "static", "node_budget": 4, "max_depth": 1, "max_width": 4}
    (tmp_path / "budgets.json").write_text(json.dumps({"version": 1, "default": static}))
    tree = BudgetedTree.default(pair="micro")
    assert tree.predictor is None and tree.budgets.default.policy == "static"
    learned = dict(static, policy="learned")
    (tmp_path / "budgets.json").write_text(json.dumps({"version": 1, "default": static,
                                                       "domains": {"code": learned}}))
    with pytest.raises(TreewiseError, match="model.txt is missing"):
        BudgetedTree.default(pair="micro")
