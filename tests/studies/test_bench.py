"""The benchmark command end to end on a tiny local pair: rows, JSON contract, zero mismatches."""

import json

from conftest import write_suite
from typer.testing import CliRunner

from treewise.studies.cli import app


def test_bench_cli_json(tiny_pair_dir, tmp_path) -> None:
    out = tmp_path / "bench.json"
    res = CliRunner().invoke(app, [
        "bench", "--suite", str(write_suite(tmp_path)), "--split", "test", "--max-new-tokens", "12", "--repeats", "2",
        "--target", str(tiny_pair_dir / "target"), "--draft", str(tiny_pair_dir / "draft"), "--json", str(out),
        "--tree", "wide=static:width=4,depth=2", "--compare", "static:chain", "--compare", "static:no_such_row",
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
    assert data["policies"]["plain"]["speedup"] == 1.0 and data["policies"]["plain"]["speedup_ci95"] == [1.0, 1.0]
    lo, hi = data["policies"]["static"]["speedup_ci95"]
    assert 0 < lo <= hi
    assert [(p["a"], p["b"]) for p in data["paired"]] == [("static", "chain")]
    assert data["paired"][0]["ci95"][0] <= data["paired"][0]["ci95"][1] and data["paired"][0]["prompts"] >= 1
    assert data["policies"]["static"]["spec"].startswith("static:")
    ranking = data["ranking"]  # every row once, fastest first, each against the fastest
    assert sorted(r["row"] for r in ranking) == sorted(rows)
    assert [r["tokens_per_s"] for r in ranking] == sorted((r["tokens_per_s"] for r in ranking), reverse=True)
    assert ranking[0]["vs_fastest"] == 1.0 and ranking[0]["tied"]
    assert {r["row"]: r["policy"] for r in ranking}["wide"] == "static"  # the policy its spec names
    assert all(r["ci95"][0] <= r["ci95"][1] for r in ranking)
    assert "fastest:" in res.output
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
    from treewise.controller import LatencyProfile

    out = tmp_path / "latency.json"
    res = CliRunner().invoke(app, ["latency", "--out", str(out), "--context", "16", "--target",
                                   str(tiny_pair_dir / "target"), "--draft", str(tiny_pair_dir / "draft")])
    assert res.exit_code == 0, res.output
    profile = LatencyProfile.model_validate_json(out.read_text())
    assert profile.sizes[0] == 1 and all(t > 0 for t in profile.target_ms + profile.draft_ms)
    assert profile.target_time(100) >= profile.target_time(64) > 0  # never cheaper past the measured sizes


def test_batched_bench_json_contract(tokenizer, tmp_path) -> None:
    """Every (batch size, row) pair is measured against batched plain decoding; rows match solo greedy."""
    from conftest import make_model

    from treewise.decoder import TreeDecoder
    from treewise.studies.bench.batched import PLAIN, BatchBenchResult, run_batch_bench
    from treewise.studies.shared.suites import Prompt

    dec = TreeDecoder(make_model("llama", 0), make_model("llama", 1, layers=1), tokenizer)
    prompts = [Prompt(id=f"p{i}", domain="code", prompt=text) for i, text in
               enumerate(["def f(x):", "hello world", "12 + 7 =", "abc", "tree decoding is"])]
    result = run_batch_bench(dec, prompts, [1, 2], {"static": "static:width=2,depth=2", "chain": "chain:length=3"},
                             max_new_tokens=12, repeats=2, continuous={"flow": "static:width=2,depth=2"})
    again = BatchBenchResult.model_validate_json(result.model_dump_json())
    assert [(r.batch_size, r.row) for r in again.rows] == [(b, n) for b in (1, 2)
                                                           for n in (PLAIN, "static", "chain", "flow")]
    for r in again.rows:
        assert r.mismatches == 0 and r.new_tokens > 0 and r.tokens_per_s > 0 and r.step_ms > 0
        assert (r.target_ms_per_step is None) == (r.row == PLAIN)
        if r.row == PLAIN:
            assert r.speedup == 1.0 and r.tau is None
        else:
            assert r.tau is not None and r.tau >= 1
            assert abs(r.draft_share + r.verify_share + r.other_share - 1) < 1e-6
    from treewise.studies.bench.report import plot_batch_bench

    png = plot_batch_bench(again, tmp_path / "batched.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


def test_compare_took_the_old_pair_option_and_pair_names_a_model_pair(tiny_pair_dir, tmp_path) -> None:
    """`--compare A:B` pairs rows; `--pair` names a model pair, so the old `--pair A:B` fails naming the pairs."""
    common = ["bench", "--suite", str(write_suite(tmp_path)), "--target", str(tiny_pair_dir / "target"), "--draft",
              str(tiny_pair_dir / "draft")]
    res = CliRunner().invoke(app, [*common, "--pair", "static:chain"])
    assert res.exit_code == 2 and "unknown model pair 'static:chain': choose one of smollm2, micro" in res.output
    res = CliRunner().invoke(app, [*common, "--compare", "static"])
    assert res.exit_code == 2 and "--compare 'static': use A:B" in " ".join(res.output.split())
