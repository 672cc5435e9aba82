"""Collect on the tiny pair: end to end, resume after a crash, shard merge, suite errors, tree specs."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import treewise.studies.collect.collector as collect_mod
from treewise.decoder import Chain, StaticTree
from treewise.studies.acceptance import cli as acceptance_cli
from treewise.studies.acceptance.study import analyze
from treewise.studies.collect import cli as collect_cli
from treewise.studies.collect.collector import CollectConfig, collect, load_decoder, plan_collect, run_collect
from treewise.studies.shared.runs import RunError, load_run
from treewise.studies.shared.treespec import TreeSpecError, parse_tree_spec

DOMAINS = ("dialogue", "code", "math", "logic")


@pytest.fixture(scope="module")
def suite_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("suite")
    for dom in DOMAINS:
        lines = [json.dumps({"id": f"{dom}/{i}", "domain": dom, "prompt": f"The {dom} item {i} says",
                             "split": "test" if i < 3 else "train"}) for i in range(4)]
        (root / f"{dom}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def config(suite_dir: Path, pair: Path, out: Path, **kw: object) -> CollectConfig:
    base = dict(out=out, suite=suite_dir, split="test", tree="static:width=2,depth=3", max_new_tokens=12,
                target=pair / "target", draft=pair / "draft")
    return CollectConfig(**(base | kw))


@pytest.fixture(scope="module")
def full_run(suite_dir: Path, tiny_pair_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "full"
    summary = collect(config(suite_dir, tiny_pair_dir, out))
    assert summary.complete and summary.collected_now == 12
    return out


def test_collect_end_to_end(full_run: Path):
    data = load_run(full_run)
    assert sorted(data.prompts.column("prompt_id").to_pylist()) == sorted(f"{d}/{i}" for d in DOMAINS for i in range(3))
    # Node rows, step log and prompt records agree.
    assert data.nodes.num_rows == sum(r.drafted for r in data.records)
    assert data.steps.num_rows == sum(r.n_steps for r in data.records)
    assert sum(data.steps.column("emitted").to_pylist()) == sum(r.new_tokens for r in data.records)
    assert (full_run / "steps" / "shard-1-of-1.parquet").exists()
    assert (full_run / "prompts" / "shard-1-of-1.parquet").exists()
    manifest = json.loads((full_run / "manifest.json").read_text())
    assert manifest["tree"] == "static:width=2,depth=3" and "torch" in manifest["versions"]
    study = analyze(data.nodes, data.steps, data.prompts)
    assert study.greedy_checked == 12 and study.greedy_mismatches == 0
    assert study.log_consistency_errors == 0
    assert set(study.domains) == set(DOMAINS)
    assert len(study.overall.depth_acceptance) == 3


class Crash(Exception):
    pass


def test_resume_after_interrupt_has_no_duplicates(suite_dir, tiny_pair_dir, tmp_path, monkeypatch):
    cfg = config(suite_dir, tiny_pair_dir, tmp_path / "run")
    decoder = load_decoder(cfg)
    seen: list[str] = []

    def crash_after_three(record):
        seen.append(record.prompt_id)
        if len(seen) == 3:
            raise Crash

    with pytest.raises(Crash):
        run_collect(plan_collect(cfg), decoder, crash_after_three)
    # A second crash between a prompt's node file and its record (as a kill -9 would leave it).
    real_write = collect_mod.write_json_atomic

    def die_on_record(path, obj):
        if path.parent.parent.name == "records":
            raise Crash
        real_write(path, obj)

    monkeypatch.setattr(collect_mod, "write_json_atomic", die_on_record)
    with pytest.raises(Crash):
        run_collect(plan_collect(cfg), decoder)
    monkeypatch.setattr(collect_mod, "write_json_atomic", real_write)
    plan = plan_collect(cfg)
    assert len(plan.done) == 3 and plan.orphans_removed == 1
    summary = run_collect(plan, decoder)
    assert summary.complete and summary.collected_now == 9 and summary.skipped == 3
    data = load_run(cfg.out)
    ids = data.prompts.column("prompt_id").to_pylist()
    assert len(ids) == len(set(ids)) == 12
    keys = list(zip(*(data.nodes.column(c).to_pylist() for c in ("prompt_id", "step", "node_id")), strict=True))
    assert len(keys) == len(set(keys))
    assert len(list((cfg.out / "nodes" / "shard-1-of-1").glob("*.parquet"))) == 12


def test_kill_9_mid_run_loses_nothing_finished(suite_dir, tiny_pair_dir, tmp_path):
    out = tmp_path / "killed"
    args = ["collect", "--suite", str(suite_dir), "--split", "test", "--out", str(out), "--max-new-tokens", "48",
            "--target", str(tiny_pair_dir / "target"), "--draft", str(tiny_pair_dir / "draft")]
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", "from studies.cli import main; main()", *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = out / "records" / "shard-1-of-1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None and len(list(records.glob("*.json"))) < 2:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    survivors = {p.name for p in records.glob("*.json")}
    assert 2 <= len(survivors) < 12, "the collect should have been killed midway"
    cfg = config(suite_dir, tiny_pair_dir, out, max_new_tokens=48)
    summary = collect(cfg)
    assert summary.skipped == len(survivors) and summary.complete
    data = load_run(out)
    assert sorted(data.prompts.column("prompt_id").to_pylist()) == sorted(f"{d}/{i}" for d in DOMAINS for i in range(3))
    assert data.nodes.num_rows == sum(r.drafted for r in data.records)


def test_resume_refuses_other_settings(suite_dir, tiny_pair_dir, full_run, tmp_path):
    with pytest.raises(RunError, match="max_new_tokens"):
        plan_collect(config(suite_dir, tiny_pair_dir, full_run, max_new_tokens=13))
    # A pair retrained in place (same path, other weights) must not be mixed into the run.
    moved = tmp_path / "pair"
    shutil.copytree(tiny_pair_dir, moved)
    cfg = config(suite_dir, moved, tmp_path / "run")
    plan_collect(cfg)
    (moved / "draft" / "config.json").write_text((moved / "draft" / "config.json").read_text() + "\n")
    with pytest.raises(RunError, match="draft_fingerprint"):
        plan_collect(cfg)


def test_two_shards_read_as_one_equal_the_unsharded_run(suite_dir, tiny_pair_dir, tmp_path, full_run):
    out = tmp_path / "sharded"
    parts = [collect(config(suite_dir, tiny_pair_dir, out, shard=f"{i}/2")) for i in (1, 2)]
    assert [p.planned for p in parts] == [6, 6]
    merged, single = load_run(out), load_run(full_run)
    assert sorted(merged.shards_seen) == ["shard-1-of-2", "shard-2-of-2"]
    ids = lambda d: sorted(d.prompts.column("prompt_id").to_pylist())  # noqa: E731
    assert ids(merged) == ids(single)
    # Greedy decoding is deterministic, so the node logs match prompt by prompt.
    per_prompt = lambda d: {r.prompt_id: (r.drafted, r.accepted, r.new_tokens) for r in d.records}  # noqa: E731
    assert per_prompt(merged) == per_prompt(single)
    with pytest.raises(RunError, match="shards"):
        plan_collect(config(suite_dir, tiny_pair_dir, out, shard="1/3"))


def cli_app() -> typer.Typer:
    app = typer.Typer()
    collect_cli.register(app)
    acceptance_cli.register(app)
    return app


def test_malformed_suite_line_names_file_and_line(tmp_path, tiny_pair_dir):
    suite = tmp_path / "bad"
    suite.mkdir()
    (suite / "code.jsonl").write_text('{"id": "a", "domain": "code", "prompt": "x"}\n{"id": "b", "domain": "code"\n')
    result = CliRunner().invoke(cli_app(), ["collect", "--suite", str(suite), "--out", str(tmp_path / "r"),
                                            "--target", str(tiny_pair_dir / "target"),
                                            "--draft", str(tiny_pair_dir / "draft")])
    assert result.exit_code == 2
    flat = "".join(result.output.split())
    assert f"{suite / 'code.jsonl'}:2:" in flat and "Traceback" not in result.output


def test_study_cli_writes_the_json_contract_and_figures(full_run, tmp_path):
    out_json, plots = tmp_path / "study.json", tmp_path / "figs"
    result = CliRunner().invoke(cli_app(), ["study", "acceptance", str(full_run), "--json", str(out_json),
                                            "--plots", str(plots), "--bootstrap-reps", "50"])
    assert result.exit_code == 0, result.output
    study = json.loads(out_json.read_text())
    for dom in DOMAINS:
        d = study["domains"][dom]
        for key in ("acceptance_rate", "tau", "spearman_rho", "mean_entropy"):
            assert key in d
        assert len(d["spearman_ci95"]) == 2 and len(d["depth_acceptance"]) == 3
    assert study["greedy_checked"] == 12 and study["greedy_mismatches"] == 0
    assert [c["id"] for c in study["claims"]] == [1, 2, 3, 4]
    assert all(isinstance(c["holds"], bool) and c["evidence"] for c in study["claims"])
    assert len(list(plots.glob("*.png"))) == 5


def test_study_cli_on_a_missing_run_says_what_to_do(tmp_path):
    result = CliRunner().invoke(cli_app(), ["study", "acceptance", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "treewise collect" in result.output


def test_tree_specs():
    assert parse_tree_spec("static:width=2,depth=3").build() == StaticTree(width=2, depth=3)
    assert parse_tree_spec(" static:depth=6, width=4").canonical == "static:width=4,depth=6"
    assert parse_tree_spec("chain:length=5").build() == Chain(length=5)
    wide = parse_tree_spec("static:branching=4-2-1-1-1-1")
    assert wide.canonical == "static:branching=4-2-1-1-1-1"
    assert wide.build() == StaticTree(branching=(4, 2, 1, 1, 1, 1))
    for bad, needle in (("beam:width=2", "unknown tree kind"), ("static:width=2", "missing width or depth"),
                        ("static:width=2,depth=3,branching=2-2", "not both"), ("chain:", "missing length"),
                        ("static:width=two,depth=3", "not of type int"),
                        ("static:width=2,depth=3,x=1", "unknown parameter"), ("chain:5", "not key=value")):
        with pytest.raises(TreeSpecError, match=needle):
            parse_tree_spec(bad).build()


def test_batched_collect_writes_the_same_node_rows(suite_dir: Path, tiny_pair_dir: Path, tmp_path: Path,
                                                   full_run: Path) -> None:
    """--batch-size 8 (a continuous batch: rows join as others end) logs exactly the node rows of --batch-size 1
    (the module's full run) for the same prompts, also when interrupted after three prompts and resumed: each
    prompt is committed as its row ends, so the interruption loses only the rows still decoding."""
    cfg = config(suite_dir, tiny_pair_dir, tmp_path / "batched", batch_size=8)
    decoder = load_decoder(cfg)
    seen: list[str] = []

    def crash_after_three(record):
        seen.append(record.prompt_id)
        if len(seen) == 3:
            raise Crash

    with pytest.raises(Crash):
        run_collect(plan_collect(cfg), decoder, crash_after_three)
    plan = plan_collect(cfg)
    assert len(plan.done) == 3
    summary = run_collect(plan, decoder)
    assert summary.complete and summary.collected_now == 9 and summary.skipped == 3
    keys = [("prompt_id", "ascending"), ("step", "ascending"), ("node_id", "ascending")]
    solo, batched = load_run(full_run).nodes.sort_by(keys), load_run(tmp_path / "batched").nodes.sort_by(keys)
    assert solo.num_rows == batched.num_rows > 0
    for name in solo.column_names:
        if name == "run_id":
            continue  # the run folder's name
        a, b = solo.column(name).to_pylist(), batched.column(name).to_pylist()
        if isinstance(a[0], float):
            assert a == pytest.approx(b, abs=1e-4, nan_ok=True), name
        else:
            assert a == b, name
    assert all(r.greedy_match for r in load_run(tmp_path / "batched").records)
