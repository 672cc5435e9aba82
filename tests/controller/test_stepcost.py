"""MeasuredCosts with a scripted clock, and LearnedTree stopping drafting where its tree steps measure slow."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
import pytest
from conftest import make_model

from treewise.controller import BudgetsFile, DomainBudget, LatencyProfile, LearnedTree
from treewise.controller.learned import Costs
from treewise.controller.stepcost import MeasuredCosts
from treewise.decoder import StepOutcome, TreeDecoder


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _steps(costs: MeasuredCosts, clock: Clock, n: int, step_ms: float, predicted: float, forward: float,
           drafted: bool, measurable: bool = True) -> None:
    for _ in range(n):
        costs.begin()
        costs.end(predicted, forward, drafted, measurable)
        clock.now += step_ms / 1000


def test_nothing_measured_is_the_profile() -> None:
    costs = MeasuredCosts()
    nothing = (1.0, 1.0, 1.0, 0.0, 0.0)
    assert (costs.tree_scale, costs.plain_scale, costs.ratio, costs.tree_ms, costs.plain_ms) == nothing
    assert not costs.plain_due()


def test_scales_and_overheads_converge_per_kind_in_profile_units() -> None:
    clock = Clock()
    costs = MeasuredCosts(clock=clock, plain_every=1000)
    costs.start()
    _steps(costs, clock, 40, step_ms=30.0, predicted=10.0, forward=20.0, drafted=True)
    costs.begin()  # closes the last step
    shrink = 40 / 42  # 40 measured steps against a prior of 2
    assert costs.tree_scale == pytest.approx(2.0 * shrink + 1.0 * (1 - shrink), rel=1e-6)
    assert costs.tree_ms == pytest.approx(10.0 * shrink / costs.tree_scale, rel=1e-6)
    assert (costs.plain_scale, costs.plain_ms, costs.ratio) == (1.0, 0.0, 1.0)  # no plain step measured yet
    assert costs.plain_due()  # a drafting request is asked for a plain step
    _steps(costs, clock, 40, step_ms=6.0, predicted=10.0, forward=5.0, drafted=False)
    costs.begin()
    assert not costs.plain_due()
    assert costs.plain_scale == pytest.approx(0.5 * shrink + 1.0 * (1 - shrink), rel=1e-3)
    assert costs.plain_ms == pytest.approx(1.0 * shrink / costs.plain_scale, rel=1e-3)
    assert costs.ratio == pytest.approx(4.0, rel=1e-6)  # tree steps' forwards run twice the profile, plain half
    costs.start()  # a new request keeps what the machine's steps cost, trusted as one step ...
    assert costs.ratio == 1.0 and costs.tree_scale == pytest.approx(1 + 1 / 3, rel=1e-6)
    _steps(costs, clock, 1, step_ms=30.0, predicted=10.0, forward=20.0, drafted=True)
    costs.begin()  # ... until its own first tree step is measured
    assert costs.ratio == pytest.approx(4.0, rel=1e-6)
    costs.forget()
    assert (costs.tree_scale, costs.plain_scale, costs.ratio, costs.tree_ms, costs.plain_ms) == (1, 1, 1, 0, 0)


def test_plain_steps_are_asked_for_first_early_then_rarely() -> None:
    clock = Clock()
    costs = MeasuredCosts(clock=clock, first_plain=2, plain_every=5)
    asked = []
    for _ in range(20):
        costs.begin()
        drafted = not costs.plain_due()
        asked.append(drafted)
        costs.end(10.0, 10.0, drafted, True)
        clock.now += 0.01
    assert asked[:3] == [True, True, False]  # two measured tree steps, then a plain one
    assert asked[3:10] == [True] * 5 + [False, True]  # then one every five


def test_later_plain_steps_only_where_the_decision_is_close() -> None:
    clock = Clock()
    costs = MeasuredCosts(clock=clock, first_plain=2, plain_every=5)
    asked = []
    for i in range(20):
        costs.begin()
        drafted = not costs.plain_due(close=i >= 12)  # trees pay by far until step 12
        asked.append(drafted)
        costs.end(10.0, 10.0, drafted, True)
        clock.now += 0.01
    assert asked[:3] == [True, True, False]  # the first plain step is taken whatever the decision
    assert asked[3:12] == [True] * 9  # none while trees pay by far ...
    assert asked[12] is False  # ... and one as soon as the decision is close


def test_unmeasurable_steps_are_skipped() -> None:
    clock = Clock()
    costs = MeasuredCosts(clock=clock)
    _steps(costs, clock, 5, step_ms=500.0, predicted=10.0, forward=20.0, drafted=True, measurable=False)
    _steps(costs, clock, 5, step_ms=500.0, predicted=10.0, forward=float("nan"), drafted=True)
    costs.begin()
    assert (costs.tree_scale, costs.tree_ms) == (1.0, 0.0) and not costs.plain_due()


class Fixed:
    feature_names = ["depth"]

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.full(len(features["depth"]), 0.6)


@pytest.fixture(scope="module")
def dec(tokenizer):
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None
    return TreeDecoder(target, make_model("llama", 1, layers=1), tokenizer)


@dataclass
class ScriptedForwards(LearnedTree):
    """LearnedTree told scripted forward times: a plain step's forward as the profile says (10 ms), a tree step's
    ``tree_forward_x`` times the profile's (draft levels and the verify of its nodes)."""

    tree_forward_x: float = 1.0

    def observe(self, outcome: StepOutcome) -> None:
        drafted = self._request is not None and self._request.drafted
        ms = self.tree_forward_x * (12.0 + 0.5 * outcome.verified) if drafted else 10.0
        super().observe(replace(outcome, forward_ms=ms))


@pytest.mark.parametrize(("tree_extra_s", "tree_forward_x"), [(0.0, 1.0), (1.0, 1.0), (0.0, 20.0)],
                         ids=["cheap", "slow-tree-steps", "slow-tree-forwards"])
def test_learned_tree_stops_drafting_where_tree_steps_measure_slow(dec, tree_extra_s: float,
                                                                   tree_forward_x: float) -> None:
    """A clock on which every tree step takes ``tree_extra_s`` more than a plain step (a busy machine hurting
    the many small calls of a tree step), or tree steps whose forwards run ``tree_forward_x`` times what the
    profile says while a plain step's run as it says (a host whose memory is faster than the profile's): after a
    few measured steps the request decodes plain steps. Where neither holds it keeps drafting."""
    policy = ScriptedForwards(Fixed(), BudgetsFile(default=DomainBudget(node_budget=6, max_depth=3, max_width=2)),
                              LatencyProfile.flat(10.0, 1.0, 0.5), probe_every=1000, online=None,
                              tree_forward_x=tree_forward_x)
    clock = Clock()

    def tick() -> float:
        r = policy._request
        clock.now += 0.01 + (tree_extra_s if r is not None and r.drafted else 0.0)  # the step that just ended
        return clock.now

    policy._steps.clock = tick
    policy._steps.plain_every = 1000  # one plain step early (first_plain), none late
    out = dec.generate("def f(x):", max_new_tokens=40, tree=policy)
    assert out.token_ids == dec.generate_plain("def f(x):", max_new_tokens=40).token_ids
    drafted = [s.draft_forwards > 0 for s in out.stats.steps]
    late = drafted[8:-1]
    assert all(late) if tree_extra_s == 0.0 and tree_forward_x == 1.0 else not any(late)
    assert not all(drafted[:8])  # the early plain step that measures one


def test_a_tree_pays_when_its_extra_tokens_beat_its_extra_time() -> None:
    """The root's rule in goodput: a tree step of ``gain`` expected tokens in ``tree_ms`` against a plain step of
    one token in T(1) + its overhead; the measured ratio prices the tree's forwards, cost_scale its extra time."""
    costs = Costs(batch=1, target=[0.0, 10.0, 10.5, 11.0], draft=[0.0, 1.0, 1.1, 1.2], root_draft_ms=1.0,
                  cost_scale=1.0)
    assert costs.tree_pays(2.0, 20.0) and not costs.tree_pays(1.99, 20.0)  # twice the time for twice the tokens
    assert costs.tree_pays(2.0, 20.0, plain_ms=0.5) and not costs.tree_pays(2.0, 20.0, ratio=1.1)
    assert not costs.tree_pays(2.4, 10.0, ratio=2.5) and costs.tree_pays(2.6, 10.0, ratio=2.5)
    dear = Costs(batch=1, target=costs.target, draft=costs.draft, root_draft_ms=1.0, cost_scale=2.0)
    assert not dear.tree_pays(2.5, 20.0) and dear.tree_pays(3.0, 20.0)
    assert Costs(1, [], [], 0.0, 1.0).tree_pays(1.0, 1e9)  # no profile: no cost rule
