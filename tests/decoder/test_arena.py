"""``ArenaCache``: the stock model sees the same keys and values as with a ``DynamicCache``; compaction (slice runs
or a gather, over one or several blocks, after regrowth) equals the reference gather; the token buffer appends."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from decoder.arena import ArenaCache, _runs
from decoder.errors import TreewiseError
from decoder.kvcache import keep_rows
from decoder.step import _Request

DIM = 4
# (key heads, value heads, value dim) per layer: the last two layers differ, so they take other blocks
SHAPES = [(2, 2, DIM), (2, 2, DIM), (3, 3, DIM), (2, 2, DIM + 2)]


def _fill(cache: ArenaCache | DynamicCache, length: int, chunks: int = 3) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Feed ``length`` positions in ``chunks`` forwards; the reference keys and values of every layer."""
    g = torch.Generator().manual_seed(length)
    full = [(torch.randn(1, kh, length, DIM, generator=g), torch.randn(1, vh, length, vd, generator=g))
            for kh, vh, vd in SHAPES]
    bounds = sorted({0, length, *torch.randint(0, length + 1, (chunks - 1,), generator=g).tolist()})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        for layer, (k, v) in enumerate(full):
            cache.update(k[:, :, lo:hi], v[:, :, lo:hi], layer)
    return full


@st.composite
def kept_slots(draw: st.DrawFn) -> tuple[int, int, list[int]]:
    committed = draw(st.integers(min_value=0, max_value=6))
    pending = draw(st.integers(min_value=1, max_value=12))
    slots = draw(st.lists(st.integers(min_value=0, max_value=pending - 1), unique=True, max_size=pending))
    return committed, pending, sorted(committed + s for s in slots)


@settings(max_examples=300, deadline=None)
@given(kept_slots(), st.sampled_from([1, 5, 256]))
def test_keep_equals_the_reference_gather(case: tuple[int, int, list[int]], capacity: int) -> None:
    committed, pending, rows = case
    cache = ArenaCache(layers=2, capacity=capacity)  # capacity 1 and 5 force regrowth while filling
    full = _fill(cache, committed + pending)
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
    _fill(cache, 6)
    assert len(cache.blocks) == 3  # (2 heads), (3 heads), and the wider values' own block
    assert sum(block.used for block in cache.blocks.values()) == 5  # the last layer takes a key and a value slot


def test_runs_are_slices_that_never_overlap() -> None:
    assert _runs(10, [12, 13]) == [(10, 12, 2)]  # destination [10, 12) ends where the source starts
    assert _runs(10, [11, 12]) == [(10, 11, 1), (11, 12, 1)]  # one run would copy onto its own source
    assert _runs(10, [12, 14, 16, 18]) is None  # more runs than slices pay for: one gather
    for dst, src in ((3, [5, 6, 7]), (0, [2, 3, 9]), (0, [1, 2, 9]), (4, [9, 10, 11])):
        runs = _runs(dst, src)
        assert runs is not None
        assert [s + i for _, s, n in runs for i in range(n)] == src
        assert [d + i for d, _, n in runs for i in range(n)] == list(range(dst, dst + len(src)))
        assert all(d + n <= s for d, s, n in runs)


def test_a_stock_model_reads_the_same_cache() -> None:
    """Logits through an ArenaCache equal a DynamicCache's over a prefill, a compaction and two more forwards."""
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 64, (1, 12))
    logits = {}
    for name, cache in (("dynamic", DynamicCache()), ("arena", ArenaCache(layers=3, capacity=8))):
        with torch.inference_mode():
            out = [model(input_ids=ids[:, :8], cache=cache, use_cache=True).logits]
            keep_rows(cache, 5, [6])  # drop position 5, keep 6 as the new position 5
            pos = torch.arange(6, 10)[None]
            out.append(model(input_ids=ids[:, 8:12], position_ids=pos, cache=cache, use_cache=True).logits)
            out.append(model(input_ids=ids[:, :1], position_ids=pos[:, -1:] + 1, cache=cache, use_cache=True).logits)
        logits[name] = out
        assert cache.get_seq_length() == 11
    for a, b in zip(logits["dynamic"], logits["arena"], strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


def test_what_an_arena_does_not_do_says_so() -> None:
    cache = ArenaCache()
    _fill(cache, 4)
    with pytest.raises(TreewiseError, match="one sequence"):
        cache.layers[0].batch_select_indices(torch.tensor([0]))
    with pytest.raises(TreewiseError, match="offloaded"):
        cache.layers[0].offload()
    cache.crop(-1)
    assert cache.get_seq_length() == 3


def test_a_request_appends_into_one_buffer() -> None:
    req = _Request(seq=torch.tensor([5, 6, 7]), prompt_len=3, max_new_tokens=2)
    root = req.seq[-1:]
    for tokens in ([8], [9, 10], [11] * 5):  # the last overflows the first capacity (3 + 2 + 1)
        req.extend(tokens)
    assert req.seq.tolist() == [5, 6, 7, 8, 9, 10, 11, 11, 11, 11, 11]
    assert root.tolist() == [7]  # a view handed out before the appends still reads its token
