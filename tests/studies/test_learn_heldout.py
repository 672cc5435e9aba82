"""`treewise evaluate --split-by`, `treewise train --suite-split` and `treewise bench --only` from the CLI."""

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from treewise.decoder.records.nodelog import write_atomic
from treewise.predictor.synthetic import SyntheticSpec, make_synthetic_logs


def _fixture(tmp_path: Path) -> tuple[Path, Path]:
    """A run folder of synthetic logs and a suite naming each prompt's split and source."""
    run = tmp_path / "runs" / "syn" / "nodes"
    run.mkdir(parents=True)
    table = make_synthetic_logs(SyntheticSpec(prompts_per_domain=12, steps=6, seed=4))
    write_atomic([table], run / "nodes-a.parquet")
    suite = tmp_path / "suite"
    suite.mkdir()
    ids = sorted(set(table.column("prompt_id").to_pylist()))
    sources = ["mt-bench", "reasoning-gym:gcd", "reasoning-gym:lcm", "generated"]
    for domain in ("code", "math", "chat"):
        lines = [json.dumps({"id": p, "domain": domain, "prompt": p, "split": ("train", "tune", "test")[i % 3],
                             "source": sources[i % 4]})
                 for i, p in enumerate(q for q in ids if q.startswith(domain))]
        (suite / f"{domain}.jsonl").write_text("\n".join(lines) + "\n")
    return run.parent, suite


def _app() -> typer.Typer:
    from treewise.studies.learn.cli import register

    app = typer.Typer()
    register(app)
    return app


def test_evaluate_split_by_source_and_domain(tmp_path: Path) -> None:
    run, suite = _fixture(tmp_path)
    runner = CliRunner()
    config = tmp_path / "cfg.json"
    config.write_text(json.dumps({"num_boost_round": 15}))
    out, md = tmp_path / "held.json", tmp_path / "held.md"
    res = runner.invoke(_app(), ["evaluate", str(run), "--split-by", "source", "--suite", str(suite), "--config",
                                 str(config), "--json", str(out), "--markdown", str(md), "--ablation",
                                 "--ablation-seeds", "2", "--online-grid"])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["split_by"] == "source" and len(report["folds"]) == 3
    assert {"predictor", "predictor+online", "draft_prob", "domain_depth_table"} <= set(report["scorers"])
    assert {"code/reasoning-gym", "math/mt-bench"} <= {g for f in report["folds"] for g in f["held_out"]}
    assert {a["group"] for a in report["ablation"]} >= {"none", "-domain", "+prompt_len"}
    assert len(report["online_grid"]) == 12 and set(report["by_suite_split"]) == {"train", "tune", "test"}
    assert [g["gate"] for g in report["online_gates"]] == [0.0, 2.0, 4.0, 6.0, 9.0]
    assert "| predictor+online |" in md.read_text()
    res = runner.invoke(_app(), ["evaluate", str(run), "--split-by", "domain", "--suite", str(suite), "--config",
                                 str(config), "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert [f["held_out"] for f in json.loads(out.read_text())["folds"]] == [["chat"], ["code"], ["math"]]
    res = runner.invoke(_app(), ["evaluate", str(run), "--split-by", "sources", "--suite", str(suite)])
    assert res.exit_code == 1 and "prompt, source or domain" in res.output
    res = runner.invoke(_app(), ["evaluate", str(run), "--split-by", "source", "--suite", str(tmp_path / "none")])
    assert res.exit_code == 1 and "--suite" in res.output


def test_train_on_one_suite_split_and_evaluate_with_online(tmp_path: Path) -> None:
    run, suite = _fixture(tmp_path)
    runner = CliRunner()
    model, out = tmp_path / "model", tmp_path / "eval.json"
    res = runner.invoke(_app(), ["train", str(run), "--out", str(model), "--suite-split", "train",
                                 "--suite", str(suite)])
    assert res.exit_code == 0, res.output
    split = json.loads((model / "split.json").read_text())
    seen = split["train"] + split["valid"] + split["test"]
    train_ids = {json.loads(line)["id"] for f in suite.glob("*.jsonl") for line in f.read_text().splitlines()
                 if json.loads(line)["split"] == "train"}
    assert set(seen) == train_ids  # nothing outside the suite's train split was read
    res = runner.invoke(_app(), ["evaluate", str(run), "--model", str(model), "--json", str(out),
                                 "--latency-calls", "0"])
    assert res.exit_code == 0, res.output
    report = json.loads(out.read_text())
    assert report["online"]["n"] == report["n"] and report["targets"]["max_domain_ece_online"] is not None
    res = runner.invoke(_app(), ["train", str(run), "--out", str(model), "--suite-split", "nope",
                                 "--suite", str(suite)])
    assert res.exit_code == 1 and "split" in res.output


def test_bench_only_names_unknown_rows() -> None:
    from treewise.studies.cli import app

    res = CliRunner().invoke(app, ["bench", "--only", "nonexistent"])
    assert res.exit_code != 0 and "learned_no_online" in res.output
