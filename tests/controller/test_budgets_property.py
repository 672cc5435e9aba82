"""Property-based tests (hypothesis) of budgets files: any file content loads or raises BudgetError naming
the file (never a traceback from json, pydantic or a decoder), and every valid budgets file round-trips."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treewise.controller.budgets import BudgetError, BudgetsFile, DomainBudget, load_budgets, save_budgets

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10, 2000), st.floats(allow_nan=False),
                    st.text(max_size=10), st.sampled_from(["static", "confidence", "learned"]))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.sampled_from(["version", "default", "domains", "provenance", "policy", "node_budget",
                                     "max_depth", "max_width", "threshold", "cost_scale", "code", "extra"]),
                    inner, max_size=5)), max_leaves=12)


def _load(content: bytes) -> BudgetsFile:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "budgets.json"
        path.write_bytes(content)
        try:
            return load_budgets(path)
        except BudgetError as err:
            assert str(err).startswith(str(path)), err
            raise


@FAST
@given(st.one_of(json_values.map(lambda v: json.dumps(v).encode()), st.binary(max_size=40)))
def test_any_content_loads_or_names_the_file(content: bytes) -> None:
    try:
        budgets = _load(content)
    except BudgetError:
        return
    assert isinstance(budgets, BudgetsFile)


budget = st.builds(DomainBudget, policy=st.sampled_from(["static", "confidence", "learned"]),
                   node_budget=st.integers(1, 1024), max_depth=st.integers(1, 32), max_width=st.integers(1, 32),
                   threshold=st.floats(0.0, 1.0), cost_scale=st.floats(0.0, 10.0))


@FAST
@given(budget, st.dictionaries(st.text(min_size=1, max_size=10), budget, max_size=4))
def test_valid_budgets_round_trip(default: DomainBudget, domains: dict[str, DomainBudget]) -> None:
    budgets = BudgetsFile(default=default, domains=domains)
    with tempfile.TemporaryDirectory() as tmp:
        assert load_budgets(save_budgets(budgets, Path(tmp) / "b.json")) == budgets
    for name, b in domains.items():
        assert budgets.for_domain(name) == b
