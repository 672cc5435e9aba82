"""`treewise tune` on many machines: four `--worker` processes, started at once on a fresh PostgreSQL database
(nothing has created Optuna's tables), share one study per domain, then a finalising run (`--trials 0`) writes
the budgets. Needs a server: TREEWISE_PG_URL (`.ci/run` starts a throwaway cluster and sets it, so there it runs
and cannot be skipped); without it the test is skipped."""

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from treewise.controller import BudgetsFile, DomainBudget, load_budgets, save_budgets
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


WORKERS = 4


def test_workers_started_at_once_on_a_fresh_database_and_a_finalising_run(tiny_pair_dir, tmp_path,
                                                                         fresh_pg_db) -> None:
    url = fresh_pg_db()
    suite = tmp_path / "suite"
    suite.mkdir()
    for dom in ("chat", "code"):
        rows = [{"id": f"{dom}-{s}{i}", "domain": dom, "prompt": f"{dom} {s} {i}: a b c", "split": s}
                for s in ("tune", "test") for i in range(2)]
        (suite / f"{dom}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    name, out = "pg", tmp_path / "budgets.json"
    common = ["tune", "--suite", str(suite), "--storage", url, "--study-name", name, "--family", "static",
              "--family", "confidence", "--max-new-tokens", "8", "--per-domain", "1", "--repeats", "1",
              "--pruner", "none", "--budgets-out", str(out), "--target", str(tiny_pair_dir / "target"),
              "--draft", str(tiny_pair_dir / "draft")]
    # the budgets file's entries are each study's warm start: queued once, by the worker that creates the study
    incumbent = DomainBudget(policy="static", node_budget=6, max_depth=2, max_width=3)
    save_budgets(BudgetsFile(default=incumbent, domains={"chat": incumbent, "code": incumbent}), out)
    before = out.read_bytes()
    # Every worker starts before anything has touched the database: each one's first open may create the schema.
    workers = [_treewise([*common, "--trials", "2", "--worker", "--seed", str(seed)], tmp_path)
               for seed in range(1, WORKERS + 1)]
    outputs = [w.communicate(timeout=600)[0] for w in workers]
    assert [w.returncode for w in workers] == [0] * WORKERS, outputs
    assert out.read_bytes() == before  # workers write no budgets
    final = _treewise([*common, "--trials", "0", "--heldout-per-domain", "1", "--json",
                       str(tmp_path / "tune.json")], tmp_path)
    output = final.communicate(timeout=600)[0]
    assert final.returncode == 0, output
    storage = open_storage(url)
    trials_per_study = 2 * WORKERS
    for dom in ("chat", "code"):
        study = optuna.load_study(study_name=f"{name}-{dom}", storage=storage)
        trials = study.get_trials()
        assert [t.state.name for t in trials] == ["COMPLETE"] * trials_per_study  # none failed
        assert {t.user_attrs["budget"]["policy"] for t in trials} <= {"static", "confidence"}
        assert sum("warm_start" in t.user_attrs for t in trials) == 1  # the others found the study made
    report = json.loads((tmp_path / "tune.json").read_text())
    assert report["storage"] == url and set(report["domains"]) == {"chat", "code"}
    budgets = load_budgets(out)
    assert set(budgets.domains) == {"chat", "code"}
    assert budgets.provenance.trials == 2 * trials_per_study and budgets.provenance.storage == url
    for rep in report["domains"].values():
        assert rep["states"]["COMPLETE"] == trials_per_study and rep["states"]["FAIL"] == 0
        assert rep["heldout"]["rows"]["tuned"]["mismatches"] == 0
    assert f"resuming study {name}-chat: {trials_per_study} trials already there ({trials_per_study} complete" \
        in " ".join(output.split())
