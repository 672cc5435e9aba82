"""``predictor.forest``: LightGBM's trees as arrays give Booster.predict's numbers, compiled or as plain Python,
on real node logs of the embedded pair and on models with every split kind (categorical bitsets over 32
categories, missing values as NaN or zero, default directions, regression), and the backend choice."""

from __future__ import annotations

import sys
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest

from treewise.decoder import NodeLogWriter, StaticTree, TreeDecoder
from treewise.decoder.records.nodelog import read_node_logs
from treewise.predictor import AcceptancePredictor, select_rows
from treewise.predictor.features import NodeRows, encode
from treewise.predictor.forest import ForestArrays, ForestError, compiled_predict, forest_predict
from treewise.predictor.model import PredictorError

DATA = Path(__file__).resolve().parents[2] / "data"


def _python(forest: ForestArrays, x: np.ndarray) -> np.ndarray:
    out = np.empty(len(x))
    forest_predict(np.ascontiguousarray(x, dtype=np.float64), len(x), out, *forest.arrays)
    return out


def _hostile(rng: np.random.Generator, n: int, width: int, cats: dict[int, int]) -> np.ndarray:
    """Rows with NaNs, exact zeros, values within LightGBM's zero band, negative and unseen category codes."""
    x = rng.normal(size=(n, width))
    for j, k in cats.items():
        x[:, j] = rng.integers(-2, k + 3, n).astype(np.float64)
        x[rng.random(n) < 0.05, j] += 0.5  # fractional codes: LightGBM truncates them
    x[rng.random(x.shape) < 0.1] = np.nan
    x[rng.random(x.shape) < 0.05] = 0.0
    x[rng.random(x.shape) < 0.02] = 1e-36
    return x


@pytest.mark.parametrize("params", [
    {"objective": "binary"},
    {"objective": "binary", "zero_as_missing": True},
    {"objective": "binary", "use_missing": False},
    {"objective": "regression"},
], ids=["binary", "zero-missing", "no-missing", "regression"])
def test_arrays_equal_lightgbm_on_every_split_kind(params: dict) -> None:
    rng = np.random.default_rng(0)
    cats = {0: 40, 3: 5}  # 40 categories need two bitset words
    x = _hostile(rng, 3000, 6, cats)
    y = ((np.nan_to_num(x[:, 1]) + (np.nan_to_num(x[:, 0]) % 7 == 3) + rng.normal(size=len(x)) * 0.3) > 0.5)
    data = lgb.Dataset(x, y.astype(float), categorical_feature=list(cats), free_raw_data=False)
    booster = lgb.train({**params, "num_leaves": 15, "verbose": -1, "min_data_per_group": 5, "cat_smooth": 1,
                         "max_cat_to_onehot": 2, "num_threads": 1}, data, num_boost_round=30)
    dump = booster.dump_model()
    kinds = {(n.get("decision_type"), n.get("missing_type")) for t in dump["tree_info"] for n in _splits(t)}
    assert ("==", "NaN") in kinds or ("==", "None") in kinds  # the model has categorical splits
    forest = ForestArrays.from_booster(booster)
    test = _hostile(np.random.default_rng(1), 2000, 6, cats)
    want = booster.predict(test, num_threads=1)
    np.testing.assert_array_equal(_python(forest, test), want)
    if compiled_predict() is not None:
        np.testing.assert_array_equal(forest.predict(test), want)


def _splits(tree: dict) -> list[dict]:
    out, stack = [], [tree["tree_structure"]]
    while stack:
        node = stack.pop()
        if "split_feature" in node:
            out.append(node)
            stack += [node["left_child"], node["right_child"]]
    return out


def test_models_it_cannot_reproduce_are_refused() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(300, 3)), rng.integers(0, 3, 300)
    multi = lgb.train({"objective": "multiclass", "num_class": 3, "verbose": -1}, lgb.Dataset(x, y), 3)
    with pytest.raises(ForestError, match="one-output"):
        ForestArrays.from_booster(multi)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> NodeRows:
    """Every drafted node of a few real decodes of the embedded pair (one in a domain the model never saw, so
    its code is a missing value), with the features training uses."""
    out = tmp_path_factory.mktemp("nodes")
    dec = TreeDecoder.from_pretrained(target=str(DATA / "models" / "target"), draft=str(DATA / "models" / "draft"),
                                      device="cpu")
    log = NodeLogWriter(out)
    prompts = (("def fib(n):", "code"), ("What is 12 times 7?", "math"), ("Tell me a story.", "unseen-domain"))
    for i, (prompt, domain) in enumerate(prompts):
        dec.generate(prompt, max_new_tokens=24, tree=StaticTree(branching=(4, 2, 2, 1)), domain=domain,
                     prompt_id=f"p{i}", log=log)
    log.close()
    return select_rows(read_node_logs(out), untried=True)


def test_the_shipped_predictor_equals_lightgbm_on_real_node_logs(rows: NodeRows) -> None:
    plain = AcceptancePredictor.load(DATA / "predictor", backend="lightgbm")
    x = encode(rows.columns, plain.schema)
    assert len(x) > 200 and np.isnan(x[:, plain.feature_names.index("domain")]).any()  # the unseen domain
    want = plain.booster.predict(x, num_threads=1)
    forest = ForestArrays.from_booster(plain.booster)
    np.testing.assert_array_equal(_python(forest, x), want)
    if compiled_predict() is None:
        return
    fast = AcceptancePredictor.load(DATA / "predictor")
    assert fast.backend == "numba" and plain.backend == "lightgbm"
    np.testing.assert_array_equal(fast.predict_raw(x), want)
    np.testing.assert_array_equal(fast.predict_rows(rows), plain.predict_rows(rows))
    # Frontier-sized calls as the controller makes them (names, numpy strings or integer codes).
    names = fast.feature_names
    for start in range(0, len(rows), 16):
        part = {n: rows.columns[n][start:start + 16] for n in names}
        coded = part | {"domain": np.array([fast.category_code("domain", d) for d in part["domain"]])}
        want_part = plain.predict_matrix(encode(part, plain.schema))
        for given in (part, coded):
            np.testing.assert_array_equal(fast.predict_batch(given), want_part)


def test_without_numba_auto_falls_back_to_lightgbm(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "numba", None)  # what a missing package looks like to `import`
    compiled_predict.cache_clear()
    try:
        loaded = AcceptancePredictor.load(DATA / "predictor")
        assert loaded.backend == "lightgbm" and loaded.forest is None
        assert "numba is not installed" in loaded.backend_reason
        with pytest.raises(PredictorError, match="numba is not installed.*backend='auto' or 'lightgbm'"):
            AcceptancePredictor.load(DATA / "predictor", backend="numba")
    finally:
        compiled_predict.cache_clear()


def test_backend_by_argument_and_environment(monkeypatch) -> None:
    assert AcceptancePredictor.load(DATA / "predictor", backend="lightgbm").backend == "lightgbm"
    monkeypatch.setenv("TREEWISE_PREDICTOR_BACKEND", "lightgbm")
    assert AcceptancePredictor.load(DATA / "predictor").backend == "lightgbm"
    with pytest.raises(PredictorError, match="backend 'fast'"):
        AcceptancePredictor.load(DATA / "predictor", backend="fast")


def test_category_code_matches_the_schema() -> None:
    predictor = AcceptancePredictor.load(DATA / "predictor", backend="lightgbm")
    domains = predictor.schema.features[predictor.feature_names.index("domain")].categories
    assert [predictor.category_code("domain", d) for d in domains] == list(range(len(domains)))
    assert predictor.category_code("domain", "never-seen") == -1
    with pytest.raises(Exception, match="not a categorical"):
        predictor.category_code("depth", "1")
