"""The bench's measurement: rows shuffled per prompt and repeat (no row always runs right after the same row),
and paired ratios with a bootstrap interval over prompts."""

from collections import Counter
from itertools import pairwise

import numpy as np
import pytest

from treewise.studies.shared.measure import measure, paired_ratio, rank_rows, row_order
from treewise.studies.shared.suites import Prompt


def test_row_order_is_a_seeded_permutation() -> None:
    names = ["plain", "a", "b", "c"]
    assert sorted(row_order(names, 0, 0)) == sorted(names)
    assert row_order(names, 1, 7) == row_order(names, 1, 7)  # a rerun repeats the order
    assert len({tuple(row_order(names, r, i)) for r in range(3) for i in range(20)}) > 10


def test_measure_balances_which_row_runs_before_which() -> None:
    """Each ordered pair of rows occurs back to back; the rotation per repeat it replaced kept each row's
    predecessor fixed (learned_no_online always ran right after learned)."""
    calls: list[str] = []

    def runner(name: str):
        def run(prompt: Prompt) -> str:
            calls.append(name)
            return name
        return run

    names = ["plain", "learned", "learned_no_online"]
    prompts = [Prompt(id=f"p{i}", domain="code", prompt="x") for i in range(24)]
    runs = measure({n: runner(n) for n in names}, prompts, repeats=2)
    assert all(len(runs.by_row[n][p.id]) == 2 for n in names for p in prompts)  # every row, prompt, repeat
    assert list(runs.by_row) == names  # reports list the rows in their given order
    timed = calls[len(names):]  # after the warm-up pass
    follows = Counter(pairwise(timed))
    for a in names:
        for b in names:
            if a != b:
                assert follows[(a, b)] >= 5, (a, b, follows)


def test_paired_ratio_pools_prompts_and_brackets_the_ratio() -> None:
    tokens = np.full(40, 64.0)
    slow = np.random.default_rng(1).uniform(0.5, 2.0, 40)  # prompts differ a lot; a is exactly twice as fast
    ratio, (lo, hi) = paired_ratio(tokens, slow / 2, tokens, slow)
    assert ratio == pytest.approx(2.0) and lo == pytest.approx(2.0) and hi == pytest.approx(2.0)
    noise = np.random.default_rng(2).normal(1.0, 0.05, 40)  # the same rows with per-prompt timing noise
    ratio, (lo, hi) = paired_ratio(tokens, slow * noise, tokens, slow)
    pooled = slow.sum() / (slow * noise).sum()
    assert ratio == pytest.approx(pooled) and lo < ratio < hi and hi - lo < 0.1
    assert paired_ratio(tokens, slow, tokens, slow, seed=3) == paired_ratio(tokens, slow, tokens, slow, seed=3)


def test_rank_rows_ties_only_what_the_interval_cannot_separate() -> None:
    """Rows fastest first; a row within noise of the fastest is tied with it, a clearly slower one is not, and
    which of two tied rows comes first is just their pooled figure."""
    rng = np.random.default_rng(4)
    tokens, base = np.full(60, 64.0), rng.uniform(0.5, 2.0, 60)  # per-prompt seconds differ a lot
    rows = {
        "fast": (tokens, base * rng.normal(1.0, 0.05, 60)),
        "twin": (tokens, base * rng.normal(1.0, 0.05, 60)),  # the same speed, other noise
        "slow": (tokens, base * 1.25 * rng.normal(1.0, 0.05, 60)),
        "plain": (tokens, base * 2.0),
    }
    ranked = rank_rows(rows, {"fast": "learned", "twin": "learned:online=false", "slow": "static:width=2"})
    assert [r.row for r in ranked][2:] == ["slow", "plain"]
    top, second = ranked[0], ranked[1]
    assert {top.row, second.row} == {"fast", "twin"} and top.vs_fastest == 1.0 and top.tied
    assert second.tied and second.ci95[0] < 1.0 <= second.ci95[1]
    slow = ranked[2]
    assert not slow.tied and slow.ci95[1] < 1.0 and slow.vs_fastest == pytest.approx(0.8, abs=0.03)
    assert [r.policy for r in ranked] == ["learned", "learned", "static", "plain"]
    assert ranked[3].vs_fastest == pytest.approx(rows[top.row][1].sum() / rows["plain"][1].sum())
    assert rank_rows({}, {}) == []
