"""``controller.fused``: LearnedTree's native level makes exactly the Python path's decisions.

Every level of real decodes is compared: kept candidates, children, the predictor's (isotonic) outputs and
the step's path values, with and without the latency cost rule and with the per-request correction active
from the first step. A kernel that drifts from ``LearnedTree._keep`` / ``_expand`` or from the features the
trees were trained on fails here."""

import copy
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from conftest import make_model

from treewise.controller import BudgetsFile, DomainBudget, LatencyProfile, LearnedTree
from treewise.controller.features import FeatureRows
from treewise.controller.fused import FusedLevel, kernel
from treewise.decoder import Frontier, LevelPlan, TreeDecoder
from treewise.decoder.paths import data_dir
from treewise.predictor import AcceptancePredictor
from treewise.predictor.online import OnlineConfig

pytest.importorskip("numba")


@pytest.fixture(scope="module")
def shipped() -> AcceptancePredictor:
    model = AcceptancePredictor.load(data_dir() / "predictor")
    if model.forest is None:
        pytest.skip(f"no compiled forest here: {model.backend_reason}")
    return model


@pytest.fixture(scope="module")
def pair(tokenizer) -> TreeDecoder:
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None
    draft = make_model("llama", 0)
    with torch.no_grad():  # a noisy draft head: the target accepts some nodes and rejects others
        draft.get_output_embeddings().weight.add_(torch.randn_like(draft.get_output_embeddings().weight), alpha=1.0)
    return TreeDecoder(target, draft, tokenizer)


@dataclass
class Spy(LearnedTree):
    """LearnedTree that records each level's answer and state right after it was made."""

    seen: list[tuple[np.ndarray, ...]] = field(default_factory=list)

    def plan(self, frontier: Frontier) -> LevelPlan:
        plan = super().plan(frontier)
        if frontier.depth > 0:
            m, fused = frontier.size, self._fused  # the native level keeps its predictions in its own buffer
            raw = fused.raw[self._count - m:self._count] if fused is not None else self._step[-1].raw
            value = fused.value if fused is not None else self._value
            self.seen.append((plan.keep.copy(), plan.children.copy(), raw.copy(), value[:self._count].copy()))
        return plan


CASES = {
    "budget only": (DomainBudget(node_budget=10, max_depth=4, max_width=3, threshold=0.001, cost_scale=0.0), False),
    "cost rule": (DomainBudget(node_budget=12, max_depth=5, max_width=3, threshold=0.01, cost_scale=1.0), True),
    # steps of more candidates than the arena first holds (64): it regrows mid-step, and the next levels still
    # read their parents' rows
    "regrown": (DomainBudget(node_budget=48, max_depth=4, max_width=6, threshold=1e-6, cost_scale=0.0), False),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("online", [None, OnlineConfig(gate=0.0)], ids=["global", "corrected"])
def test_the_native_level_decides_exactly_as_the_python_path(pair, shipped, case, online) -> None:
    budget, timed = CASES[case]
    latency = LatencyProfile.read(data_dir() / "latency.json") if timed else None

    def run(fused: bool) -> tuple[Spy, list[int]]:
        policy = Spy(shipped, BudgetsFile(default=budget), latency, online=online, fused=fused)
        out = pair.generate("def f(x):\n    return", max_new_tokens=40, tree=policy, domain="code")
        return policy, out.token_ids

    native, ids_native = run(True)
    python, ids_python = run(False)
    assert native._fused is not None and python._fused is None
    assert ids_native == ids_python == pair.generate_plain("def f(x):\n    return", max_new_tokens=40).token_ids
    assert len(native.seen) == len(python.seen) > 5
    assert sum(int(k.sum()) for k, *_ in native.seen) > sum(int(k.all()) for k, *_ in native.seen)  # some pruning
    for (k1, c1, r1, v1), (k2, c2, r2, v2) in zip(native.seen, python.seen, strict=True):
        np.testing.assert_array_equal(k1, k2)
        np.testing.assert_array_equal(c1, c2)
        np.testing.assert_allclose(r1, r2, rtol=0, atol=1e-12)
        np.testing.assert_allclose(v1, v2, rtol=0, atol=1e-12)
    if online is not None:
        assert native._calibrator.active and native._calibrator.rows == python._calibrator.rows


@dataclass
class RowSpy(LearnedTree):
    """Records, per level, the rows the kernel wrote and the rows ``FeatureRows.fill`` writes for the same
    frontier from a copy of the request's context taken before the level, given the step's earlier levels as
    parents (the native level keeps its parents' rows in its own arena)."""

    rows_seen: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)
    earlier: list[Frontier] = field(default_factory=list)  # this step's levels so far

    def plan(self, frontier: Frontier) -> LevelPlan:
        before = copy.deepcopy(self._context)
        plan = super().plan(frontier)
        if frontier.depth == 0:
            self.earlier = []
        else:
            before.begin_step()
            for level in self.earlier:
                before.push(level.arrays()["draft_margin"], level.arrays()["draft_entropy"])
            ref = FeatureRows(self.predictor, self.domain)
            m = ref.fill(frontier, before, frontier.arrays()["parent"])
            self.rows_seen.append((self._fused.x[:m].copy(), ref.matrix[:m].copy()))
            self.earlier.append(frontier)
        return plan


@pytest.mark.parametrize("domain", ["code", "never-seen"])
def test_the_native_rows_equal_feature_rows_number_for_number(pair, shipped, domain) -> None:
    """Every feature the kernel writes (step scalars through their logged types, depth, position, token type,
    parent columns) equals ``FeatureRows.fill``, which tests/controller/test_features.py holds to the dict path."""
    policy = RowSpy(shipped, BudgetsFile(default=CASES["cost rule"][0]),
                    LatencyProfile.read(data_dir() / "latency.json"), online=None)
    pair.generate("def f(x):\n    return", max_new_tokens=30, tree=policy, domain=domain)
    assert policy.native_level and len(policy.rows_seen) > 5
    for got, want in policy.rows_seen:
        np.testing.assert_array_equal(got, want)  # NaNs in the same places, numbers identical


def test_the_native_predictions_equal_lightgbms_on_a_decode(pair, shipped) -> None:
    """The forest called through its address from the kernel equals LightGBM's booster on the same rows."""
    policy = Spy(shipped, BudgetsFile(default=CASES["budget only"][0]), online=None)
    pair.generate("class A:\n", max_new_tokens=24, tree=policy, domain="code")
    assert policy._fused is not None and policy.seen
    x = policy._fused.x[: len(policy.seen[-1][2])].copy()
    booster = shipped.booster.predict(x, num_threads=1)
    np.testing.assert_allclose(policy.seen[-1][2], shipped.calibrator(booster), rtol=0, atol=1e-6)


def test_without_numba_learned_tree_decodes_in_python(pair, shipped, monkeypatch) -> None:
    import treewise.controller.fused as fused

    monkeypatch.setattr(fused, "kernel", lambda: None)  # what kernel() answers where numba does not import
    policy = LearnedTree(shipped, BudgetsFile(default=CASES["budget only"][0]))
    out = pair.generate("def f(x):", max_new_tokens=16, tree=policy, domain="code")
    assert not policy.native_level and policy._rows is not None
    assert out.token_ids == pair.generate_plain("def f(x):", max_new_tokens=16).token_ids


def test_without_an_entry_point_learned_tree_stays_in_python(shipped) -> None:
    class NoForest:
        forest = None
        calibrator = shipped.calibrator

    rows = object()
    assert FusedLevel.build(rows, NoForest(), [], [], DomainBudget()) is None  # type: ignore[arg-type]
    assert kernel() is not None
