"""The compiled predictor (lleaves) against LightGBM on real node logs, and its on-disk cache."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest

from treewise.decoder import NodeLogWriter, StaticTree, TreeDecoder
from treewise.decoder.nodelog import read_node_logs
from treewise.predictor import AcceptancePredictor, select_rows
from treewise.predictor.compiled import CACHE_DIR, DIGEST_SUFFIX, OBJECT_SUFFIX
from treewise.predictor.features import NodeRows, encode
from treewise.predictor.model import PredictorError

DATA = Path(__file__).resolve().parents[2] / "data"
SHIPPED = ("model.txt", "feature_schema.json", "config.json", "calibration.json")

pytest.importorskip("lleaves", reason="lleaves is a core dependency; without it only the fallback exists")
pytestmark = pytest.mark.skipif(
    not (DATA / "models" / "target" / "config.json").exists() or not (DATA / "predictor" / "model.txt").exists(),
    reason="needs the embedded pair (data/models) and the shipped predictor (data/predictor)",
)


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> NodeRows:
    """Every verified node of a few real decodes of the embedded pair (one of them in a domain the model never
    saw, so its code is a missing value), with the features training uses."""
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


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the shipped predictor, compiled once (its cache is copied by the tests that need one)."""
    folder = _copy(DATA / "predictor", tmp_path_factory.mktemp("predictor"), cache=False)
    assert AcceptancePredictor.load(folder, backend="lleaves").forest.built
    return folder


def _copy(src: Path, dst: Path, cache: bool = True) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in SHIPPED:
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    if cache and (src / CACHE_DIR).is_dir():
        shutil.copytree(src / CACHE_DIR, dst / CACHE_DIR)
    return dst


def _objects(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"*{OBJECT_SUFFIX}"))


def test_compiled_predictions_equal_lightgbm_on_real_node_logs(model_dir: Path, rows: NodeRows) -> None:
    compiled = AcceptancePredictor.load(model_dir, backend="lleaves")
    plain = AcceptancePredictor.load(model_dir, backend="lightgbm")
    assert (compiled.backend, plain.backend) == ("lleaves", "lightgbm")
    assert not compiled.forest.built  # the fixture's build was reused
    x = encode(rows.columns, compiled.schema)
    assert len(x) > 200 and np.isnan(x[:, compiled.feature_names.index("domain")]).any()  # the unseen domain
    np.testing.assert_allclose(compiled.predict_raw(x), plain.booster.predict(x, num_threads=1), rtol=0, atol=1e-6)
    np.testing.assert_allclose(compiled.predict_rows(rows), plain.predict_rows(rows), rtol=0, atol=1e-6)
    # Frontier-sized calls as the controller makes them (object arrays of names, numpy strings or integer codes),
    # against LightGBM on features.encode's matrix; 150 rows outgrow the reused buffer, later calls rebind it.
    names = compiled.feature_names
    for start, size in [(0, 150), *((s, 16) for s in range(150, len(rows), 16))]:
        part = {n: rows.columns[n][start:start + size] for n in names}
        want = plain.predict_matrix(encode(part, plain.schema))
        coded = part | {"domain": np.array([compiled.category_code("domain", d) for d in part["domain"]])}
        strings = part | {"token_type": np.array(part["token_type"].tolist())}
        for predictor in (compiled, plain):
            for given in (part, coded, strings):
                np.testing.assert_allclose(predictor.predict_batch(given), want, rtol=0, atol=1e-6)


def test_second_load_reuses_the_cache(model_dir: Path) -> None:
    (obj,) = _objects(model_dir / CACHE_DIR)
    before = obj.stat().st_mtime_ns
    again = AcceptancePredictor.load(model_dir)
    assert again.backend == "lleaves" and not again.forest.built and again.forest.source == str(obj)
    assert obj.stat().st_mtime_ns == before


def test_a_changed_model_is_rebuilt_and_the_old_build_dropped(model_dir: Path, rows: NodeRows, tmp_path) -> None:
    folder = _copy(model_dir, tmp_path / "p")
    (old,) = _objects(folder / CACHE_DIR)
    lgb.Booster(model_file=str(folder / "model.txt")).save_model(str(folder / "model.txt"), num_iteration=40)
    changed = AcceptancePredictor.load(folder)
    assert changed.forest.built and _objects(folder / CACHE_DIR) == [Path(changed.forest.source)] != [old]
    x = encode(rows.columns, changed.schema)
    np.testing.assert_allclose(changed.predict_raw(x), changed.booster.predict(x), rtol=0, atol=1e-6)


@pytest.mark.parametrize("damage", ["truncated", "no digest"])
def test_a_corrupt_cached_build_is_rebuilt(model_dir: Path, rows: NodeRows, tmp_path, damage: str) -> None:
    folder = _copy(model_dir, tmp_path / "p")
    (obj,) = _objects(folder / CACHE_DIR)
    if damage == "truncated":  # a truncated copy: the JIT would be handed a broken object without the digest
        obj.write_bytes(obj.read_bytes()[:1000])
    else:
        obj.with_suffix(DIGEST_SUFFIX).unlink()
    loaded = AcceptancePredictor.load(folder)
    assert loaded.backend == "lleaves" and loaded.forest.built
    x = encode(rows.columns, loaded.schema)
    np.testing.assert_allclose(loaded.predict_raw(x), loaded.booster.predict(x), rtol=0, atol=1e-6)


def test_without_lleaves_auto_falls_back_to_lightgbm(model_dir: Path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "lleaves", None)  # what a missing package looks like to `import`
    loaded = AcceptancePredictor.load(model_dir)
    assert loaded.backend == "lightgbm" and loaded.forest is None
    assert "LightGBM fallback" in loaded.backend_reason and "lleaves is not installed" in loaded.backend_reason
    with pytest.raises(PredictorError, match="lleaves is not installed.*backend='auto' or 'lightgbm'"):
        AcceptancePredictor.load(model_dir, backend="lleaves")


def test_backend_by_argument_and_environment(model_dir: Path, monkeypatch) -> None:
    assert AcceptancePredictor.load(model_dir, backend="lightgbm").backend == "lightgbm"
    monkeypatch.setenv("TREEWISE_PREDICTOR_BACKEND", "lightgbm")
    assert AcceptancePredictor.load(model_dir).backend == "lightgbm"
    assert AcceptancePredictor.load(model_dir, backend="auto").backend == "lleaves"
    with pytest.raises(ValueError, match="backend 'fast'"):
        AcceptancePredictor.load(model_dir, backend="fast")


def test_unwritable_model_folder_caches_in_the_user_cache_then_in_memory(model_dir: Path, tmp_path,
                                                                         monkeypatch) -> None:
    folder = _copy(model_dir, tmp_path / "p")
    shutil.rmtree(folder / CACHE_DIR)
    (folder / CACHE_DIR).write_text("a file where the cache folder would go")  # unwritable, even for root
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    first = AcceptancePredictor.load(folder)
    assert first.backend == "lleaves" and Path(first.forest.source).parent == tmp_path / "cache/treewise/compiled"
    assert not AcceptancePredictor.load(folder).forest.built
    (tmp_path / "blocked").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocked"))
    assert AcceptancePredictor.load(folder).forest.source == "memory"


def test_category_code_matches_the_schema(model_dir: Path) -> None:
    predictor = AcceptancePredictor.load(model_dir, backend="lightgbm")
    domains = predictor.schema.features[predictor.feature_names.index("domain")].categories
    assert [predictor.category_code("domain", d) for d in domains] == list(range(len(domains)))
    assert predictor.category_code("domain", "never-seen") == -1
    with pytest.raises(Exception, match="not a categorical"):
        predictor.category_code("depth", "1")
