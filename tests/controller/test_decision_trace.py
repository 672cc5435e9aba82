"""LearnedTree's decisions on a scripted sequence of step costs, without a clock: the decoder runs toy models,
but every forward time the policy reads and every tick of its step clock come from a cost curve, so the tree
sizes it chooses are a function of that curve alone (and the test fails if a rule reads the real clock).

- a flat curve (verifying more nodes costs nearly nothing) gets full-size trees on every drafted step;
- a steep curve (each node costs a large share of a plain step) gets small trees;
- a jump (tree steps turn three times dearer mid-request, then cheap again) stops drafting and resumes it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np
import pytest
from conftest import make_model

from treewise.controller import BudgetsFile, DomainBudget, LatencyProfile, LearnedTree
from treewise.decoder import StepOutcome, TreeDecoder

PROMPT, TOKENS = "def f(x):", 160
BUDGET = DomainBudget(node_budget=8, max_depth=4, max_width=2, threshold=0.01)


class Fixed:
    """Every candidate accepted with probability 0.8: path values 0.8, 0.64, 0.51, 0.41 by depth."""

    feature_names = ["depth"]

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.full(len(features["depth"]), 0.6)


@dataclass
class Scripted(LearnedTree):
    """LearnedTree whose step costs are scripted: ``forwards(step, drafted, verified)`` gives the step's forward
    milliseconds, 1 ms more passes outside them, and the step clock advances by exactly that."""

    forwards: Callable[[int, bool, int], float] = lambda step, drafted, verified: 10.0
    now: float = field(default=0.0, init=False)
    sizes: list[int] = field(default_factory=list, init=False)  # verified nodes per step (0: a plain step)

    def __post_init__(self) -> None:
        super().__post_init__()
        self._steps.clock = lambda: self.now

    def observe(self, outcome: StepOutcome) -> None:
        drafted = self._request is not None and self._request.drafted
        ms = self.forwards(outcome.step, drafted, outcome.verified)
        self.now += (ms + 1.0) / 1000  # the step ends at the next root, which reads the clock
        self.sizes.append(outcome.verified if drafted else 0)
        super().observe(replace(outcome, forward_ms=ms))


@pytest.fixture(scope="module")
def dec(tokenizer):
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None
    return TreeDecoder(target, make_model("llama", 0), tokenizer)  # the draft is the target: paths accepted


def _trace(dec: TreeDecoder, profile: LatencyProfile, forwards: Callable[[int, bool, int], float]) -> list[int]:
    policy = Scripted(Fixed(), BudgetsFile(default=BUDGET), profile, online=None, forwards=forwards)
    out = dec.generate(PROMPT, max_new_tokens=TOKENS, tree=policy)
    assert out.token_ids == dec.generate_plain(PROMPT, max_new_tokens=TOKENS).token_ids
    return policy.sizes


def _as_profiled(profile: LatencyProfile, x: float = 1.0) -> Callable[[int, bool, int], float]:
    """Forwards as the profile prices them (times ``x`` for tree steps): a few draft levels and the verify."""
    return lambda step, drafted, n: x * (4 * profile.draft_time(2) + profile.target_time(n + 1)) if drafted \
        else profile.target_time(1)


def test_a_flat_cost_curve_gets_full_size_trees(dec) -> None:
    flat = LatencyProfile.flat(10.0, 0.5, 0.01)
    sizes = _trace(dec, flat, _as_profiled(flat))
    plain = [k for k, n in enumerate(sizes) if n == 0]
    assert len(plain) <= 1 + len(sizes) // 32  # only the plain steps that measure one (MeasuredCosts.plain_due)
    assert all(n == BUDGET.node_budget for k, n in enumerate(sizes[:-1]) if k not in plain)  # the last: no room


def test_steeper_cost_curves_get_smaller_trees(dec) -> None:
    """Per-node cost from nearly nothing to a whole plain step's: the mean tree shrinks at every step up, and
    where a node costs what a plain step does, no step verifies a node."""
    means = []
    for per_node in (0.01, 2.5, 5.0, 10.0):
        curve = LatencyProfile.flat(10.0, 0.5, per_node)
        sizes = _trace(dec, curve, _as_profiled(curve))
        means.append(sum(sizes) / len(sizes))
    assert means[0] > means[1] > means[2] > means[3] == 0.0, means


def test_drafting_stops_under_a_cost_jump_and_resumes_after_it(dec) -> None:
    """Steps 10-29 cost six times what the profile says for a tree step (a busy machine), then the price
    returns: the request decodes plain steps within the jump, and after it the next probe measures the cheap
    price again and the request drafts again."""
    flat = LatencyProfile.flat(10.0, 0.5, 0.01)
    cheap, dear = _as_profiled(flat), _as_profiled(flat, 6.0)
    sizes = _trace(dec, flat, lambda step, drafted, n: (dear if 10 <= step < 30 else cheap)(step, drafted, n))
    assert len(sizes) > 55
    assert all(n > 0 for k, n in enumerate(sizes[:10]) if k != 3)  # drafting (step 3 measures a plain step)
    assert sum(n == 0 for n in sizes[16:30]) >= 13  # stopped: at most a probe
    assert all(n > 0 for n in sizes[-15:])  # drafting again
