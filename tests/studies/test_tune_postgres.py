"""`treewise tune` on many machines: two `--worker` processes share one PostgreSQL study, then a finalising run
(`--trials 0`) writes the budgets. Needs a server: TREEWISE_PG_URL (`.ci/run` starts a throwaway cluster and sets
it, so there it runs and cannot be skipped); without it the test is skipped."""

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import optuna
import pytest

from treewise.controller import load_budgets
from treewise.studies.tune.results import open_storage

ROOT = Path(__file__).resolve().parents[2]
PG_URL = os.environ.get("TREEWISE_PG_URL")

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.skipif(not PG_URL, reason="no PostgreSQL: set TREEWISE_PG_URL=postgresql://USER@HOST:PORT/DB "
                                          "(.ci/run starts a throwaway cluster and sets it)"),
]


def _treewise(args: list[str], tmp_path: Path) -> subprocess.Popen:
    (tmp_path / "data").mkdir(exist_ok=True)  # an empty data folder: no shipped predictor or budgets
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TREEWISE_DATA": str(tmp_path / "data"), "PYTHONPATH": str(ROOT),
           "COLUMNS": "200"}
    return subprocess.Popen([sys.executable, "-c", "from treewise.studies.cli import main; main()", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_two_workers_and_a_finalising_run_on_postgresql(tiny_pair_dir, tmp_path) -> None:
    assert PG_URL is not None
    suite = tmp_path / "suite"
    suite.mkdir()
    for dom in ("chat", "code"):
        rows = [{"id": f"{dom}-{s}{i}", "domain": dom, "prompt": f"{dom} {s} {i}: a b c", "split": s}
                for s in ("tune", "test") for i in range(2)]
        (suite / f"{dom}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    name, out = f"pg-{uuid.uuid4().hex[:8]}", tmp_path / "budgets.json"
    common = ["tune", "--suite", str(suite), "--storage", PG_URL, "--study-name", name, "--family", "static",
              "--family", "confidence", "--max-new-tokens", "8", "--per-domain", "1", "--repeats", "1",
              "--pruner", "none", "--budgets-out", str(out), "--target", str(tiny_pair_dir / "target"),
              "--draft", str(tiny_pair_dir / "draft")]
    storage = open_storage(PG_URL)  # connects now: an unreachable server fails here, it is not skipped
    try:
        workers = [_treewise([*common, "--trials", "2", "--worker", "--seed", str(seed)], tmp_path) for seed in (1, 2)]
        outputs = [w.communicate(timeout=600)[0] for w in workers]
        assert [w.returncode for w in workers] == [0, 0], outputs
        assert not out.exists()  # workers write no budgets
        final = _treewise([*common, "--trials", "0", "--heldout-per-domain", "1", "--json",
                           str(tmp_path / "tune.json")], tmp_path)
        output = final.communicate(timeout=600)[0]
        assert final.returncode == 0, output
        for dom in ("chat", "code"):
            trials = optuna.load_study(study_name=f"{name}-{dom}", storage=storage).get_trials()
            assert [t.state.name for t in trials] == ["COMPLETE"] * 4  # 2 workers x 2 trials, none failed
            assert {t.user_attrs["budget"]["policy"] for t in trials} <= {"static", "confidence"}
        report = json.loads((tmp_path / "tune.json").read_text())
        assert report["storage"] == PG_URL and set(report["domains"]) == {"chat", "code"}
        budgets = load_budgets(out)
        assert set(budgets.domains) == {"chat", "code"}
        assert budgets.provenance.trials == 8 and budgets.provenance.storage == PG_URL
        for rep in report["domains"].values():
            assert rep["states"]["COMPLETE"] == 4 and rep["states"]["FAIL"] == 0
            assert rep["heldout"]["rows"]["tuned"]["mismatches"] == 0
        assert f"resuming study {name}-chat: 4 trials already there (4 complete" in " ".join(output.split())
    finally:
        for dom in ("chat", "code"):
            try:
                optuna.delete_study(study_name=f"{name}-{dom}", storage=storage)
            except KeyError:
                pass
