"""Source folds: whole groups, balanced over all domains (not only within each), so no fold trains on a
sliver of the logs."""

from __future__ import annotations

import numpy as np

from treewise.predictor.crossfit import _group_folds


def test_source_folds_keep_groups_whole_and_balance_rows_across_domains() -> None:
    groups, domains = [], []
    for dom in ("code", "math", "logic"):  # each domain: one large source and two small ones
        for name, size in (("big", 10), ("mid", 4), ("small", 3)):
            groups += [f"{dom}/{name}"] * size
            domains += [dom] * size
    fold, held = _group_folds(np.asarray(groups, dtype=object), np.asarray(domains, dtype=object), 3)
    for g in set(groups):
        assert len({int(f) for f, x in zip(fold, groups, strict=True) if x == g}) == 1  # never split
    rows = np.bincount(fold, minlength=3)
    assert rows.max() - rows.min() <= 10, rows  # the old per-domain reset put all three big groups in fold 0
    assert sorted(g for h in held for g in h) == sorted(set(groups))
