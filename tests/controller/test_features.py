"""``controller.features`` and the level's ``fill``: the rows the level writes equal the features the decoder
logs (through ``Frontier.numeric_features`` and ``RequestFeatures``), number for number, compiled or in Python;
LearnedTree decodes the same trees whichever entry point the predictor offers; the step's exact labels reach
the correction."""

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
from conftest import make_model

from treewise.controller import BudgetsFile, DomainBudget, LearnedTree
from treewise.controller.features import _SCALARS, STEP_SCALARS, FeatureLayout, raw_step_scalars
from treewise.controller.level import DEFAULT_TYPES, LevelState, kernels, python_kernels, tried_rows
from treewise.decoder import Frontier, NodeLogWriter, StepOutcome, TreeDecoder, TreewiseError
from treewise.decoder.paths import data_dir
from treewise.decoder.records.nodelog import TOKEN_TYPES, read_node_logs
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


def _level_rows(model: AcceptancePredictor, levels: list[Frontier], ctx: RequestFeatures, domain: str,
                native: bool) -> list[np.ndarray]:
    """Each level's rows as LearnedTree's level writes them (its ``fill``), compiled or as plain Python."""
    layout = FeatureLayout.of(model, domain)
    seen: list[np.ndarray] = []

    def score(x: np.ndarray, m: int) -> np.ndarray:
        seen.append(x[:m].copy())
        return np.full(m, 0.5)

    k = kernels() if native else python_kernels(score)
    forest = model.forest.arrays if native else None
    iso = model.isotonic if native else (np.zeros(0), np.zeros(0))
    state = LevelState.build(layout, DomainBudget(), [], [], forest, iso)
    state.begin_step(1.0, 0, 0.0, levels[0].position, None, raw_step_scalars(levels[0], ctx))
    at = 0
    for f in levels:
        c = f.columns
        k.level(*state.args(), f.size, at, f.depth, 0.5, f.token_type_table if f.token_type_table is not None
                else DEFAULT_TYPES, c["tokens"], c["sibling_rank"], c["draft_logprob"], c["draft_entropy"],
                c["draft_margin"], c["path_logprob"], c["parent_draft_prob"], c["parent"])
        if native:
            seen.append(state.x[:f.size].copy())
        at += f.size
    return seen


@pytest.mark.parametrize("native", [False, True], ids=["python", "compiled"])
@pytest.mark.parametrize("domain", ["code", "never-seen"])
def test_the_levels_rows_equal_the_logged_features_level_after_level(shipped: AcceptancePredictor, domain: str,
                                                                      native: bool) -> None:
    if native and kernels() is None:
        pytest.skip("numba is not installed")
    levels = [_frontier(1, [-1, -1, -1], 0), _frontier(2, [0, 0, 1, 2, 2], 1), _frontier(3, [3, 4, 4, 7], 2)]
    got = _level_rows(shipped, levels, _context(), domain, native)
    ctx = _context()
    for f, rows in zip(levels, got, strict=True):
        np.testing.assert_array_equal(rows, _dict_rows(shipped, f, ctx, domain))  # NaNs alike, numbers identical
    assert np.isfinite(got[1][:, shipped.feature_names.index("parent_margin")]).all()


def test_a_model_reading_features_the_level_cannot_fill_is_refused_in_one_line() -> None:
    class Odd:
        feature_names = ["draft_logprob", "something_else"]

        def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
            return np.zeros(1)

    with pytest.raises(TreewiseError, match=r"cannot compute the features \['something_else'\]"):
        FeatureLayout.of(Odd(), "code")


def test_a_model_reading_token_type_as_a_number_gets_dicts(shipped: AcceptancePredictor) -> None:
    class Numeric(DictOnly):
        def category_code(self, feature: str, value: str) -> int:
            if feature == "token_type":
                raise FeatureSchemaError("'token_type' is not a categorical feature")
            return super().category_code(feature, value)

        def predict_prefix(self, x: np.ndarray, n: int) -> np.ndarray:
            return self.model.predict_prefix(x, n)

    assert FeatureLayout.of(Matrix(shipped), "code").coded
    layout = FeatureLayout.of(Numeric(shipped), "code")
    assert not layout.coded and not FeatureLayout.of(DictOnly(shipped), "code").coded
    f = _frontier(1, [-1, -1, -1], 0)
    x = np.zeros((3, len(layout.names)))
    x[:, layout.names.index("token_type")] = [0, 3, 6]
    cols = layout.as_dict(x, 3)
    assert cols["token_type"].tolist() == [0, 3, 6] and cols["domain"].tolist() == ["code"] * 3
    assert cols["depth"].dtype == np.int16 and f.size == 3  # the node log's types


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


@dataclass
class Labelled(LearnedTree):
    """LearnedTree that records each step's tried-node labels as the level's arrays give them to the update."""

    labels: list[np.ndarray] = field(default_factory=list)

    def observe(self, outcome: StepOutcome) -> None:
        r = self._request
        if outcome.verified > 0:
            p, y = np.zeros(r.count), np.zeros(r.count)
            n = tried_rows(r.state.raw, r.state.keep, r.state.parent, r.count, outcome.verified,
                           np.asarray(outcome.path, dtype=np.int64), p, y)
            if n > 0:
                self.labels.append(y[:n].copy())
        super().observe(outcome)


def _policy(model: object) -> Labelled:
    budget = DomainBudget(node_budget=10, max_depth=4, max_width=3, threshold=0.001, cost_scale=0.0)
    policy = Labelled(model, BudgetsFile(default=budget))  # type: ignore[arg-type]
    policy._calibrator = Recording(policy._calibrator.config)
    return policy


def test_learned_tree_decodes_the_same_trees_with_either_entry_point(pair: TreeDecoder, shipped, tmp_path) -> None:
    fast, slow = _policy(shipped), _policy(DictOnly(shipped))
    log = NodeLogWriter(tmp_path / "nodes")
    a = pair.generate("def f(x):", max_new_tokens=30, tree=fast, domain="code", prompt_id="p", log=log)
    log.close()
    b = pair.generate("def f(x):", max_new_tokens=30, tree=slow, domain="code")
    assert not slow.native_level and fast.native_level == (kernels() is not None)
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
    assert len(fast.labels) == len(slow.labels) == len(want) and sum(len(w) for w in want) > len(want)
    assert any(w.min() == 0 for w in want) and any(w.max() == 1 for w in want)  # both labels occur
    for f, s, w in zip(fast.labels, slow.labels, want, strict=True):
        np.testing.assert_array_equal(f, w)
        np.testing.assert_array_equal(s, w)
    # Every update went through the one step update (compiled or Python): the same posterior every step.
    assert not fast._calibrator.seen and not slow._calibrator.seen
    assert len(fast._calibrator.absorbed) == len(slow._calibrator.absorbed) == len(want)
    for (pa_, na), (pb, nb) in zip(fast._calibrator.absorbed, slow._calibrator.absorbed, strict=True):
        assert na == nb
        np.testing.assert_allclose(pa_, pb, rtol=1e-12, atol=1e-12)


def test_the_update_reads_steps_past_the_first_arrays(pair: TreeDecoder, shipped) -> None:
    """Steps of more candidates than the level's arrays first hold (64) regrow them mid-step; the update still
    reads every level of the step: the same posterior either way, step after step."""
    wide = DomainBudget(node_budget=48, max_depth=4, max_width=6, threshold=1e-6, cost_scale=0.0)

    def policy(model: object) -> LearnedTree:
        tree = LearnedTree(model, BudgetsFile(default=wide))  # type: ignore[arg-type]
        tree._calibrator = Recording(tree._calibrator.config)
        return tree

    fast, slow = policy(shipped), policy(DictOnly(shipped))
    a = pair.generate("def f(x):", max_new_tokens=20, tree=fast, domain="code")
    b = pair.generate("def f(x):", max_new_tokens=20, tree=slow, domain="code")
    assert a.token_ids == b.token_ids
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


def test_the_step_scalars_type_names_the_step_scalars_in_order() -> None:
    from treewise.controller.features import STEP_SCALARS, StepScalars

    assert StepScalars._fields == STEP_SCALARS
