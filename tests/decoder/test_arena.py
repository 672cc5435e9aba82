"""``ArenaCache``: the stock model sees the same keys and values as with a ``DynamicCache``; slice runs never
overlap; what it does not do says so; the token buffer appends. (Its compaction: test_kvcache.py.)"""

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from treewise.decoder.cache.arena import ArenaCache, _runs
from treewise.decoder.cache.kvcache import keep_rows
from treewise.decoder.errors import TreewiseError
from treewise.decoder.loop.step import Request


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
    cache.update(torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8), 0)
    with pytest.raises(TreewiseError, match="one sequence"):
        cache.layers[0].batch_select_indices(torch.tensor([0]))
    with pytest.raises(TreewiseError, match="offloaded"):
        cache.layers[0].offload()
    cache.crop(-1)
    assert cache.get_seq_length() == 3


def test_a_request_appends_into_one_buffer() -> None:
    req = Request(seq=torch.tensor([5, 6, 7]), prompt_len=3, max_new_tokens=2)
    root = req.seq[-1:]
    for tokens in ([8], [9, 10], [11] * 5):  # the last overflows the first capacity (3 + 2 + 1)
        req.extend(tokens)
    assert req.seq.tolist() == [5, 6, 7, 8, 9, 10, 11, 11, 11, 11, 11]
    assert root.tolist() == [7]  # a view handed out before the appends still reads its token
