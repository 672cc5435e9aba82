"""The bench's row order: shuffled per prompt and repeat, so no row always runs right after the same row."""

from collections import Counter
from itertools import pairwise

from studies.shared.measure import measure, row_order
from studies.shared.suites import Prompt


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
