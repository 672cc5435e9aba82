"""The copy-heavy suite data/prompts/copy.jsonl: deterministic, equal to its generator's output, balanced, and
every prompt holds the text its answer copies (taken from the split it belongs to)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from treewise.studies.pair.corpus import copy_suite
from treewise.studies.shared.suites import load_suite

DATA = Path(__file__).resolve().parents[2] / "data"
SHIPPED = DATA / "prompts" / "copy.jsonl"


@pytest.fixture(scope="module")
def items() -> list[tuple[dict, str]]:
    return copy_suite.build_items()


def _rows(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / "prompts" / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


def test_generator_is_deterministic_and_matches_the_shipped_file(items, tmp_path) -> None:
    rows = [row for row, _ in items]
    assert copy_suite.build() == rows
    assert [json.loads(line) for line in SHIPPED.read_text(encoding="utf-8").splitlines()] == rows
    out = tmp_path / "copy.jsonl"
    assert copy_suite.write(out) == 40
    assert out.read_bytes() == SHIPPED.read_bytes()  # stale file: `python -m studies.pair.corpus.copy_suite`
    assert copy_suite.build(seed=copy_suite.SEED + 1) != rows


def test_forty_records_split_and_balanced(items) -> None:
    rows = [row for row, _ in items]
    assert len(rows) == 40
    assert Counter(r["split"] for r in rows) == {"test": 24, "tune": 8, "train": 8}
    assert {r["domain"] for r in rows} == {"copy"}
    assert len({r["id"] for r in rows}) == 40
    kinds = Counter(r["source"] for r in rows)
    assert set(kinds) == {f"generated:copy-{k}" for k in copy_suite.KINDS} and set(kinds.values()) <= {13, 14}
    for r in rows:
        kind = r["source"].removeprefix("generated:copy-")
        assert re.fullmatch(rf"copy-{kind}-\d+", r["id"])
        assert r["prompt"].startswith("### Instruction:\n") and r["prompt"].endswith("\n\n### Response:\n")
    assert Counter((r["source"], r["split"]) for r in rows)[("generated:copy-code", "test")] == 8
    loaded = [p for p in load_suite(DATA / "prompts") if p.domain == "copy"]  # the suite loader accepts it
    assert [p.id for p in loaded] == [r["id"] for r in rows]


def test_each_prompt_holds_what_its_answer_copies(items) -> None:
    for row, content in items:
        assert content and content in row["prompt"], row["id"]
        assert len(content) >= 0.5 * len(row["prompt"]), row["id"]  # most of the prompt is to be copied


def test_code_prompts_copy_real_code_of_their_split(items) -> None:
    code = {(r["split"], r["prompt"].strip("\n").rstrip()) for r in _rows("code") if r["source"] != "mt-bench"}
    for row, content in items:
        if row["source"] != "generated:copy-code":
            continue
        assert (row["split"], content) in code, row["id"]
        assert len(content) <= 900 and content.count("\n") < 25
        renamed = re.search(r"identifier `(\w+)` to `(\w+)`", row["prompt"])
        if renamed:
            assert re.search(rf"\b{renamed[1]}\b", content) and not re.search(rf"\b{renamed[2]}\b", content)
    assert sum("renaming the identifier" in r["prompt"] for r, _ in items) >= 4


def test_reformat_prompts_hold_4_to_6_records(items) -> None:
    for row, content in items:
        if row["source"] != "generated:copy-reformat":
            continue
        lines = content.splitlines()
        if content.startswith("["):
            records = json.loads(content)
            assert 4 <= len(records) <= 6 and len({tuple(r) for r in records}) == 1
        elif content.startswith("|"):
            assert 4 <= len(lines) - 2 <= 6 and len({line.count("|") for line in lines}) == 1
        else:
            assert 4 <= len(lines) - 1 <= 6 and len({line.count(",") for line in lines}) == 1


def test_quote_passages_are_held_out_text_of_their_split(items) -> None:
    for row, content in items:
        if row["source"] != "generated:copy-quote":
            continue
        assert 400 <= len(content) <= 800, row["id"]
        if row["split"] == "test":  # held-out text no suite prompt holds
            source = "\n".join((DATA / "heldout" / f"{d}.txt").read_text(encoding="utf-8")
                               for d in ("knowledge", "creative"))
        else:
            source = "\n".join(r["prompt"] for d in ("knowledge", "creative") for r in _rows(d)
                               if r["split"] == row["split"] and r["source"].startswith("held-out:"))
        assert all(line in source for line in content.splitlines()), row["id"]
        word = re.search(r'contains the word "(\w+)"', row["prompt"])
        if word:
            assert sum(bool(re.search(rf"\b{word[1]}\b", line)) for line in content.splitlines()) >= 2
