"""`treewise tune` killed with SIGKILL, then rerun: what finished survives, the dead worker's trial is failed by
its heartbeat and re-run, the rerun says it resumes, and a budgets file being replaced at the kill stays usable."""

import io
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from rich.console import Console

from treewise.controller import DomainBudget, load_budgets
from treewise.decoder import TreeDecoder
from treewise.studies.tune.config import SearchSpace, TuneConfig
from treewise.studies.tune.report import LiveTuneView
from treewise.studies.tune.results import DEAD_WORKER, open_storage
from treewise.studies.tune.search import tune

ROOT = Path(__file__).resolve().parents[2]

# `treewise tune` with two hooks for the test to kill it at a known point: trial TW_HANG_TRIAL (and only it)
# hangs inside its measurement, and with TW_HANG_REPLACE the rename that installs the budgets file hangs.
# Either hook writes TW_MARKER first. Everything else is the real command line.
_TREEWISE = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    import treewise.studies.tune.search as search

    marker, hang_at = Path(os.environ["TW_MARKER"]), int(os.environ.get("TW_HANG_TRIAL", "-1"))
    measure, replace = search._measure_trial, os.replace

    def hang(what):
        marker.write_text(what)
        time.sleep(600)

    def measure_or_hang(trial, *args, **kwargs):
        if trial.number == hang_at:
            hang(f"trial {trial.number}")
        return measure(trial, *args, **kwargs)

    def replace_or_hang(src, dst, *args, **kwargs):
        if os.environ.get("TW_HANG_REPLACE") and Path(dst).name == "budgets.json":
            hang(f"replacing {dst} by {src}")
        return replace(src, dst, *args, **kwargs)

    search._measure_trial, os.replace = measure_or_hang, replace_or_hang
    from treewise.studies.cli import main
    sys.argv = ["treewise", *sys.argv[1:]]
    main()
""")


@pytest.fixture
def env(tmp_path) -> dict[str, str]:
    (tmp_path / "data").mkdir()  # an empty data folder: the pair's data files are looked up in it (controller.pairs)
    return {**os.environ, "OMP_NUM_THREADS": "1", "TREEWISE_DATA": str(tmp_path / "data"), "PYTHONPATH": str(ROOT),
            "TW_MARKER": str(tmp_path / "marker"), "COLUMNS": "200"}


def _treewise(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _TREEWISE, *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _kill_when_hung(proc: subprocess.Popen, marker: Path) -> str:
    """Wait for the hook's marker, then SIGKILL (no cleanup of any kind runs); returns what was hung on."""
    deadline = time.monotonic() + 300
    while not marker.exists():
        if proc.poll() is not None:
            raise AssertionError(f"exited {proc.returncode} before the kill point:\n{proc.communicate()[0]}")
        assert time.monotonic() < deadline, "the kill point was never reached"
        time.sleep(0.1)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    return marker.read_text()


def _trials(storage: str, name: str) -> list[optuna.trial.FrozenTrial]:
    return optuna.load_study(study_name=name, storage=open_storage(storage)).get_trials()


@pytest.mark.slow
def test_sigkill_mid_trial_then_rerun_continues_and_retries_the_dead_trial(tiny_pair_dir, tmp_path, env) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    lines = [json.dumps({"id": f"code-{s}{i}", "domain": "code", "prompt": f"code {s} {i}: a b c", "split": s})
             for s in ("tune", "test") for i in range(2)]
    (suite / "code.jsonl").write_text("\n".join(lines) + "\n")
    storage, out, marker = f"sqlite:///{tmp_path / 'tune.db'}", tmp_path / "budgets.json", tmp_path / "marker"
    command = ["tune", "--suite", str(suite), "--domain", "code", "--trials", "4", "--storage", storage,
               "--study-name", "k", "--family", "static", "--family", "confidence", "--max-new-tokens", "8",
               "--per-domain", "2", "--heldout-per-domain", "1", "--repeats", "1", "--pruner", "none",
               "--heartbeat", "1", "--budgets-out", str(out), "--json", str(tmp_path / "tune.json"),
               "--target", str(tiny_pair_dir / "target"), "--draft", str(tiny_pair_dir / "draft")]

    # 1. killed in the middle of trial 2: trials 0 and 1 are stored, 2 is left RUNNING by the dead process
    assert _kill_when_hung(_treewise(command, {**env, "TW_HANG_TRIAL": "2"}), marker) == "trial 2"
    before = _trials(storage, "k-code")
    assert [t.state.name for t in before] == ["COMPLETE", "COMPLETE", "RUNNING"]
    time.sleep(4)  # past the grace period (3 heartbeats of 1 s): trial 2's worker is now known dead

    # 2. the same command again: it says it resumes, fails trial 2, re-runs its parameters, adds 4 trials in all
    marker.unlink()
    proc = _treewise(command, {**env, "TW_HANG_TRIAL": "2"})
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, output
    text = " ".join(output.split())
    assert "resuming study k-code: 4 trials already there (2 complete, 0 pruned, 1 failed, 1 of a dead worker " \
           "re-queued for this run)" in text
    after = _trials(storage, "k-code")
    assert [t.state.name for t in after] == ["COMPLETE", "COMPLETE", "FAIL", "COMPLETE", "COMPLETE", "COMPLETE",
                                             "COMPLETE"]
    for old, new in zip(before[:2], after[:2], strict=True):  # what finished before the kill is untouched
        assert (new.params, new.value, new.user_attrs, new.datetime_complete) == \
               (old.params, old.value, old.user_attrs, old.datetime_complete)
    retry = after[3]
    assert retry.system_attrs["failed_trial"] == 2 and retry.params == before[2].params
    assert "retry of #2, whose worker died" in text  # the live table names the take-over
    report = json.loads((tmp_path / "tune.json").read_text())["domains"]["code"]
    assert report["states"]["RUNNING"] == 0 and report["states"]["FAIL"] == 1
    assert report["failures"][0]["number"] == 2 and report["failures"][0]["fail_reason"] == DEAD_WORKER
    best = max((t for t in after if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert report["best"]["number"] == best.number
    budgets = load_budgets(out)
    assert budgets.domains["code"] == DomainBudget.model_validate(best.user_attrs["budget"])
    assert budgets.provenance.trials == 7

    # 3. killed while the finalising run replaces the budgets file: the previous file is intact and loads
    previous = out.read_bytes()
    assert not marker.exists()  # the rerun never hung
    finalise = [*command[:command.index("--trials") + 1], "0", *command[command.index("--trials") + 2:]]
    hung = _kill_when_hung(_treewise(finalise, {**env, "TW_HANG_REPLACE": "1"}), marker)
    assert hung.startswith(f"replacing {out} by ")
    assert out.read_bytes() == previous and load_budgets(out) == budgets
    proc = _treewise(finalise, env)  # and finalising again works, the dead run's temp file notwithstanding
    output = proc.communicate(timeout=600)[0]
    assert proc.returncode == 0, output
    assert load_budgets(out).domains == budgets.domains and load_budgets(out).provenance.trials == 7


def test_live_best_so_far_is_the_storage_best_and_a_rerun_says_it_resumes(tiny_pair_dir, tmp_path,
                                                                          monkeypatch) -> None:
    """A rerun whose own trials all fail still shows, as best so far, the best trial the final report names."""
    (tmp_path / "data").mkdir()  # data_dir() refuses a TREEWISE_DATA that names no folder
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path / "data"))
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "code.jsonl").write_text("\n".join(json.dumps(
        {"id": f"c{i}", "domain": "code", "prompt": f"code {i}: a b", "split": "tune"}) for i in range(2)) + "\n")
    dec = TreeDecoder.from_pretrained(tiny_pair_dir / "target", tiny_pair_dir / "draft")
    cfg = TuneConfig(suite=suite, domains=["code"], trials=2, storage=f"sqlite:///{tmp_path / 't.db'}",
                     study_name="v", finalize=False, max_new_tokens=8, per_domain=1, repeats=1, pruner="none",
                     space=SearchSpace(families=("static",)), latency_cache=tmp_path / "latency")
    tune(cfg, dec=dec)

    def broken(budget: DomainBudget):
        raise RuntimeError("injected")

    buffer = io.StringIO()
    view = LiveTuneView(Console(file=buffer, width=200), ["code"], 1)
    with view:
        result = tune(cfg.model_copy(update={"trials": 1}), dec=dec, policy_factory=broken, on_trial=view.on_trial,
                      on_start=view.start)
    final = result.report.domains["code"]
    assert final.states["FAIL"] == 1 and final.best is not None
    assert view.best["code"].number == final.best.number and view.best["code"].value == final.best.value
    assert "resuming study v-code: 2 trials already there (2 complete, 0 pruned, 0 failed)" in buffer.getvalue()


def test_a_trial_left_running_is_shown_not_hidden_in_the_total(tmp_path) -> None:
    """On a journal file (no heartbeat) a killed worker's trial stays RUNNING: the counts must still add up."""
    from treewise.studies.tune.report import budgets_table
    from treewise.studies.tune.results import build_report

    storage = open_storage(f"journal:///{tmp_path / 'tune.log'}")
    study = optuna.create_study(storage=storage, study_name="j-code", direction="maximize")
    study.set_user_attr("treewise_prefix", "j")
    study.set_user_attr("domain", "code")
    for value in (1.1, 1.2):
        trial = study.ask()
        trial.suggest_int("node_budget", 2, 8)
        study.tell(trial, value)
    study.ask()  # a trial whose worker died: RUNNING forever on a journal file
    report = build_report(storage, "j")
    assert report.domains["code"].states["RUNNING"] == 1 and report.trials == 3
    buffer = io.StringIO()
    Console(file=buffer, width=200).print(budgets_table(report))
    assert "3 (2/0/0, 1 running)" in buffer.getvalue()
