"""The benchmark command end to end on a tiny local pair: rows, JSON contract, zero mismatches."""

import json

from typer.testing import CliRunner

from studies.cli import app


def _suite(tmp_path):
    d = tmp_path / "suite"
    d.mkdir()
    for dom in ("code", "dialogue"):
        lines = [json.dumps({"id": f"{dom}{i}", "domain": dom, "prompt": f"{dom} prompt {i}:", "split": "test"})
                 for i in range(2)]
        (d / f"{dom}.jsonl").write_text("\n".join(lines) + "\n")
    return d


def test_bench_cli_json(tiny_pair_dir, tmp_path) -> None:
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, [
        "bench", "--suite", str(_suite(tmp_path)), "--split", "test", "--max-new-tokens", "12", "--repeats", "2",
        "--target", str(tiny_pair_dir / "target"), "--draft", str(tiny_pair_dir / "draft"), "--json", str(out),
        "--tree", "wide=static:width=4,depth=2",
    ])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    rows = set(data["policies"])
    assert {"plain", "hf_assisted", "chain", "static", "confidence", "dynamic_chain", "wide"} <= rows
    assert "learned" in rows or "learned" in data["skipped"]  # needs the shipped predictor
    for name, row in data["policies"].items():
        for key in ("tau", "verified_per_step", "drafted_per_step", "tokens_per_s", "speedup", "mismatches"):
            assert key in row and key in row["per_domain"]["code"]
        assert row["mismatches"] == 0, name
        assert row["tokens_per_s"] > 0
    assert data["policies"]["plain"]["speedup"] == 1.0
    assert data["policies"]["static"]["spec"].startswith("static:")
    assert "hf_assisted" in res.output and "treewise bench" in res.output


def test_bench_bad_suite_is_a_clear_error(tiny_pair_dir, tmp_path) -> None:
    res = CliRunner().invoke(app, ["bench", "--suite", str(tmp_path / "missing"),
                                   "--target", str(tiny_pair_dir / "target"), "--draft", str(tiny_pair_dir / "draft")])
    assert res.exit_code != 0
    assert "does not exist" in " ".join(res.output.split())


def test_decode_cli_streams(tiny_pair_dir) -> None:
    res = CliRunner().invoke(app, ["decode", "hello", "--max-new-tokens", "8", "--target",
                                   str(tiny_pair_dir / "target"), "--draft", str(tiny_pair_dir / "draft")])
    assert res.exit_code == 0, res.output
    assert "steps, tau" in res.output and "finish:" in res.output
    res = CliRunner().invoke(app, ["decode", "hello", "--policy", "confidence", "--max-new-tokens", "6", "--target",
                                   str(tiny_pair_dir / "target"), "--draft", str(tiny_pair_dir / "draft")])
    assert res.exit_code == 0, res.output


def test_latency_cli_writes_a_profile(tiny_pair_dir, tmp_path) -> None:
    from controller import LatencyProfile

    out = tmp_path / "latency.json"
    res = CliRunner().invoke(app, ["latency", "--out", str(out), "--context", "16", "--target",
                                   str(tiny_pair_dir / "target"), "--draft", str(tiny_pair_dir / "draft")])
    assert res.exit_code == 0, res.output
    profile = LatencyProfile.model_validate_json(out.read_text())
    assert profile.sizes[0] == 1 and all(t > 0 for t in profile.target_ms + profile.draft_ms)
    assert profile.target_time(100) >= profile.target_time(64) > 0  # never cheaper past the measured sizes
