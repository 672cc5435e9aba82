"""``treewise sweep``: every (policy, budget) row against plain decoding, the JSON contract, the target checks."""

import json

import pytest
from conftest import DraftProb, write_suite
from typer.testing import CliRunner

from treewise.studies.bench.sweep_config import SweepConfig
from treewise.studies.cli import app


def _check_contract(data: dict, budgets: list[int], policies: list[str]) -> None:
    assert data["config"]["budgets"] == budgets and data["config"]["policies"] == policies
    assert data["plain"]["speedup"] == 1.0 and data["plain"]["mismatches"] == 0
    assert [(r["policy"], r["budget"]) for r in data["rows"]] == [(p, b) for b in budgets for p in policies]
    for r in data["rows"]:
        for key in ("tau", "verified_per_step", "drafted_per_step", "tokens_per_s", "tokens_per_s_range",
                    "speedup", "mismatches", "spec", "per_domain", "prompts", "new_tokens"):
            assert key in r, key
        assert r["mismatches"] == 0, r["spec"]
        assert r["tau"] >= 1 and r["tokens_per_s"] > 0
        assert 0 <= r["verified_per_step"] <= r["budget"] and r["verified_per_step"] <= r["drafted_per_step"]
        if r["policy"] != "learned":  # the others always fill what they drafted up to the budget; learned's cost
            assert r["verified_per_step"] > 0  # rules may decide that nothing pays (random tiny models)
        assert r["new_tokens"] == data["plain"]["new_tokens"]  # lossless: the same tokens as plain decoding
    checks = {(c["policy"], c["budget"]): c for c in data["checks"]}
    assert set(checks) == {(p, b) for b in budgets for p in policies if p != "confidence"}
    tau = {(r["policy"], r["budget"]): r["tau"] for r in data["rows"]}
    for (p, b), c in checks.items():
        assert c["baseline_tau"] == tau[("confidence", b)] and c["tau"] == tau[(p, b)]
        assert c["gain"] == pytest.approx(c["tau"] / c["baseline_tau"] - 1)
        assert c["met"] == (c["gain"] >= c["required_gain"] - 1e-9)
    assert {c["required_gain"] for c in data["checks"] if c["budget"] == 8} <= {0.05}


def test_run_sweep_json_contract(tokenizer, tmp_path) -> None:
    from conftest import make_model

    from treewise.decoder import TreeDecoder
    from treewise.studies.bench.sweep import SweepResult, run_sweep

    dec = TreeDecoder(make_model("llama", 0), make_model("llama", 1, layers=1), tokenizer)
    cfg = SweepConfig(suite=write_suite(tmp_path), per_domain=1, max_new_tokens=12, budgets=[8, 2, 2], repeats=2)
    result = run_sweep(cfg, dec, predictor=DraftProb(("draft_logprob", "depth", "recent_accept_rate")))
    again = SweepResult.model_validate_json(result.model_dump_json())
    assert again == result
    data = json.loads(result.model_dump_json())
    _check_contract(data, [2, 8], ["confidence", "rerank", "learned", "learned_fill"])
    assert data["predictor"] == {"path": "DraftProb", "model_sha256": None}
    assert result.row("rerank", 8).spec.startswith("rerank:budget=8,")
    assert result.targets_met == all(c.met for c in result.checks if c.policy == "rerank")


def test_sweep_cli_writes_json_markdown_and_plot(tiny_pair_dir, tmp_path) -> None:
    out, md, png = tmp_path / "sweep.json", tmp_path / "sweep.md", tmp_path / "sweep.png"
    res = CliRunner().invoke(app, [
        "sweep", "--suite", str(write_suite(tmp_path)), "--per-domain", "1", "--max-new-tokens", "8",
        "--budgets", "2,4",
        "--target", str(tiny_pair_dir / "target"), "--draft", str(tiny_pair_dir / "draft"),
        "--json", str(out), "--markdown", str(md), "--plot", str(png),
    ])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    _check_contract(data, [2, 4], ["confidence", "rerank", "learned", "learned_fill"])
    assert len(data["predictor"]["model_sha256"]) == 64  # the shipped predictor, identified
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = md.read_text()
    assert "| budget | policy | tau |" in text and "rerank" in text and "budget 4: rerank" in text
    assert "treewise sweep" in res.output


def test_sweep_cli_rejects_bad_budgets(tiny_pair_dir) -> None:
    res = CliRunner().invoke(app, ["sweep", "--budgets", "0,4", "--target", str(tiny_pair_dir / "target")])
    assert res.exit_code == 2 and "budgets" in res.output
    res = CliRunner().invoke(app, ["sweep", "--budgets", "four"])
    assert res.exit_code == 2
