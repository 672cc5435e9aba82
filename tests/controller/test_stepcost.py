"""MeasuredCosts with a scripted clock, and LearnedTree stopping drafting where its tree steps measure slow."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
from conftest import make_model

from treewise.controller import BudgetsFile, DomainBudget, LatencyProfile, LearnedTree
from treewise.controller.stepcost import MeasuredCosts
from treewise.decoder import TreeDecoder


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
    assert (costs.scale, costs.tree_ms, costs.plain_ms) == (1.0, 0.0, 0.0)


def test_scale_and_overheads_converge_in_profile_units() -> None:
    clock = Clock()
    costs = MeasuredCosts(clock=clock)
    costs.start()
    _steps(costs, clock, 40, step_ms=30.0, predicted=10.0, forward=20.0, drafted=True)
    costs.begin()  # closes the last step
    assert costs.scale == pytest.approx(2.0 * 40 / 42 + 1.0 * 2 / 42, rel=1e-6)  # shrunk toward the profile
    assert costs.tree_ms == pytest.approx(10.0 * 40 / 42 / costs.scale, rel=1e-6)
    assert costs.plain_ms == 0.0
    _steps(costs, clock, 40, step_ms=22.0, predicted=10.0, forward=20.0, drafted=False)
    costs.begin()
    assert costs.plain_ms == pytest.approx(2.0 * 40 / 42 / costs.scale, rel=1e-3)
    costs.start()
    assert (costs.scale, costs.tree_ms, costs.plain_ms) == (1.0, 0.0, 0.0)


def test_unmeasurable_steps_are_skipped() -> None:
    clock = Clock()
    costs = MeasuredCosts(clock=clock)
    _steps(costs, clock, 5, step_ms=500.0, predicted=10.0, forward=20.0, drafted=True, measurable=False)
    _steps(costs, clock, 5, step_ms=500.0, predicted=10.0, forward=float("nan"), drafted=True)
    costs.begin()
    assert (costs.scale, costs.tree_ms) == (1.0, 0.0)


class Fixed:
    feature_names = ["depth"]

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.full(len(features["depth"]), 0.6)


@pytest.fixture(scope="module")
def dec(tokenizer):
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None
    return TreeDecoder(target, make_model("llama", 1, layers=1), tokenizer)


@pytest.mark.parametrize("tree_extra_s", [0.0, 1.0], ids=["cheap", "slow-tree-steps"])
def test_learned_tree_stops_drafting_where_tree_steps_measure_slow(dec, tree_extra_s: float) -> None:
    """A clock on which every tree step takes ``tree_extra_s`` more than a plain step (a busy machine hurting
    the many small calls of a tree step): after a few measured steps the request decodes plain steps."""
    policy = LearnedTree(Fixed(), BudgetsFile(default=DomainBudget(node_budget=6, max_depth=3, max_width=2)),
                         LatencyProfile.flat(10.0, 1.0, 0.5), probe_every=1000, online=None)
    clock = Clock()

    def tick() -> float:
        r = policy._request
        clock.now += 0.01 + (tree_extra_s if r is not None and r.drafted else 0.0)  # the step that just ended
        return clock.now

    policy._steps.clock = tick
    out = dec.generate("def f(x):", max_new_tokens=40, tree=policy)
    assert out.token_ids == dec.generate_plain("def f(x):", max_new_tokens=40).token_ids
    late = [s.draft_forwards > 0 for s in out.stats.steps[8:-1]]
    assert all(late) if tree_extra_s == 0.0 else not any(late)
