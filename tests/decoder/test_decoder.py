"""End-to-end losslessness: speculative greedy equals the target's own greedy decoding token for token."""

import random

import pytest
import torch
from conftest import ARCHS, make_model
from transformers import DynamicCache

from treewise.decoder import Chain, StaticTree, TreeDecoder
from treewise.decoder.loop.engine import Run
from treewise.decoder.verify import Sampling

SHAPES = {
    "chain": Chain(4),
    "wide": StaticTree(width=4, depth=2),
    "deep": StaticTree(branching=(2, 1, 1, 1, 1, 1)),
    "w1d1": StaticTree(width=1, depth=1),
    "binary": StaticTree(width=2, depth=3),
}


def _prompts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz (){}:=+-*0123456789.,\n"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(n)]


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tokenizer):
    arch = request.param
    return make_model(arch, 0, layers=2), make_model(arch, 1, layers=1), tokenizer


def test_greedy_equals_target_generate(pair) -> None:
    target, draft, tok = pair
    dec = TreeDecoder(target, draft, tok)
    mismatches = []
    for prompt in _prompts(30):
        ref = dec.generate_plain(prompt, max_new_tokens=20)
        for name, shape in SHAPES.items():  # 30 prompts x every shape
            out = dec.generate(prompt, max_new_tokens=20, tree=shape)
            if out.token_ids != ref.token_ids:
                mismatches.append((prompt, name))
    assert mismatches == []


def test_identical_draft_accepts_whole_tree(pair) -> None:
    target, _, tok = pair
    dec = TreeDecoder(target, target, tok)
    for shape in (Chain(3), StaticTree(width=2, depth=4)):
        out = dec.generate("abc", max_new_tokens=60, tree=shape)
        assert out.token_ids == dec.generate_plain("abc", max_new_tokens=60).token_ids
        full = [s for s in out.stats.steps if s.emitted == shape.depth + 1]
        # every step accepts the full depth except where a stop condition cut it
        assert all(s.accepted == shape.depth for s in out.stats.steps[:-1])
        assert len(full) >= len(out.stats.steps) - 1


def test_scrambled_draft_is_still_exact(pair) -> None:
    target, draft, tok = pair
    scrambled = make_model(target.config.model_type, 0, layers=2)
    head = scrambled.get_output_embeddings()
    perm = torch.randperm(head.weight.shape[0], generator=torch.Generator().manual_seed(0))
    head.weight = torch.nn.Parameter(head.weight.detach()[perm].clone())  # unties GPT-2's shared embedding
    dec = TreeDecoder(target, scrambled, tok)
    accepted = 0
    for prompt in _prompts(6, seed=1):
        out = dec.generate(prompt, max_new_tokens=24, tree=StaticTree(2, 3))
        assert out.token_ids == dec.generate_plain(prompt, max_new_tokens=24).token_ids
        accepted += out.stats.accepted
    assert accepted < 0.2 * 6 * 24


def test_eos_inside_tree_and_max_new_tokens(pair) -> None:
    target, _, tok = pair
    dec = TreeDecoder(target, target, tok)  # accepts whole paths, so stops land inside them
    plain = dec.generate_plain("xyz", max_new_tokens=30).token_ids
    eos = next(t for k, t in enumerate(plain) if k >= 3 and t not in plain[:k])
    old = target.generation_config.eos_token_id
    target.generation_config.eos_token_id = eos
    try:
        dec_eos = TreeDecoder(target, target, tok)
        ref = dec_eos.generate_plain("xyz", max_new_tokens=30)
        out = dec_eos.generate("xyz", max_new_tokens=30, tree=StaticTree(2, 5))
        assert out.token_ids == ref.token_ids and out.token_ids[-1] == eos and out.finish_reason == "eos"
    finally:
        target.generation_config.eos_token_id = old
    for n in range(1, 10):
        out = dec.generate("xyz", max_new_tokens=n, tree=StaticTree(2, 4))
        assert out.token_ids == plain[:n] and out.finish_reason in ("length", "eos")


def test_context_limit_stops_cleanly(tokenizer) -> None:
    target, draft = make_model("llama", 0, max_pos=40), make_model("llama", 1, layers=1, max_pos=40)
    target.generation_config.eos_token_id = None
    dec = TreeDecoder(target, draft, tokenizer)
    out = dec.generate("abcdefghij", max_new_tokens=100, tree=StaticTree(2, 4))
    assert out.finish_reason == "context"
    assert len(out.prompt_ids) + len(out.token_ids) == 40


def _kv(model, ids: torch.Tensor) -> DynamicCache:
    cache = DynamicCache()
    model(input_ids=ids[None], cache=cache, use_cache=True)
    return cache


def test_cache_compaction_matches_plain_kv(pair) -> None:
    target, draft, tok = pair
    dec = TreeDecoder(target, draft, tok)
    req = dec._new_request(tok("hello tree").input_ids, max_new_tokens=25)
    run = Run(StaticTree(3, 3), Sampling(), "topk", None, "d", "p", "r", None)
    with torch.inference_mode():
        dec._loop(req, run)
        for model, cache in ((target, req.target_cache), (draft, req.draft_cache)):
            n = cache.get_seq_length()
            assert n >= req.seq.numel() - 3 and (model is draft or n == req.seq.numel() - 1)
            ref = _kv(model, req.seq[:n])
            for got, want in zip(cache.layers, ref.layers, strict=True):
                torch.testing.assert_close(got.keys, want.keys, atol=1e-4, rtol=1e-4)
                torch.testing.assert_close(got.values, want.values, atol=1e-4, rtol=1e-4)


def test_stats_add_up(pair) -> None:
    target, draft, tok = pair
    out = TreeDecoder(target, draft, tok).generate("stats", max_new_tokens=16, tree=StaticTree(2, 2))
    st = out.stats
    assert st.new_tokens == len(out.token_ids) == 16
    assert st.tau == pytest.approx(1 + st.accepted / st.n_steps)
    assert all(s.verified <= s.drafted and s.accepted <= s.verified for s in st.steps)
    assert 0 <= st.overhead_share < 1 and st.total_s >= st.draft_s + st.verify_s
