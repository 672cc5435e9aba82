"""``keep_rows``: every way of moving kept slots down (in place, one slice run, an index gather; in a DynamicCache
or in an ArenaCache's blocks) leaves the cache equal to the reference gather of the committed prefix plus the
kept slots."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache

from treewise.decoder.cache.arena import ArenaCache
from treewise.decoder.cache.kvcache import keep_rows

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


# ArenaCache: (key heads, value heads, value dim) per layer; the third layer's heads and the fourth's wider
# values take other blocks than the first two layers.
SHAPES = [(2, 2, DIM), (2, 2, DIM), (3, 3, DIM), (2, 2, DIM + 2)]


def _fill_arena(cache: ArenaCache, length: int, chunks: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Feed ``length`` positions in ``chunks`` forwards; the reference keys and values of every layer."""
    g = torch.Generator().manual_seed(length)
    full = [(torch.randn(1, kh, length, DIM, generator=g), torch.randn(1, vh, length, vd, generator=g))
            for kh, vh, vd in SHAPES]
    bounds = sorted({0, length, *torch.randint(0, length + 1, (chunks - 1,), generator=g).tolist()})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        for layer, (k, v) in enumerate(full):
            cache.update(k[:, :, lo:hi], v[:, :, lo:hi], layer)
    return full


@settings(max_examples=300, deadline=None)
@given(kept_slots(), st.sampled_from([1, 5, 256]))
def test_an_arena_keeps_what_the_reference_gather_keeps(case: tuple[int, int, list[int]], capacity: int) -> None:
    committed, pending, rows = case
    cache = ArenaCache(layers=2, capacity=capacity)  # capacity 1 and 5 force regrowth while filling
    full = _fill_arena(cache, committed + pending)
    keep_rows(cache, committed, rows)
    index = torch.tensor(list(range(committed)) + rows, dtype=torch.long)
    assert cache.get_seq_length() == committed + len(rows)
    for layer, (k, v) in zip(cache.layers, full, strict=True):
        assert torch.equal(layer.keys, k[:, :, index]) and torch.equal(layer.values, v[:, :, index])
    # What comes after compaction lands right behind the kept rows.
    k_new, v_new = torch.ones(1, 2, 1, DIM), torch.ones(1, 2, 1, DIM)
    keys, values = cache.update(k_new, v_new, 0)
    assert torch.equal(keys, torch.cat([full[0][0][:, :, index], k_new], dim=2))
    assert torch.equal(values, torch.cat([full[0][1][:, :, index], v_new], dim=2))


def test_the_layers_share_blocks_by_shape() -> None:
    cache = ArenaCache(layers=4)
    _fill_arena(cache, 6)
    assert len(cache.blocks) == 3  # (2 heads), (3 heads), and the wider values' own block
    assert sum(block.used for block in cache.blocks.values()) == 5  # the last layer takes a key and a value slot
