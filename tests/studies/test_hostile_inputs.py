"""Hostile inputs to the commands that fail before any model loads: each ends in one line that names the
problem and the fix, and a non-zero exit (docs/reliability.md lists them all)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from treewise.studies.collect import cli as collect_cli
from treewise.studies.learn import cli as learn_cli
from treewise.studies.shared.runs import RunError, read_manifest, read_record


def _app() -> typer.Typer:
    app = typer.Typer()
    collect_cli.register(app)
    learn_cli.register(app)
    return app


def _one_line(output: str) -> str:
    assert "Traceback" not in output
    return " ".join(output.split())


@pytest.fixture()
def suite(tmp_path: Path) -> Path:
    root = tmp_path / "suite"
    root.mkdir()
    (root / "code.jsonl").write_text(json.dumps({"id": "c1", "domain": "code", "prompt": "x = "}) + "\n")
    return root


@pytest.mark.parametrize(("shard", "needle"), [("x", "use I/N"), ("0/2", "need 1 <= I <= N"), ("3/2", "need 1")])
def test_bad_shard(suite, tmp_path, shard, needle) -> None:
    result = CliRunner().invoke(_app(), ["collect", "--suite", str(suite), "--out", str(tmp_path / "r"),
                                         "--shard", shard])
    assert result.exit_code == 2 and needle in _one_line(result.output)


def test_missing_model_folder_for_collect(suite, tmp_path) -> None:
    result = CliRunner().invoke(_app(), ["collect", "--suite", str(suite), "--out", str(tmp_path / "r"),
                                         "--target", str(tmp_path / "nope"), "--draft", str(tmp_path / "nope2")])
    assert result.exit_code == 2
    assert "not found: train the embedded pair with `treewise train-pair`" in _one_line(result.output)


def test_garbage_train_config(tmp_path) -> None:
    (tmp_path / "c.json").write_text("[")
    result = CliRunner().invoke(_app(), ["train", str(tmp_path), "--config", str(tmp_path / "c.json")])
    assert result.exit_code == 1 and "cannot read --config" in _one_line(result.output)


def test_evaluate_with_a_garbage_model_names_it(tmp_path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for name in ("model.txt", "feature_schema.json", "config.json"):
        (model / name).write_text("garbage")
    result = CliRunner().invoke(_app(), ["evaluate", str(tmp_path), "--model", str(model)])
    assert result.exit_code == 1
    flat = "".join(_one_line(result.output).split())  # rich wraps long paths mid-word
    assert "model/feature_schema.json:unreadable" in flat and "treewisetrain" in flat


@pytest.mark.parametrize(("text", "needle"), [
    ("{", "Invalid JSON"), ('{"tree": 1}', "tree: Input should be a valid string"), ("", "Invalid JSON")])
def test_corrupt_manifest_and_record_name_the_field(tmp_path, text, needle) -> None:
    (tmp_path / "manifest.json").write_text(text)
    with pytest.raises(RunError, match=f"manifest.json: not a treewise run manifest \\({needle}.*new --out"):
        read_manifest(tmp_path)
    (tmp_path / "r.json").write_text(text)
    with pytest.raises(RunError, match="r.json: unreadable prompt record \\(.*delete it to re-collect"):
        read_record(tmp_path / "r.json")


def _pair_app() -> typer.Typer:
    from treewise.studies.pair import cli as pair_cli

    app = typer.Typer()
    pair_cli.register(app)
    return app


def test_demo_without_a_pair(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path))
    result = CliRunner().invoke(_pair_app(), ["demo"])
    assert result.exit_code == 2
    assert f"no model pair under {tmp_path / 'models'}: run `treewise train-pair`" in _one_line(result.output)


def test_pair_report_without_its_work_folder(tmp_path) -> None:
    result = CliRunner().invoke(_pair_app(), ["pair-report", "--models", str(tmp_path), "--work",
                                              str(tmp_path / "nowork")])
    assert result.exit_code == 2
    flat = "".join(_one_line(result.output).split())
    assert "nowork/tokens.npzismissing:pass--work" in flat


def test_train_pair_on_a_missing_device(tmp_path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    result = CliRunner().invoke(_pair_app(), ["train-pair", "--device", "cuda", "--work", str(tmp_path / "w"),
                                              "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "no CUDA device here; use --device cpu or auto" in _one_line(result.output)
