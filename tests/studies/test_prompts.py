"""The prompt suites: well formed, balanced splits, and no prompt text in the training corpus."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from treewise.studies.pair.corpus.prompts import Fingerprint
from treewise.studies.shared.suites import load_suite

DATA = Path(__file__).resolve().parents[2] / "data"
DOMAINS = ("code", "math", "logic", "dialogue", "knowledge", "creative", "structured", "instruction")
SUITES = (*DOMAINS, "copy")  # copy.jsonl: a 40-prompt benchmark suite, checked in test_copy_suite.py


@pytest.fixture(scope="module")
def prompts():
    return load_suite(DATA / "prompts")


def test_every_domain_has_enough_prompts(prompts):
    counts = Counter(p.domain for p in prompts)
    assert set(counts) == set(SUITES)
    assert all(counts[d] >= 60 for d in DOMAINS), counts
    for p in prompts:
        assert p.split in ("train", "tune", "test") and p.source and p.prompt.strip()
        assert p.id.startswith(p.domain + "-")


def test_splits_are_disjoint_and_about_50_25_25(prompts):
    for domain in DOMAINS:
        mine = [p for p in prompts if p.domain == domain]
        by_split = {s: {p.prompt for p in mine if p.split == s} for s in ("train", "tune", "test")}
        assert not by_split["train"] & by_split["tune"]
        assert not by_split["train"] & by_split["test"]
        assert not by_split["tune"] & by_split["test"]
        share = Counter(p.split for p in mine)
        assert abs(share["train"] / len(mine) - 0.5) < 0.05
        assert abs(share["test"] / len(mine) - 0.25) < 0.05


def test_each_split_mixes_sources(prompts):
    for domain in DOMAINS:
        test_sources = {p.source.split(":")[0] for p in prompts if p.domain == domain and p.split == "test"}
        assert test_sources, domain


def test_no_prompt_in_training_corpus(prompts):
    fp = Fingerprint.load(DATA / "corpus_fingerprint.npz")
    assert fp.bits.any()
    leaks = {p.id: fp.leak_fraction(p.prompt) for p in prompts}
    assert not {k: v for k, v in leaks.items() if v >= 0.5}


def test_fingerprint_detects_corpus_text():
    """The filter does flag text that is in the corpus (held-out snippets are not; a known line is)."""
    fp = Fingerprint.load(DATA / "corpus_fingerprint.npz")
    known = (DATA / "heldout" / "fingerprint_probe.txt").read_text(encoding="utf-8")
    assert fp.leak_fraction(known) >= 0.9


def test_demo_picks_two_test_prompts_per_domain_from_distinct_sources(prompts, monkeypatch):
    from treewise.studies.pair.demo import data_dir, pick_prompts

    monkeypatch.setenv("TREEWISE_DATA", "/somewhere/else")
    assert str(data_dir()) == "/somewhere/else"
    monkeypatch.delenv("TREEWISE_DATA")
    assert data_dir() == DATA
    chosen = pick_prompts([p for p in prompts if p.split == "test"], 2)
    assert Counter(p.domain for p in chosen) == {d: 2 for d in SUITES}
    for domain in DOMAINS:
        sources = {p.source.split(":")[0] for p in chosen if p.domain == domain}
        assert len(sources) == 2, domain
