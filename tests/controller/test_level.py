"""``controller.level``: the compiled level makes exactly the plain-Python level's decisions.

Every level of real decodes is compared: kept candidates, children, the predictor's (isotonic) outputs and
the step's path values, with and without the latency cost rule and with the per-request correction active
from the first step. The compiled run evaluates the forest from its arrays and the isotonic map in the
kernel, the Python run scores through the predictor's own entry point (LightGBM's predict, then its
calibrator): a kernel part that drifts from the features the trees were trained on, from LightGBM's trees or
from np.interp fails here."""

import importlib.util
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from conftest import make_model

from treewise.controller import BudgetsFile, DomainBudget, LatencyProfile, LearnedTree
from treewise.controller.level import kernels
from treewise.decoder import Frontier, LevelPlan, TreeDecoder
from treewise.decoder.paths import data_dir
from treewise.predictor import AcceptancePredictor
from treewise.predictor.online import OnlineConfig

# The compiled level's tests need numba (the native extra); the fallback test below runs in either install, and
# where numba is really absent (CI's second run) it is the real thing rather than a monkeypatch.
NUMBA = importlib.util.find_spec("numba") is not None
needs_numba = pytest.mark.skipif(not NUMBA, reason="numba is not installed (the native extra)")


# Both shipped predictors: the real pair's also reads token_id, a column the level fills from the candidates.
@pytest.fixture(scope="module", params=["predictor", "smollm2/predictor"])
def shipped(request: pytest.FixtureRequest) -> AcceptancePredictor:
    model = AcceptancePredictor.load(data_dir() / request.param)
    assert (model.forest is not None) == NUMBA, model.backend_reason  # with numba the forest must be compiled
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
            r = self._request
            m, end = frontier.size, r.count
            self.seen.append((plan.keep.copy(), plan.children.copy(), r.state.raw[end - m:end].copy(),
                              r.state.value[:end].copy()))
        return plan


CASES = {
    "budget only": (DomainBudget(node_budget=10, max_depth=4, max_width=3, threshold=0.001, cost_scale=0.0), False),
    "cost rule": (DomainBudget(node_budget=12, max_depth=5, max_width=3, threshold=0.01, cost_scale=1.0), True),
    # steps of more candidates than the arrays first hold (64): they regrow mid-step, and the next levels still
    # read their parents' rows
    "regrown": (DomainBudget(node_budget=48, max_depth=4, max_width=6, threshold=1e-6, cost_scale=0.0), False),
}


@needs_numba
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("online", [None, OnlineConfig(gate=0.0)], ids=["global", "corrected"])
def test_the_native_level_decides_exactly_as_the_python_path(pair, shipped, case, online) -> None:
    budget, timed = CASES[case]
    latency = LatencyProfile.read(data_dir() / "latency.json") if timed else None

    def run(native: bool) -> tuple[Spy, list[int]]:
        # measured=False: step times differ between the two paths, and the same plans are the point here
        policy = Spy(shipped, BudgetsFile(default=budget), latency, online=online, native=native, measured=False)
        out = pair.generate("def f(x):\n    return", max_new_tokens=40, tree=policy, domain="code")
        return policy, out.token_ids

    native, ids_native = run(True)
    python, ids_python = run(False)
    assert native.native_level and not python.native_level
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


@needs_numba
def test_the_native_predictions_equal_lightgbms_on_a_decode(pair, shipped) -> None:
    """The forest evaluated from its arrays inside the kernel equals LightGBM's booster on the same rows."""
    policy = Spy(shipped, BudgetsFile(default=CASES["budget only"][0]), online=None)
    pair.generate("class A:\n", max_new_tokens=24, tree=policy, domain="code")
    assert policy.native_level and policy.seen
    x = policy._request.state.x[: len(policy.seen[-1][2])].copy()
    booster = shipped.booster.predict(x, num_threads=1)
    np.testing.assert_allclose(policy.seen[-1][2], shipped.calibrator(booster), rtol=0, atol=1e-12)


def test_without_numba_learned_tree_decodes_in_python(pair, shipped, monkeypatch) -> None:
    import treewise.controller.learned as learned

    monkeypatch.setattr(learned, "kernels", lambda: None)  # what kernels() answers where numba does not import
    policy = LearnedTree(shipped, BudgetsFile(default=CASES["budget only"][0]))
    out = pair.generate("def f(x):", max_new_tokens=16, tree=policy, domain="code")
    assert not policy.native_level
    assert out.token_ids == pair.generate_plain("def f(x):", max_new_tokens=16).token_ids


@needs_numba
def test_a_predictor_without_forest_arrays_runs_the_python_level(pair, shipped) -> None:
    class NoForest:  # scores encoded rows, but has no arrays for the kernel
        feature_names = shipped.feature_names
        category_code = shipped.category_code
        predict_prefix = shipped.predict_prefix

    policy = LearnedTree(NoForest(), BudgetsFile(default=CASES["budget only"][0]))  # type: ignore[arg-type]
    out = pair.generate("def f(x):", max_new_tokens=16, tree=policy, domain="code")
    assert not policy.native_level and kernels() is not None
    assert out.token_ids == pair.generate_plain("def f(x):", max_new_tokens=16).token_ids


def test_the_real_pairs_predictor_reads_token_id() -> None:
    """What makes the parametrised tests above cover the token_id column."""
    assert "token_id" in AcceptancePredictor.load(data_dir() / "smollm2/predictor").feature_names
