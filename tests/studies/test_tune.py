"""treewise tune / report on tiny models: a study end to end, resume, failures, two workers, the budgets file."""

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import optuna
import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from treewise.controller import DomainBudget, load_budgets
from treewise.decoder import StaticTree, TreeDecoder
from treewise.studies.cli import app
from treewise.studies.tune.config import IntRange, SearchSpace, TuneConfig
from treewise.studies.tune.report import resume_lines
from treewise.studies.tune.results import TuneError, open_storage, study_name_for
from treewise.studies.tune.search import tune

ROOT = Path(__file__).resolve().parents[2]
DOMAINS = ("chat", "code")
FAST = dict(max_new_tokens=8, per_domain=2, heldout_per_domain=2, repeats=1, pruner="none",
            space=SearchSpace(families=("static", "confidence")))


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("suite")
    for dom in DOMAINS:
        lines = [json.dumps({"id": f"{dom}-{split}{i}", "domain": dom, "prompt": f"{dom} {split} {i}: a b c",
                             "split": split}) for split in ("tune", "test") for i in range(2)]
        (d / f"{dom}.jsonl").write_text("\n".join(lines) + "\n")
    return d


@pytest.fixture(scope="module")
def dec(tiny_pair_dir) -> TreeDecoder:
    return TreeDecoder.from_pretrained(tiny_pair_dir / "target", tiny_pair_dir / "draft")


@pytest.fixture(autouse=True)
def no_shipped_data(tmp_path, monkeypatch):
    """data_dir() points at an empty folder: no real predictor or budgets leak into the tests."""
    (tmp_path / "data").mkdir()  # it must exist: data_dir() refuses a TREEWISE_DATA that names no folder
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path / "data"))


def _states(storage: str, name: str) -> list[str]:
    study = optuna.load_study(study_name=name, storage=open_storage(storage))
    return [t.state.name for t in study.get_trials()]


def _cfg(suite: Path, tmp_path: Path, **kw) -> TuneConfig:
    base = dict(FAST, suite=suite, storage=f"sqlite:///{tmp_path / 'tune.db'}", study_name="t",
                budgets_out=tmp_path / "budgets.json", latency_cache=tmp_path / "latency")
    return TuneConfig(**{**base, **kw})


def test_tune_and_report_cli_end_to_end(tiny_pair_dir, suite, tmp_path, monkeypatch) -> None:
    storage, out = f"sqlite:///{tmp_path / 'tune.db'}", tmp_path / "budgets.json"
    args = ["tune", "--suite", str(suite), "--trials", "3", "--storage", storage, "--study-name", "e2e",
            "--family", "static", "--family", "confidence", "--max-new-tokens", "8", "--per-domain", "2",
            "--heldout-per-domain", "2", "--repeats", "1", "--budgets-out", str(out), "--json",
            str(tmp_path / "tune.json"), "--plots", str(tmp_path / "plots"),
            "--target", str(tiny_pair_dir / "target"), "--draft", str(tiny_pair_dir / "draft")]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    budgets = load_budgets(out)  # validated round trip of what tune wrote
    assert set(budgets.domains) == set(DOMAINS)
    assert all(b.policy in ("static", "confidence") for b in budgets.domains.values())
    prov = budgets.provenance
    assert prov is not None and prov.trials == 6 and prov.study_name == "e2e" and prov.storage == storage
    assert prov.command.startswith("treewise tune") and "--trials 3" in prov.command and prov.wall_s > 0
    tuned = json.loads((tmp_path / "tune.json").read_text())
    for dom in DOMAINS:
        rep = tuned["domains"][dom]
        assert rep["states"]["COMPLETE"] == 3 and rep["best"]["value"] > 0
        assert DomainBudget.model_validate(rep["best"]["budget"]) == budgets.domains[dom]
        rows = rep["heldout"]["rows"]
        assert set(rows) == {"plain", "tuned", "best_static"}  # no predictor: the learned defaults are skipped
        assert all(r["mismatches"] == 0 and r["speedup"] > 0 for r in rows.values())
        assert rep["importances"]["values"] or rep["importances"]["note"]
    assert "defaults row skipped" in " ".join(res.output.split())
    assert (tmp_path / "plots" / "code-history.png").read_bytes()[:4] == b"\x89PNG"

    def no_models(*a, **k):
        raise AssertionError("report must not load models")

    monkeypatch.setattr(TreeDecoder, "from_pretrained", no_models)
    res = CliRunner().invoke(app, ["report", "--storage", storage, "--study-name", "e2e", "--json",
                                   str(tmp_path / "report.json")])
    assert res.exit_code == 0, res.output
    again = json.loads((tmp_path / "report.json").read_text())
    assert again["domains"] == tuned["domains"]  # the same report, from storage alone
    assert "held-out speedup" in res.output and "tuned budgets" in res.output


def test_resume_after_interrupt_continues_the_study(dec, suite, tmp_path) -> None:
    calls = []

    def interrupt_second(budget: DomainBudget) -> StaticTree:
        calls.append(budget)
        if len(calls) == 2:
            raise KeyboardInterrupt  # what Ctrl-C raises in the middle of a trial
        return StaticTree(2, 2)

    cfg = _cfg(suite, tmp_path, domains=["code"], trials=3, finalize=False)
    with pytest.raises(KeyboardInterrupt):
        tune(cfg, dec=dec, policy_factory=interrupt_second)
    assert _states(cfg.storage, "t-code") == ["COMPLETE", "FAIL"]  # nothing left RUNNING
    result = tune(cfg.model_copy(update={"trials": 2, "finalize": True}), dec=dec)
    assert _states(cfg.storage, "t-code") == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    assert result.report.domains["code"].trials == 4
    assert load_budgets(cfg.budgets_out).provenance.trials == 4


def test_failing_trial_is_recorded_and_the_study_goes_on(dec, suite, tmp_path) -> None:
    calls = []

    def fail_second(budget: DomainBudget) -> StaticTree:
        calls.append(budget)
        if len(calls) == 2:
            raise RuntimeError("injected policy failure")
        return StaticTree(2, 2)

    cfg = _cfg(suite, tmp_path, domains=["code"], trials=3, heldout_per_domain=0)
    result = tune(cfg, dec=dec, policy_factory=fail_second)
    assert _states(cfg.storage, "t-code") == ["COMPLETE", "FAIL", "COMPLETE"]
    failure = result.report.domains["code"].failures[0]
    assert failure.number == 1 and "injected policy failure" in failure.fail_reason
    assert result.budgets_path == cfg.budgets_out and "code" in load_budgets(cfg.budgets_out).domains


class _Lossy:
    """A decoder whose tree outputs differ from plain decoding in the last token: a broken verifier."""

    def __init__(self, dec: TreeDecoder) -> None:
        self._dec = dec

    def __getattr__(self, name: str):
        return getattr(self._dec, name)

    def generate(self, *args, **kwargs):
        res = self._dec.generate(*args, **kwargs)
        return dataclasses.replace(res, token_ids=res.token_ids[:-1] + [(res.token_ids[-1] + 1) % 96])


def test_greedy_mismatch_fails_the_trial_loudly(dec, suite, tmp_path) -> None:
    cfg = _cfg(suite, tmp_path, domains=["chat"], trials=2)
    result = tune(cfg, dec=_Lossy(dec))
    assert _states(cfg.storage, "t-chat") == ["FAIL", "FAIL"]
    reason = result.report.domains["chat"].failures[0].fail_reason
    last = len(dec.generate_plain("chat tune 0: a b c", 8).token_ids) - 1  # the token _Lossy changed
    assert "GreedyMismatchError" in reason and f"differs from plain decoding at new token {last}" in reason
    assert result.budgets_path is None and not cfg.budgets_out.exists()  # nothing tuned, nothing written


class _DraftProb:
    """A stand-in acceptance predictor: the draft's own probability of the token."""

    feature_names = ["draft_logprob", "depth"]

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.exp(features["draft_logprob"].astype(np.float64))


def test_learned_family_and_defaults_row_with_a_predictor(dec, suite, tmp_path) -> None:
    space = SearchSpace(families=("learned",), node_budget=IntRange(low=2, high=8))
    cfg = _cfg(suite, tmp_path, domains=["code"], trials=2, space=space)
    result = tune(cfg, dec=dec, predictor=_DraftProb())
    best = result.report.domains["code"].best
    assert best is not None and best.budget.policy == "learned" and 2 <= best.budget.node_budget <= 8
    rows = result.report.domains["code"].heldout.rows
    assert set(rows) == {"plain", "tuned", "best_static", "defaults"}
    assert rows["defaults"].budget == DomainBudget() and all(r.mismatches == 0 for r in rows.values())
    assert (tmp_path / "latency").is_dir()  # the learned stop rule ran on a measured profile


_WORKER = """
from treewise.studies.tune.config import SearchSpace, TuneConfig
from treewise.studies.tune.search import tune
tune(TuneConfig(suite={suite!r}, domains=["code"], trials=2, storage={storage!r}, study_name="w", seed={seed},
                finalize=False, max_new_tokens=8, per_domain=1, repeats=1, target={target!r}, draft={draft!r},
                space=SearchSpace(families=("static", "confidence"))))
"""


def test_two_worker_processes_share_one_journal(tiny_pair_dir, suite, tmp_path) -> None:
    storage = f"journal:///{tmp_path / 'tune.log'}"
    assert (tmp_path / "data").is_dir()  # made by no_shipped_data
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TREEWISE_DATA": str(tmp_path / "data"),
           "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_WORKER.format(
        suite=str(suite), storage=storage, seed=seed, target=str(tiny_pair_dir / "target"),
        draft=str(tiny_pair_dir / "draft")))], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for seed in (1, 2)]
    outputs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert _states(storage, "w-code") == ["COMPLETE"] * 4


def test_bad_inputs_name_the_fix(dec, suite, tmp_path) -> None:
    with pytest.raises(ValidationError, match="node_budget range 0..5"):
        SearchSpace(node_budget=IntRange(low=0, high=5))
    with pytest.raises(TuneError, match="unsupported database 'nosuchdb'"):
        open_storage("nosuchdb://x")
    with pytest.raises(TuneError, match="have no 'tune' prompts"):
        tune(_cfg(suite, tmp_path, domains=["math"]), dec=dec)
    with pytest.raises(TuneError, match="needs an acceptance predictor"):
        tune(_cfg(suite, tmp_path, space=SearchSpace(families=("learned",))), dec=dec)
    cfg = _cfg(suite, tmp_path, domains=["code"], trials=1, finalize=False)
    tune(cfg, dec=dec)
    with pytest.raises(TuneError, match="was created with search space"):
        tune(cfg.model_copy(update={"space": SearchSpace(families=("static",))}), dec=dec)
    assert study_name_for("t", "code") == "t-code"


def test_a_new_study_first_measures_the_budgets_files_present_entry(dec, suite, tmp_path) -> None:
    from treewise.controller import BudgetsFile, save_budgets

    present = DomainBudget(policy="static", node_budget=6, max_depth=2, max_width=3)
    outside = DomainBudget(policy="learned", node_budget=8, max_depth=2, max_width=4)  # family not searched
    save_budgets(BudgetsFile(default=outside, domains={"code": present}), tmp_path / "budgets.json")
    seen: list[DomainBudget] = []

    def record(budget: DomainBudget) -> StaticTree:
        seen.append(budget)
        return StaticTree(2, 2)

    cfg = _cfg(suite, tmp_path, trials=2, finalize=False)
    starts: dict = {}
    tune(cfg, dec=dec, policy_factory=record, on_start=starts.update)
    assert starts["code"].states["WAITING"] == 1 and resume_lines(starts) == []  # queued, yet not "resuming"
    # domains run in order (chat, code): chat's default entry lies outside the space, so it is sampled; code's
    # first trial is the incumbent, every field as in the file
    assert seen[0] != outside and seen[0].policy in ("static", "confidence")
    assert seen[2] == present
    first = optuna.load_study(study_name="t-code", storage=open_storage(cfg.storage)).trials[0]
    assert first.user_attrs["warm_start"] == str(cfg.budgets_out)
    seen.clear()
    tune(cfg.model_copy(update={"trials": 1}), dec=dec, policy_factory=record)  # a resumed study: no second queue
    assert len(optuna.load_study(study_name="t-code", storage=open_storage(cfg.storage)).trials) == 3
    cold = _cfg(suite, tmp_path, trials=1, finalize=False, warm_start=False, study_name="cold", domains=["code"])
    seen.clear()
    tune(cold, dec=dec, policy_factory=record)
    assert "warm_start" not in optuna.load_study(study_name="cold-code", storage=open_storage(cfg.storage)
                                                 ).trials[0].user_attrs


def test_the_search_space_bounds_come_from_the_command_line(suite, tmp_path) -> None:
    res = CliRunner().invoke(app, ["tune", "--suite", str(suite), "--node-budget-max", "1",
                                   "--storage", f"sqlite:///{tmp_path / 'x.db'}"])
    assert res.exit_code != 0 and "node_budget range 2..1" in " ".join(res.output.split())
    space = SearchSpace(node_budget=IntRange(low=2, high=12, log=True), max_depth=IntRange(low=1, high=3))
    assert space.params_of(DomainBudget(policy="learned", node_budget=8, max_depth=2, max_width=4)) is not None
    assert space.params_of(DomainBudget(policy="learned", node_budget=16, max_depth=2, max_width=4)) is None
    assert space.params_of(DomainBudget(policy="static", node_budget=8, max_depth=4, max_width=2)) is None


def test_each_domains_study_samples_its_own_points(dec, suite, tmp_path) -> None:
    seen: list[DomainBudget] = []

    def record(budget: DomainBudget) -> StaticTree:
        seen.append(budget)
        return StaticTree(2, 2)

    tune(_cfg(suite, tmp_path, trials=3, finalize=False, warm_start=False), dec=dec, policy_factory=record)
    chat, code = seen[:3], seen[3:]
    assert chat != code  # one seed for every domain used to give every domain the same three budgets
