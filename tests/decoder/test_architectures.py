"""Lossless on every verified architecture, with and without sliding windows shorter than the prompt.

Each tiny model is built from the stock transformers class (2 layers, hidden 64, float32). Speculative greedy
must equal two references: the target's own ``model.generate`` and a no-cache recompute of every token.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest
import torch
from conftest import VOCAB, make_tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from treewise.controller import ConfidenceTree, LearnedTree
from treewise.decoder import Chain, StaticTree, TreeDecoder, TreewiseError
from treewise.decoder.capability import FULL, SLIDING, VERIFIED, AttentionLayout, attention_layout
from treewise.decoder.feature_draft import FeatureDraft

WINDOW = 8  # shorter than every prompt below, so the window cuts into the prompt and the tree
NEW = 24
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              tie_word_embeddings=False)
# How each windowed architecture turns a window on; Qwen2/Qwen3 slide only from layer 1 and Gemma2/Gemma3
# alternate, so mixed full/sliding layers (one mask per layer kind) are covered too.
WINDOWED = {
    "mistral": dict(sliding_window=WINDOW),
    "mixtral": dict(sliding_window=WINDOW),
    "phi3": dict(sliding_window=WINDOW),
    "starcoder2": dict(sliding_window=WINDOW),
    "qwen2": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    "qwen3": dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    "gemma2": dict(sliding_window=WINDOW),
    "gemma3_text": dict(sliding_window=WINDOW, layer_types=[SLIDING, FULL]),
}
CASES = [(arch, False) for arch in VERIFIED] + [(arch, True) for arch in WINDOWED]


def build(model_type: str, seed: int, layers: int = 2, window: bool = False, **extra: object) -> PreTrainedModel:
    torch.manual_seed(seed)
    kw = COMMON | {"num_hidden_layers": layers} | (WINDOWED[model_type] if window else {}) | extra
    if "layer_types" in kw:
        kw["layer_types"] = kw["layer_types"][:layers]
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **kw), dtype=torch.float32)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)  # sharper logits: greedy paths neither constant nor noise
    return model.eval()


def prompts(n: int = 4) -> list[str]:
    rng = random.Random(7)
    return ["".join(rng.choice("abcdefghij klmnop(){}=+") for _ in range(rng.randint(14, 30))) for _ in range(n)]


def no_cache_greedy(model: PreTrainedModel, ids: list[int], n: int, eos: int) -> list[int]:
    """Second reference: recompute the whole sequence for every token (no cache, the model's own mask)."""
    seq = list(ids)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
            if seq[-1] == eos:
                break
    return seq[len(ids):]


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module")
def learned():
    return LearnedTree.default()


@pytest.mark.parametrize("arch,window", CASES, ids=[f"{a}{'-window' if w else ''}" for a, w in CASES])
def test_greedy_equals_both_references(arch: str, window: bool, tok, learned) -> None:
    target = build(arch, 0, window=window)
    assert type(target).__name__ == VERIFIED[arch][0]
    if window:
        assert SLIDING in attention_layout(target).kinds
    same = build(arch, 1, layers=1, window=window)
    other = build("gpt2" if arch == "llama" else "llama", 2, layers=1)
    feature = FeatureDraft.from_target(target, torch.arange(4, VOCAB - 8)).eval()  # reads the target's features
    runs = [(same, StaticTree(2, 3)), (same, Chain(4)), (same, ConfidenceTree(budget=8, max_depth=4, top_k=2)),
            (same, learned), (target, StaticTree(2, 3)), (other, Chain(3)), (feature, StaticTree(2, 3)),
            (feature, learned)]
    decoders = {id(d): TreeDecoder(target, d, tok) for d, _ in runs}
    mismatches = []
    for prompt in prompts():
        ref = decoders[id(same)].generate_plain(prompt, max_new_tokens=NEW).token_ids
        assert ref == no_cache_greedy(target, tok(prompt).input_ids, NEW, eos=2), "the two references disagree"
        for draft, policy in runs:
            out = decoders[id(draft)].generate(prompt, max_new_tokens=NEW, tree=policy, domain="code")
            if out.token_ids != ref:
                mismatches.append((prompt, type(draft).__name__, type(policy).__name__))
    assert mismatches == []


@pytest.mark.parametrize("arch", ["mistral", "qwen2", "gemma2"])
def test_ignoring_the_window_is_caught(arch: str, tok) -> None:
    """The matrix can fail: decoding as if every layer were full (the old behaviour) diverges."""
    target = build(arch, 0, window=True)
    dec = TreeDecoder(target, target, tok)
    dec.target_layout = dec.draft_layout = AttentionLayout((FULL,), None)
    wrong = sum(dec.generate(p, max_new_tokens=NEW, tree=StaticTree(2, 3)).token_ids
                != dec.generate_plain(p, max_new_tokens=NEW).token_ids for p in prompts())
    assert wrong >= 3


def test_layouts_follow_the_config() -> None:
    assert attention_layout(build("llama", 0)) == AttentionLayout((FULL,), None)
    assert attention_layout(build("mistral", 0, window=True)) == AttentionLayout((SLIDING,), WINDOW)
    assert attention_layout(build("qwen2", 0, window=True)) == AttentionLayout((FULL, SLIDING), WINDOW)
    assert attention_layout(build("qwen2", 0)) == AttentionLayout((FULL,), None)  # use_sliding_window off
    assert set(attention_layout(build("gemma2", 0, window=True)).kinds) == {FULL, SLIDING}


def test_sliding_mask_counts_positions_along_the_path() -> None:
    layout = AttentionLayout((SLIDING,), 3)
    # 4 cached positions, then two sibling nodes at position 4 and a child of the first at position 5
    visible = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 1]], dtype=torch.bool)
    mask = layout.mask(visible, 4, torch.tensor([4, 4, 5]), torch.float32)[0, 0] == 0
    assert mask.tolist() == [
        [False, False, True, True, True, False, False],
        [False, False, True, True, False, True, False],
        [False, False, False, True, True, False, True],
    ]


# Recurrent models are refused by their cache (transformers <= 5.24) or by their layer types (5.25 declares
# linear_attention layers and a cache treewise's check accepts): either way the message says why.
RECURRENT = "recurrent or custom cache|linear_attention layers"


@pytest.mark.parametrize("model_type,extra,reason", [
    ("qwen3_next", {}, RECURRENT),
    ("jamba", {}, RECURRENT),
    ("mamba", {}, RECURRENT),
    ("llama4_text", {}, "chunked_attention layers"),
    ("lfm2", {}, "not in treewise's verified"),
    ("smollm3", {}, "not in treewise's verified"),
])
def test_unsupported_models_are_refused(model_type: str, extra: dict, reason: str, tok) -> None:
    model = build(model_type, 0, **extra)
    with pytest.raises(TreewiseError, match=re.escape(type(model).__name__)) as err:
        TreeDecoder(model, model, tok)
    assert re.search(reason, str(err.value))


def test_unverified_attention_model_runs_when_allowed(tok) -> None:
    model = build("smollm3", 0)
    dec = TreeDecoder(model, model, tok, allow_unverified=True)
    assert dec.generate("hello there", max_new_tokens=8, tree=Chain(2)).token_ids == \
        dec.generate_plain("hello there", max_new_tokens=8).token_ids


def test_mask_ignoring_kernel_is_refused(tok) -> None:
    model = build("llama", 0)
    model.config._attn_implementation = "flex_attention"
    with pytest.raises(TreewiseError, match="attn_implementation='sdpa'"):
        TreeDecoder(model, build("llama", 1), tok)


def test_readme_table_matches_the_matrix() -> None:
    """README's supported-architectures table is exactly what this matrix decodes."""
    rows = [f"| `{arch}` | {cls} | {'yes' if arch in WINDOWED else 'no'} |" for arch, (cls, _) in VERIFIED.items()]
    expected = "\n".join(["| model_type | class | tested with a sliding window |", "|---|---|---|", *rows])
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert expected in readme, f"README.md should hold this table:\n{expected}"
    assert {a for a, (_, w) in VERIFIED.items() if w} == set(WINDOWED)


def test_compaction_refuses_a_windowed_cache_layer() -> None:
    """A cache that evicts rows (the model's own sliding-window layers) would make row indices lie."""
    from transformers import DynamicCache

    from treewise.decoder.cache.kvcache import keep_rows

    model = build("mistral", 0, window=True)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(torch.arange(4, 16)[None], cache=cache, use_cache=True)
    with pytest.raises(TreewiseError, match="DynamicSlidingWindowLayer"):
        keep_rows(cache, 10, torch.tensor([11]))
    plain = DynamicCache()
    with torch.no_grad():
        model(torch.arange(4, 16)[None], cache=plain, use_cache=True)
    keep_rows(plain, 10, torch.tensor([11]))
    assert plain.get_seq_length() == 11


def test_sampling_follows_the_target_under_a_window() -> None:
    """Seeded sampling on a sliding-window model matches the target's exact next-two-token distribution."""
    import itertools

    import numpy as np
    from scipy.stats import chisquare

    from treewise.decoder.verify import Sampling

    vocab, runs, window = 8, 1200, 4
    tok = make_tokenizer(vocab)
    target, draft = (build("mistral", seed, layers=n, vocab_size=vocab, sliding_window=window)
                     for seed, n in ((0, 2), (5, 1)))
    for m in (target, draft):
        with torch.no_grad():
            m.get_output_embeddings().weight.mul_(0.15 / 8.0)  # soft logits: every outcome has visible mass
        m.generation_config.eos_token_id = None
    prompt = [5, 6, 7, 4, 5, 7, 6, 6, 4, 5]  # longer than the window
    sampling = Sampling(temperature=1.0)
    exact = {}
    with torch.no_grad():
        for seq in itertools.product(range(vocab), repeat=2):
            probs = sampling.probs(target(torch.tensor([prompt + [seq[0]]])).logits[0, -2:])
            exact[seq] = float(probs[0, seq[0]] * probs[1, seq[1]])
    dec = TreeDecoder(target, draft, tok)
    counts = dict.fromkeys(exact, 0)
    for seed in range(runs):
        out = dec.generate(prompt, max_new_tokens=2, tree=StaticTree(2, 2), temperature=1.0, seed=seed)
        counts[tuple(out.token_ids)] += 1
    keys = list(exact)
    observed = np.array([counts[k] for k in keys], dtype=float)
    expected = np.array([exact[k] for k in keys]) * runs
    tv = 0.5 * sum(abs(counts[k] / runs - exact[k]) for k in keys)
    assert tv < 0.13  # ~0.08 by noise alone for 1200 draws over 64 outcomes
    assert chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > 1e-3

