"""``keep_rows``: every way of moving kept slots down (in place, one slice run, an index gather) leaves the cache
equal to the reference gather of the committed prefix plus the kept slots."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from decoder.kvcache import keep_rows

LAYERS, HEADS, DIM = 3, 2, 4


def _cache(length: int) -> DynamicCache:
    cache = DynamicCache()
    g = torch.Generator().manual_seed(length)
    for layer in range(LAYERS):
        k, v = torch.randn(1, HEADS, length, DIM, generator=g), torch.randn(1, HEADS, length, DIM, generator=g)
        cache.update(k, v, layer)
    return cache


@st.composite
def kept_slots(draw: st.DrawFn) -> tuple[int, int, list[int]]:
    committed = draw(st.integers(min_value=0, max_value=6))
    pending = draw(st.integers(min_value=1, max_value=12))
    slots = draw(st.lists(st.integers(min_value=0, max_value=pending - 1), unique=True, max_size=pending))
    return committed, pending, sorted(committed + s for s in slots)


@settings(max_examples=300, deadline=None)
@given(kept_slots())
def test_keep_rows_equals_the_reference_gather(case: tuple[int, int, list[int]]) -> None:
    committed, pending, rows = case
    cache = _cache(committed + pending)
    ref = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    keep_rows(cache, committed, rows)
    index = torch.tensor(list(range(committed)) + rows, dtype=torch.long)
    assert cache.get_seq_length() == committed + len(rows)
    for layer, (k, v) in zip(cache.layers, ref, strict=True):
        assert torch.equal(layer.keys, k[:, :, index]) and torch.equal(layer.values, v[:, :, index])


def test_the_common_cases_are_covered() -> None:
    """The three paths on purpose: in place (a prefix), one non-overlapping run, and a gather."""
    for rows in ([10, 11], [10, 11, 15, 16], [10, 13, 17], [10, 12, 13]):  # the last: a run that overlaps
        cache = _cache(20)
        ref = [layer.keys.clone() for layer in cache.layers]
        keep_rows(cache, 10, rows)
        index = torch.tensor(list(range(10)) + rows)
        assert all(torch.equal(layer.keys, k[:, :, index]) for layer, k in zip(cache.layers, ref, strict=True))
