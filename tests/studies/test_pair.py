"""The embedded pair: loads offline with stock HF classes, shares one tokenizer, target beats draft."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

DATA = Path(__file__).resolve().parents[2] / "data"
MODELS = DATA / "models"
DOMAINS = ("code", "math", "logic", "dialogue", "knowledge", "creative", "structured", "instruction")

pytestmark = pytest.mark.skipif(
    not (MODELS / "target" / "config.json").exists() or not (MODELS / "draft" / "config.json").exists(),
    reason="data/models/{target,draft} not built yet: run `treewise train-pair` (the model card names the command)",
)


@pytest.fixture(scope="module")
def pair():
    tok = AutoTokenizer.from_pretrained(MODELS / "target")
    target = AutoModelForCausalLM.from_pretrained(MODELS / "target").eval()
    draft = AutoModelForCausalLM.from_pretrained(MODELS / "draft").eval()
    return tok, target, draft


def test_shared_tokenizer_and_special_tokens(pair):
    tok, target, draft = pair
    tok_d = AutoTokenizer.from_pretrained(MODELS / "draft")
    assert tok.get_vocab() == tok_d.get_vocab()
    assert (MODELS / "target" / "tokenizer.json").read_bytes() == (MODELS / "draft" / "tokenizer.json").read_bytes()
    assert tok.eos_token_id is not None
    for m in (target, draft):
        assert m.config.eos_token_id == tok.eos_token_id
        assert m.generation_config.eos_token_id == tok.eos_token_id
        assert m.config.vocab_size == len(tok)
        assert m.config.model_type == "llama"
    text = "def add(a, b):\n    return a + b\n"
    assert tok.decode(tok(text).input_ids) == text  # byte-level: lossless round trip


def test_sizes_and_dtypes(pair):
    _, target, draft = pair
    total = sum(p.stat().st_size for p in MODELS.rglob("*.safetensors"))
    assert total <= 60 * 2**20
    assert target.dtype == torch.float32 and draft.dtype == torch.float32  # 16-bit on disk, fp32 by default
    assert target.config.num_hidden_layers > draft.config.num_hidden_layers
    assert sum(p.numel() for p in target.parameters()) > 3 * sum(p.numel() for p in draft.parameters())


def _nll(model, ids: torch.Tensor) -> float:
    with torch.inference_mode():
        logits = model(ids[None, :-1]).logits[0].float()
        return torch.nn.functional.cross_entropy(logits, ids[1:]).item()


def test_target_beats_draft_on_heldout_text(pair):
    tok, target, draft = pair
    worse = {}
    for domain in DOMAINS:
        text = (DATA / "heldout" / f"{domain}.txt").read_text(encoding="utf-8")
        ids = torch.tensor(tok(text).input_ids[: target.config.max_position_embeddings])
        pt, pd = math.exp(_nll(target, ids)), math.exp(_nll(draft, ids))
        if not pt < pd:
            worse[domain] = (pt, pd)
    assert not worse, f"target perplexity not below draft's in {worse}"


def test_greedy_generation_runs(pair):
    tok, target, _ = pair
    ids = tok("Question: What is 12 + 30?\nAnswer:", return_tensors="pt").input_ids
    out = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert out.shape[1] > ids.shape[1]
