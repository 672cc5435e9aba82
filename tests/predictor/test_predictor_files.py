"""A predictor folder on disk: garbage files are named with their fix, and `treewise train` killed with
SIGKILL while it saves leaves the previous predictor loadable (the folder is replaced as a whole)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from treewise.decoder import TreewiseError
from treewise.decoder.records.nodelog import write_atomic
from treewise.predictor import AcceptancePredictor, PredictorConfig, select_rows, train
from treewise.predictor.synthetic import SyntheticSpec, make_synthetic_logs

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Node logs of a synthetic run, as `treewise train` reads them."""
    nodes = tmp_path_factory.mktemp("run") / "nodes"
    nodes.mkdir()
    write_atomic([make_synthetic_logs(SyntheticSpec(prompts_per_domain=12, steps=6, seed=4))], nodes / "n.parquet")
    return nodes.parent


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    logs = make_synthetic_logs(SyntheticSpec(prompts_per_domain=12, steps=6, seed=5))
    return train(logs, PredictorConfig()).save(tmp_path_factory.mktemp("p") / "predictor")


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


@pytest.mark.parametrize(("file", "content", "needle"), [
    ("model.txt", "garbage\n", "model.txt: not a LightGBM model"),
    ("model.txt", "", "model.txt: not a LightGBM model"),
    ("feature_schema.json", "{", "feature_schema.json: unreadable"),
    ("feature_schema.json", "{}", "feature_schema.json: unreadable \\(no field 'features'\\)"),
    ("feature_schema.json", "[1]", "feature_schema.json: unreadable"),
    ("config.json", '{"label": 5}', "config.json: unreadable \\(field label"),
    ("calibration.json", '{"x": [1]}', "calibration.json: unreadable \\(no field 'y'\\)"),
    ("split.json", "\xff", "split.json: unreadable"),
])
def test_garbage_file_is_named_with_the_fix(saved, tmp_path, file, content, needle) -> None:
    folder = _copy(saved, tmp_path / "p")
    (folder / file).write_text(content, encoding="latin-1")
    with pytest.raises(TreewiseError, match=needle) as err:
        AcceptancePredictor.load(folder)
    assert "treewise train" in str(err.value) and "\n" not in str(err.value)


def test_schema_from_another_version_is_named(saved, tmp_path) -> None:
    folder = _copy(saved, tmp_path / "p")
    schema = json.loads((folder / "feature_schema.json").read_text())
    (folder / "feature_schema.json").write_text(json.dumps(schema | {"version": "0"}))
    with pytest.raises(TreewiseError, match="feature schema version '0'.*treewise train"):
        AcceptancePredictor.load(folder)


def _predictions(folder: Path) -> np.ndarray:
    logs = make_synthetic_logs(SyntheticSpec(prompts_per_domain=2, steps=4, seed=9))
    return AcceptancePredictor.load(folder).predict_rows(select_rows(logs))


_KILL_AT = {
    # Mid-fit: nothing of the new predictor exists yet.
    "training": "import os, signal, lightgbm as lgb\n"
                "real_train = lgb.train\n"
                "def train(*a, **k):\n"
                "    booster = real_train(*a, **k); os.kill(os.getpid(), signal.SIGKILL)\n"
                "lgb.train = train\n",
    # The old folder renamed aside, the new one not yet renamed in: the worst moment.
    "between_renames": "import os, signal; real = os.rename; calls = []\n"
                       "def rename(a, b):\n"
                       "    calls.append(a); real(a, b)\n"
                       "    if '.old-' in str(b): os.kill(os.getpid(), signal.SIGKILL)\n"
                       "os.rename = rename\n",
    # Half of model.txt written into the staging folder.
    "writing_model": "import os, signal, lightgbm as lgb\n"
                     "def save_model(self, path, *a, **k):\n"
                     "    open(path, 'w').write(self.model_to_string()[:500])\n"
                     "    os.kill(os.getpid(), signal.SIGKILL)\n"
                     "lgb.Booster.save_model = save_model\n",
}


def _train_cli(run: Path, out: Path, prelude: str = "") -> subprocess.CompletedProcess:
    code = prelude + "from studies.cli import main; main()"
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", code, "train", str(run), "--out", str(out), "--seed", "3"],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("moment", sorted(_KILL_AT))
def test_train_killed_while_saving_leaves_the_previous_predictor(saved, run_dir, tmp_path, moment) -> None:
    out = _copy(saved, tmp_path / "predictor")
    (out / "notes.txt").write_text("kept")  # a user's file in the folder survives every save
    before = _predictions(out)
    killed = _train_cli(run_dir, out, _KILL_AT[moment])
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    np.testing.assert_array_equal(_predictions(out), before)  # the previous predictor, whole
    assert (out / "notes.txt").read_text() == "kept"
    # Rerunning the same command writes the new predictor completely (training has no partial state to resume).
    done = _train_cli(run_dir, out)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    after = _predictions(out)
    assert not np.array_equal(after, before)
    assert (out / "notes.txt").read_text() == "kept"
    assert sorted(p.name for p in out.parent.iterdir() if ".old-" in p.name) == []
    fresh = train(make_synthetic_logs(SyntheticSpec(prompts_per_domain=12, steps=6, seed=4)), PredictorConfig(seed=3))
    np.testing.assert_allclose(after, fresh.predict_rows(select_rows(
        make_synthetic_logs(SyntheticSpec(prompts_per_domain=2, steps=4, seed=9)))))
