"""The fresh collection suite: ShareGPT parsing of a cut-off file, and selection that never repeats a
prompt of the excluded suite (its ids or its texts)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from treewise.studies.pair.corpus.fresh import FreshConfig, excluded, parse_first_turns, select
from treewise.studies.pair.corpus.sources import SourceMissing


def _conv(cid: str, first: str, text: str) -> dict:
    return {"id": cid, "conversations": [{"from": first, "value": text}, {"from": "gpt", "value": "ok"}]}


def test_parse_first_turns_reads_whole_objects_and_stops_at_a_cut_off_tail() -> None:
    convs = [_conv("a", "human", "Hello there, how are you?"), _conv("b", "gpt", "I start"),
             _conv("c", "human", "Second question here")]
    text = json.dumps(convs, indent=2)
    cut = text[: text.rindex('"Second')]  # the last object is cut in half, as in the packaged file
    assert list(parse_first_turns(text, 10)) == [("a", "Hello there, how are you?"), ("c", "Second question here")]
    assert list(parse_first_turns(cut, 10)) == [("a", "Hello there, how are you?")]
    assert list(parse_first_turns(text, 1)) == [("a", "Hello there, how are you?")]


def test_select_leaves_out_excluded_ids_and_texts_and_balances_sources(tmp_path: Path) -> None:
    suite = tmp_path / "prompts"
    suite.mkdir()
    rows = [{"id": "code-humaneval-1", "domain": "code", "prompt": "def f():\n", "split": "train"},
            {"id": "code-x-9", "domain": "code", "prompt": "Write a loop in Python please.", "split": "test"}]
    (suite / "code.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    ids, texts = excluded(suite)
    assert ids == {"humaneval-1", "x-9"}
    cands = [("humaneval-1", "def g(a, b):\n    pass\n", "human-eval"),  # id excluded
             ("sharegpt-7", "  Write a loop in Python please.\n", "sharegpt"),  # text excluded
             ("sharegpt-8", "Explain list comprehensions to me.", "sharegpt"),
             ("sharegpt-9", "Explain list comprehensions to me.", "sharegpt"),  # duplicate text
             ("sharegpt-10", "x" * 800, "sharegpt"),  # too long
             ("sharegpt-11", "short", "sharegpt"),  # too short
             ("sharegpt-12", "What does the walrus operator do?", "sharegpt"),
             ("humaneval-2", "def add(a, b):\n    '''Add two numbers.'''\n", "human-eval")]
    cfg = FreshConfig(per_domain=2)
    chosen = select("code", cands, ids, texts, cfg)
    assert len(chosen) == 2
    assert {r["source"] for r in chosen} == {"sharegpt", "human-eval"}  # one from each source first
    assert all(r["id"].startswith("code-") and r["domain"] == "code" for r in chosen)
    assert sum(r["split"] == "tune" for r in chosen) == round(2 * cfg.tune_share)
    everything = select("code", cands, ids, texts, FreshConfig(per_domain=10))
    assert sorted(r["id"] for r in everything) == ["code-humaneval-2", "code-sharegpt-12", "code-sharegpt-8"]
    assert [r["split"] for r in everything].count("tune") == 1  # round(3 * 0.2): a fifth goes to tuning


def test_several_suites_are_left_out_and_a_missing_one_is_one_clear_error(tmp_path: Path) -> None:
    for name, pid, text in (("a", "code-x-1", "Write a loop in Python please."), ("b", "math-y-2", "Add 2 and 3.")):
        (tmp_path / name).mkdir()
        row = {"id": pid, "domain": pid.split("-")[0], "prompt": text, "split": "train"}
        (tmp_path / name / "p.jsonl").write_text(json.dumps(row) + "\n", encoding="utf-8")
    ids, texts = excluded(tmp_path / "a", tmp_path / "b")
    assert ids == {"x-1", "y-2"} and texts == {"Write a loop in Python please.", "Add 2 and 3."}
    with pytest.raises(SourceMissing, match="--exclude .*nope: no such suite folder"):
        excluded(tmp_path / "a", tmp_path / "nope")
