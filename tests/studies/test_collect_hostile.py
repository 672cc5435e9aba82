"""Collect against hostile conditions: a second writer on the same shard, a process killed with SIGKILL
while holding the shard, a node-log part truncated after the run (a full disk, a crash mid-copy)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from treewise.studies.acceptance import cli as acceptance_cli
from treewise.studies.collect import cli as collect_cli
from treewise.studies.collect.collector import CollectConfig, collect, plan_collect
from treewise.studies.learn import cli as learn_cli
from treewise.studies.shared.locks import LockedError
from treewise.studies.shared.runs import load_run

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def suite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("suite")
    for dom in ("code", "math"):
        lines = [json.dumps({"id": f"{dom}/{i}", "domain": dom, "prompt": f"The {dom} item {i} says",
                             "split": "test"}) for i in range(3)]
        (root / f"{dom}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def _args(suite: Path, pair: Path, out: Path, tokens: int) -> list[str]:
    return ["collect", "--suite", str(suite), "--split", "test", "--out", str(out), "--max-new-tokens", str(tokens),
            "--target", str(pair / "target"), "--draft", str(pair / "draft")]


def _config(suite: Path, pair: Path, out: Path, tokens: int) -> CollectConfig:
    return CollectConfig(out=out, suite=suite, split="test", max_new_tokens=tokens, target=pair / "target",
                         draft=pair / "draft")


def _app() -> typer.Typer:
    app = typer.Typer()
    for job in (collect_cli, acceptance_cli, learn_cli):
        job.register(app)
    return app


def test_second_writer_is_refused_and_a_killed_writer_leaves_no_stale_lock(suite, tiny_pair_dir, tmp_path):
    out = tmp_path / "run"
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-c", "from studies.cli import main; main()",
                              *_args(suite, tiny_pair_dir, out, 64)],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    records = out / "records" / "shard-1-of-1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None and not list(records.glob("*.json")):
        time.sleep(0.005)
    # Frozen while it holds the shard: a fast machine could otherwise finish the whole collect before the
    # second writer looks (SIGKILL below still ends a stopped process).
    first.send_signal(signal.SIGSTOP)
    try:
        assert first.poll() is None, "the first collect should still be running"
        # A second writer on the same shard: refused before it touches anything (it would delete the first
        # one's unfinished node file as an orphan), with the holder named.
        second = CliRunner().invoke(_app(), _args(suite, tiny_pair_dir, out, 64))
        assert second.exit_code == 2
        flat = " ".join(second.output.split())
        assert f"is being written by pid {first.pid}" in flat and "another --out" in flat
        assert "Traceback" not in second.output
        with pytest.raises(LockedError):
            plan_collect(_config(suite, tiny_pair_dir, out, 64))
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    survivors = len(list(records.glob("*.json")))
    assert 1 <= survivors < 6, "the first collect should have been killed midway"
    # The kernel dropped the dead writer's lock: the same command resumes where it stopped.
    summary = collect(_config(suite, tiny_pair_dir, out, 64))
    assert summary.complete and summary.skipped == survivors and summary.collected_now == 6 - survivors
    data = load_run(out)
    assert sorted(data.prompts.column("prompt_id").to_pylist()) == sorted(f"{d}/{i}" for d in ("code", "math")
                                                                         for i in range(3))
    assert data.nodes.num_rows == sum(r.drafted for r in data.records)


def test_truncated_node_part_is_named_then_recollected(suite, tiny_pair_dir, tmp_path):
    out = tmp_path / "run"
    assert collect(_config(suite, tiny_pair_dir, out, 8)).complete
    record = json.loads(sorted((out / "records" / "shard-1-of-1").glob("*.json"))[0].read_text())
    part = out / record["node_file"]
    data = part.read_bytes()
    part.write_bytes(data[: len(data) // 2])
    runner, app = CliRunner(), _app()
    for args, code in ((["study", "acceptance", str(out)], 2), (["train", str(out), "--out", str(tmp_path / "p")], 1)):
        result = runner.invoke(app, args)
        flat = "".join(result.output.split())
        assert result.exit_code == code, result.output
        assert "".join(str(part).split()) in flat and "truncatedorcorrupt" in flat and "Traceback" not in flat
    # Resuming the run drops the damaged prompt's record with its part and collects it again.
    result = runner.invoke(app, _args(suite, tiny_pair_dir, out, 8))
    assert result.exit_code == 0, result.output
    assert "1 prompts with a damaged node file will be collected again" in " ".join(result.output.split())
    run = load_run(out)
    assert len(run.records) == 6 and run.nodes.num_rows == sum(r.drafted for r in run.records)


def test_unknown_domain_names_the_known_ones(suite, tiny_pair_dir, tmp_path):
    result = CliRunner().invoke(_app(), [*_args(suite, tiny_pair_dir, tmp_path / "r", 8), "--domain", "poetry"])
    assert result.exit_code == 2
    assert "unknown domain 'poetry'" in result.output and "code, math" in result.output
    assert not (tmp_path / "r").exists()  # refused before anything is written


def test_train_reads_only_finished_prompts_of_a_run(suite, tiny_pair_dir, tmp_path):
    from treewise.studies.learn.data import read_runs

    out = tmp_path / "run"
    assert collect(_config(suite, tiny_pair_dir, out, 8)).complete
    finished = read_runs([out])
    # A prompt killed between its node part and its record: a complete part without a commit.
    record = sorted((out / "records" / "shard-1-of-1").glob("*.json"))[0]
    meta = json.loads(record.read_text())
    record.unlink()
    unfinished = read_runs([out])
    assert (out / meta["node_file"]).exists()
    assert set(unfinished.column("prompt_id").to_pylist()) == set(finished.column("prompt_id").to_pylist()) - {
        meta["prompt_id"]}
    assert unfinished.num_rows == finished.num_rows - meta["node_rows"]
    assert read_runs([out / "nodes"]).num_rows == finished.num_rows  # a plain folder: every part
