"""``controller.features.FeatureRows``: the rows it writes equal the dict path's encoded rows, number for number,
and LearnedTree decodes the same trees with either path; the step's exact labels reach the correction."""

from collections.abc import Mapping

import numpy as np
import pytest
import torch
from conftest import make_model

from treewise.controller import BudgetsFile, DomainBudget, LearnedTree
from treewise.controller.features import _SCALARS, STEP_SCALARS, FeatureRows, raw_step_scalars
from treewise.decoder import Frontier, NodeLogWriter, TreeDecoder
from treewise.decoder.nodelog import TOKEN_TYPES, read_node_logs
from treewise.decoder.paths import data_dir
from treewise.predictor import AcceptancePredictor
from treewise.predictor.derived import RequestFeatures
from treewise.predictor.features import FeatureSchemaError
from treewise.predictor.online import OnlineCalibrator, OnlineConfig

NOISE = 1.0


@pytest.fixture(scope="module")
def shipped() -> AcceptancePredictor:
    return AcceptancePredictor.load(data_dir() / "predictor")


def _frontier(depth: int, parent: list[int], seed: int) -> Frontier:
    g = torch.Generator().manual_seed(seed)
    m = len(parent)
    lp = -torch.rand(m, generator=g) * 3
    return Frontier.of(
        depth=depth, step=5, position=11, prompt_len=30, domain="code", temperature=0.0, tree_size=3, max_depth=6,
        tokens=torch.randint(0, 50, (m,), generator=g), parent=torch.tensor(parent),
        sibling_rank=torch.arange(m) % 2, draft_logprob=lp, draft_entropy=torch.rand(m, generator=g) * 4,
        draft_margin=torch.rand(m, generator=g), path_logprob=lp - 0.5, parent_draft_prob=torch.rand(m, generator=g),
        running_accept_rate=0.37, prev_accepted=2, token_type_table=np.arange(50) % len(TOKEN_TYPES),
    )


def _context() -> RequestFeatures:
    ctx = RequestFeatures()
    ctx.start()
    ctx.observe(3, 5)
    ctx.observe(1, 4)  # recent values that are not exact in float32
    ctx.begin_step()
    return ctx


def _dict_rows(model: AcceptancePredictor, f: Frontier, ctx: RequestFeatures, domain: str) -> np.ndarray:
    feats = f.numeric_features()
    code = model.category_code("domain", domain)
    feats["domain"] = np.full(f.size, float(code) if code >= 0 else np.nan)
    ctx.add(feats, f.parent.numpy())
    x = np.empty((f.size, len(model.feature_names)))
    for j, name in enumerate(model.feature_names):
        x[:, j] = feats[name]
    return x


def test_the_raw_step_scalars_follow_step_scalars_order() -> None:
    f = _frontier(1, [-1, -1], seed=0)
    f = Frontier.from_fields({**f.__dict__, "temperature": 0.7, "prev_accepted": 4}, 1, 3, f.columns)  # all distinct
    ctx = _context()
    expected = [_SCALARS[n](f, ctx) for n in STEP_SCALARS]
    assert len(set(expected)) == len(expected)
    assert list(raw_step_scalars(f, ctx)) == expected


@pytest.mark.parametrize("domain", ["code", "never-seen"])
def test_rows_equal_the_dict_paths_rows_level_after_level(shipped: AcceptancePredictor, domain: str) -> None:
    assert FeatureRows.supports(shipped)
    rows, a, b = FeatureRows(shipped, domain), _context(), _context()
    levels = [_frontier(1, [-1, -1, -1], 0), _frontier(2, [0, 0, 1, 2, 2], 1), _frontier(3, [3, 4, 4, 7], 2)]
    for f in levels:
        want = _dict_rows(shipped, f, a, domain)
        got_p = rows.predict(f, b, f.parent.numpy())
        np.testing.assert_array_equal(rows.matrix[:f.size], want)  # NaNs in the same places, numbers identical
        columns = dict(zip(shipped.feature_names, want.T, strict=True))
        np.testing.assert_array_equal(got_p, shipped.predict_batch(columns))
    assert np.isfinite(rows.matrix[:4, shipped.feature_names.index("parent_margin")]).all()


def test_a_model_reading_unknown_features_keeps_the_dict_path() -> None:
    class Odd:
        feature_names = ["draft_logprob", "something_else"]

        def category_code(self, feature: str, value: str) -> int:
            return -1

        def predict_prefix(self, x: np.ndarray, n: int) -> np.ndarray:
            return np.zeros(n)

    assert not FeatureRows.supports(Odd())


def test_a_model_reading_token_type_as_a_number_keeps_the_dict_path(shipped: AcceptancePredictor) -> None:
    class Numeric(DictOnly):
        def category_code(self, feature: str, value: str) -> int:
            if feature == "token_type":
                raise FeatureSchemaError("'token_type' is not a categorical feature")
            return super().category_code(feature, value)

        def predict_prefix(self, x: np.ndarray, n: int) -> np.ndarray:
            return self.model.predict_prefix(x, n)

    assert FeatureRows.supports(Matrix(shipped)) and not FeatureRows.supports(Numeric(shipped))


class DictOnly:
    """The shipped predictor without ``predict_prefix``: LearnedTree must take the dict path."""

    def __init__(self, model: AcceptancePredictor) -> None:
        self.model = model
        self.feature_names = list(model.feature_names)

    def category_code(self, feature: str, value: str) -> int:
        return self.model.category_code(feature, value)

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        return self.model.predict_batch(features)


class Matrix(DictOnly):
    def predict_prefix(self, x: np.ndarray, n: int) -> np.ndarray:
        return self.model.predict_prefix(x, n)


class Recording(OnlineCalibrator):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[np.ndarray, np.ndarray]] = []
        self.absorbed: list[tuple[np.ndarray, int]] = []

    def update(self, p: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> None:
        self.seen.append((np.asarray(p).copy(), np.asarray(labels, dtype=float).copy()))
        super().update(p, labels, weights)

    def absorb(self, posterior: tuple[float, float, float, float, float], rows: int) -> None:
        self.absorbed.append((np.asarray(posterior, dtype=float), rows))  # every update ends here, native ones too
        super().absorb(posterior, rows)


@pytest.fixture(scope="module")
def pair(tokenizer) -> TreeDecoder:
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None
    draft = make_model("llama", 0)
    with torch.no_grad():  # the target with a noisy head: accepts some nodes, rejects others
        draft.get_output_embeddings().weight.add_(torch.randn_like(draft.get_output_embeddings().weight), alpha=NOISE)
    return TreeDecoder(target, draft, tokenizer)


def _policy(model: object) -> LearnedTree:
    budget = DomainBudget(node_budget=10, max_depth=4, max_width=3, threshold=0.001, cost_scale=0.0)
    policy = LearnedTree(model, BudgetsFile(default=budget))  # type: ignore[arg-type]
    policy._calibrator = Recording(policy._calibrator.config)
    return policy


def test_learned_tree_decodes_the_same_trees_with_either_path(pair: TreeDecoder, shipped, tmp_path) -> None:
    fast, slow = _policy(shipped), _policy(DictOnly(shipped))
    log = NodeLogWriter(tmp_path / "nodes")
    a = pair.generate("def f(x):", max_new_tokens=30, tree=fast, domain="code", prompt_id="p", log=log)
    log.close()
    b = pair.generate("def f(x):", max_new_tokens=30, tree=slow, domain="code")
    assert fast._rows is not None and slow._rows is None
    assert a.token_ids == b.token_ids == pair.generate_plain("def f(x):", max_new_tokens=30).token_ids
    assert [s.verified for s in a.stats.steps] == [s.verified for s in b.stats.steps]
    # The correction learned from every tried node with its logged label, step by step.
    table = read_node_logs(tmp_path / "nodes").sort_by([("step", "ascending"), ("node_id", "ascending")])
    cols = {n: table.column(n).to_numpy(zero_copy_only=False) for n in ("step", "node_id", "parent_id",
                                                                        "verified", "on_accepted_path")}
    want = []
    for step in np.unique(cols["step"]):
        at = (cols["step"] == step) & cols["verified"]
        node, parent, on = cols["node_id"][at], cols["parent_id"][at], cols["on_accepted_path"][at]
        accepted = set(node[on].tolist())
        tried = np.asarray([q < 0 or q in accepted for q in parent.tolist()])
        if at.any():
            want.append(on[tried].astype(float))
    got = [labels for _, labels in slow._calibrator.seen]
    assert len(got) == len(want) and sum(len(w) for w in want) > len(want)
    assert any(w.min() == 0 for w in want) and any(w.max() == 1 for w in want)  # both labels occur
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    # The fast path labels and updates in one native call (controller.fused): the same posterior every step.
    assert fast._fused is not None and not fast._calibrator.seen
    assert len(fast._calibrator.absorbed) == len(slow._calibrator.absorbed) == len(want)
    for (pa_, na), (pb, nb) in zip(fast._calibrator.absorbed, slow._calibrator.absorbed, strict=True):
        assert na == nb
        np.testing.assert_allclose(pa_, pb, rtol=1e-12, atol=1e-12)


def test_the_native_update_reads_steps_past_its_first_buffers(pair: TreeDecoder, shipped) -> None:
    """Steps of more candidates than the fused buffers first hold (64) regrow them mid-step; the native update
    still reads every level of the step: the same posterior as the Python path, step after step."""
    wide = DomainBudget(node_budget=48, max_depth=4, max_width=6, threshold=1e-6, cost_scale=0.0)

    def policy(model: object) -> LearnedTree:
        tree = LearnedTree(model, BudgetsFile(default=wide))  # type: ignore[arg-type]
        tree._calibrator = Recording(tree._calibrator.config)
        return tree

    fast, slow = policy(shipped), policy(DictOnly(shipped))
    a = pair.generate("def f(x):", max_new_tokens=20, tree=fast, domain="code")
    b = pair.generate("def f(x):", max_new_tokens=20, tree=slow, domain="code")
    assert a.token_ids == b.token_ids and fast._fused is not None
    assert max(s.drafted for s in a.stats.steps) > 64
    assert len(fast._calibrator.absorbed) == len(slow._calibrator.absorbed) > 3
    for (pa_, na), (pb, nb) in zip(fast._calibrator.absorbed, slow._calibrator.absorbed, strict=True):
        assert na == nb
        np.testing.assert_allclose(pa_, pb, rtol=1e-12, atol=1e-12)


def _steps(policy: LearnedTree, pair: TreeDecoder) -> list[tuple[int, int, int]]:
    out = pair.generate("def f(x):", max_new_tokens=30, tree=policy, domain="code")
    assert out.token_ids == pair.generate_plain("def f(x):", max_new_tokens=30).token_ids
    return [(s.drafted, s.verified, s.accepted) for s in out.stats.steps]


def test_the_gate_keeps_the_global_models_trees_until_the_evidence_reaches_it(pair: TreeDecoder, shipped) -> None:
    """A gate the request never reaches decodes exactly the trees of no correction, while the correction keeps
    learning; without a gate the same evidence reshapes the trees (the noisy draft makes the global model off)."""
    budget = DomainBudget(node_budget=10, max_depth=4, max_width=3, threshold=0.001, cost_scale=0.0)

    def policy(online: OnlineConfig | None) -> LearnedTree:
        return LearnedTree(shipped, BudgetsFile(default=budget), online=online)

    closed = policy(OnlineConfig(gate=1e9))
    assert _steps(closed, pair) == _steps(policy(None), pair)
    assert closed._calibrator.rows > 0 and closed._calibrator.evidence < 1e9 and not closed._calibrator.active
    assert _steps(policy(OnlineConfig(gate=0.0)), pair) != _steps(policy(None), pair)
