"""Train the embedded pair: corpus -> byte-level BPE -> Llama target -> distilled 1-layer draft -> HF folders.

Every stage leaves its output under `work` and is skipped when that output exists, so a killed run resumes;
the two training stages checkpoint every few minutes and keep their elapsed time, so the minutes budget
holds across restarts. Every output is written under a temporary name and renamed when complete (folders
as a whole), so a kill -9 never leaves a half-written file that a resume would take for finished.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from treewise.decoder.errors import TreewiseError
from treewise.decoder.records.atomic import atomic_dir, atomic_path, write_bytes_atomic

from .config import ModelShape, PairConfig
from .corpus.build import DOMAINS, Corpus, build_corpus

EOS = "<|endoftext|>"
PAD = "<pad>"


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise TreewiseError(f"--device {name}: no CUDA device here; use --device cpu or auto")
    return torch.device(name)


def device_label(device: torch.device, threads: int) -> str:
    """Where the weights were trained, for the model card."""
    if device.type == "cuda":
        return f"GPU {torch.cuda.get_device_name(device)}"
    return f"CPU ({os.cpu_count()} cores, {threads} torch threads)"


@dataclass
class TrainProgress:
    stage: str
    elapsed_s: float
    budget_s: float
    step: int
    tokens: int
    loss: float


@dataclass
class StageResult:
    stage: str
    steps: int
    tokens: int
    seconds: float
    final_loss: float
    params: int


Callback = Callable[[TrainProgress], None]


# The files of an exported HF folder: an export replaces them all (a stale one never survives beside new ones).
HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "model.safetensors.index.json",
            "pytorch_model.bin", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
            "chat_template.jinja")


def save_corpus(corpus: Corpus, work: Path) -> None:
    for split, docs in (("train", corpus.train), ("valid", corpus.valid)):
        with atomic_path(work / f"corpus_{split}.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as fh:
            for domain, items in docs.items():
                for text in items:
                    fh.write(json.dumps({"domain": domain, "text": text}) + "\n")


def load_corpus(work: Path) -> Corpus:
    corpus = Corpus(train={d: [] for d in DOMAINS}, valid={d: [] for d in DOMAINS})
    for split in ("train", "valid"):
        target = corpus.train if split == "train" else corpus.valid
        for line in open(work / f"corpus_{split}.jsonl", encoding="utf-8"):
            row = json.loads(line)
            target.setdefault(row["domain"], []).append(row["text"])
    return corpus


def ensure_corpus(cfg: PairConfig) -> Corpus:
    if not (cfg.work / "corpus_valid.jsonl").exists():
        save_corpus(build_corpus(cfg.corpus), cfg.work)
    return load_corpus(cfg.work)


def train_tokenizer(corpus: Corpus, vocab_size: int) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        min_frequency=2,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((t for docs in corpus.train.values() for t in docs), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=PAD, unk_token=None, model_max_length=1_000_000
    )


def ensure_tokenizer(cfg: PairConfig, corpus: Corpus) -> PreTrainedTokenizerFast:
    folder = cfg.work / "tokenizer"
    if not (folder / "tokenizer.json").exists():
        with atomic_dir(folder) as stage:
            train_tokenizer(corpus, cfg.vocab_size).save_pretrained(stage)
    return PreTrainedTokenizerFast.from_pretrained(folder)


def encode_docs(tok: PreTrainedTokenizerFast, docs: list[str]) -> np.ndarray:
    """Documents joined by EOS (which also opens each document) as one uint16 array."""
    eos = tok.convert_tokens_to_ids(EOS)
    ids: list[int] = []
    for enc in tok.backend_tokenizer.encode_batch(docs, add_special_tokens=False):
        ids.append(eos)
        ids.extend(enc.ids)
    return np.asarray(ids, dtype=np.uint16)


def ensure_tokens(cfg: PairConfig, corpus: Corpus, tok: PreTrainedTokenizerFast) -> dict[str, dict[str, np.ndarray]]:
    path = cfg.work / "tokens.npz"
    if not path.exists():
        arrays = {
            f"{split}/{d}": encode_docs(tok, docs[d])
            for split, docs in (("train", corpus.train), ("valid", corpus.valid))
            for d in DOMAINS
        }
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, **arrays)
    data = np.load(path)
    return {s: {d: data[f"{s}/{d}"] for d in DOMAINS} for s in ("train", "valid")}


def llama_config(shape: ModelShape, cfg: PairConfig, tok: PreTrainedTokenizerFast) -> LlamaConfig:
    eos = tok.convert_tokens_to_ids(EOS)
    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=shape.hidden,
        intermediate_size=shape.ffn,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.heads,
        max_position_embeddings=cfg.context,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=tok.convert_tokens_to_ids(PAD),
        rope_theta=10000.0,
    )


def sample_batch(tokens: dict[str, np.ndarray], batch: int, length: int, rng: np.random.Generator) -> torch.Tensor:
    """Windows of length+1 tokens, domain picked uniformly per row so domains stay balanced."""
    rows = []
    for _ in range(batch):
        arr = tokens[DOMAINS[rng.integers(len(DOMAINS))]]
        start = int(rng.integers(0, len(arr) - length - 1))
        rows.append(arr[start : start + length + 1].astype(np.int64))
    return torch.from_numpy(np.stack(rows))


def lr_at(frac: float, peak: float) -> float:
    """Linear warm-up over 3% of the budget, then cosine to 10% of peak (time-based, so resumable)."""
    if frac < 0.03:
        return peak * max(frac / 0.03, 0.02)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (frac - 0.03) / 0.97))))


def load_init(model: LlamaForCausalLM, init: Path, tok: PreTrainedTokenizerFast) -> None:
    """Copy an earlier run's exported weights into `model`; refuse folders from another tokenizer or shape."""
    weights, tok_file = init / "model.safetensors", init / "tokenizer.json"
    if not weights.exists() or not tok_file.exists():
        raise TreewiseError(
            f"--init-from: {init} has no model.safetensors/tokenizer.json; pass the folder that "
            "holds target/ and draft/ as written by an earlier train-pair run"
        )
    if json.loads(tok_file.read_text())["model"]["vocab"] != tok.backend_tokenizer.get_vocab():
        raise TreewiseError(
            f"--init-from: {init} was trained with another tokenizer than {tok.name_or_path}; "
            "use the --work folder of the run that produced it"
        )
    state = {k: v.float() for k, v in load_file(weights).items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != "lm_head.weight"]:
        raise TreewiseError(
            f"--init-from: {init} holds another model shape (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}); set the same layers/hidden as that run"
        )
    model.tie_weights()


def train_stage(
    name: str,
    model: LlamaForCausalLM,
    cfg: PairConfig,
    tokens: dict[str, np.ndarray],
    budget_s: float,
    peak_lr: float,
    on_progress: Callback,
    teacher: LlamaForCausalLM | None = None,
) -> StageResult:
    """Train until the stage's time budget is spent, resuming from work/<name>.pt when it exists."""
    ckpt_path = cfg.work / f"{name}.pt"
    device = next(model.parameters()).device
    opt = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    state = {"step": 0, "tokens": 0, "elapsed": 0.0, "loss": float("nan")}
    if ckpt_path.exists():
        state = restore_checkpoint(ckpt_path, model, opt, device)
    rng = np.random.default_rng(cfg.seed + state["step"] + (0 if teacher is None else 7919))
    model.train()
    ema: float | None = None
    t0, last_ckpt = time.monotonic() - state["elapsed"], time.monotonic()
    while state["elapsed"] < budget_s:
        for group in opt.param_groups:
            group["lr"] = lr_at(state["elapsed"] / budget_s, peak_lr)
        long = state["step"] % cfg.long_every == 0
        batch = sample_batch(tokens, cfg.batch // 4 if long else cfg.batch, cfg.context if long else cfg.window, rng)
        batch = batch.to(device)
        logits = model(input_ids=batch[:, :-1]).logits.float()
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        if teacher is not None:
            with torch.no_grad():
                t_logits = teacher(input_ids=batch[:, :-1]).logits.float()
            kl = (
                F.kl_div(F.log_softmax(logits, -1), F.log_softmax(t_logits, -1), log_target=True, reduction="none")
                .sum(-1)
                .mean()
            )
            total = cfg.distill_weight * kl + (1 - cfg.distill_weight) * loss
        else:
            total = loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.98 * ema + 0.02 * loss.item()
        state.update(
            step=state["step"] + 1,
            tokens=state["tokens"] + batch[:, 1:].numel(),
            elapsed=time.monotonic() - t0,
            loss=ema,
        )
        on_progress(TrainProgress(name, state["elapsed"], budget_s, state["step"], state["tokens"], ema))
        if time.monotonic() - last_ckpt > cfg.checkpoint_every_s:
            save_checkpoint(ckpt_path, model, opt, state)
            last_ckpt = time.monotonic()
    save_checkpoint(ckpt_path, model, opt, state)
    model.eval()
    params = sum(p.numel() for p in model.parameters())
    return StageResult(name, state["step"], state["tokens"], state["elapsed"], state["loss"], params)


def restore_checkpoint(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, device: torch.device,
             command: str = "train-pair") -> dict:
    """Load a stage checkpoint (tensors and plain values only: ``weights_only=True`` runs no pickled code)."""
    fix = f"delete {path} to restart that stage, or pass the --work folder of the run that wrote it"
    try:
        ckpt = torch.load(path, weights_only=True, map_location=device)
    except Exception as err:  # torch raises anything from UnpicklingError to IndexError on garbage
        why = (str(err).splitlines() or [type(err).__name__])[0][:160]
        raise TreewiseError(f"{path}: not a {command} checkpoint (unreadable: {why}); {fix}") from None
    try:
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        state = dict(ckpt["state"])
    except RuntimeError as err:
        raise TreewiseError(f"{path}: a checkpoint of another model shape ({str(err).splitlines()[0][:160]}); "
                            f"{fix}") from None
    except (KeyError, TypeError, ValueError) as err:
        raise TreewiseError(f"{path}: not a {command} checkpoint ({type(err).__name__}: {err}); {fix}") from None
    return state


def save_checkpoint(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, state: dict) -> None:
    with atomic_path(path) as tmp:
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": state}, tmp)


def export_model(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, folder: Path) -> None:
    """HF folder with bf16 weights; config says float32 so a plain from_pretrained computes in fp32.

    The folder is replaced as a whole: a kill while exporting leaves the previous model loadable.
    """
    with atomic_dir(folder, HF_FILES) as stage:
        _export_files(model, tok, stage)


def _export_files(model: LlamaForCausalLM, tok: PreTrainedTokenizerFast, folder: Path) -> None:
    model.config.dtype = "float32"
    model.config.save_pretrained(folder)
    eos = tok.convert_tokens_to_ids(EOS)
    GenerationConfig(
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=tok.convert_tokens_to_ids(PAD),
        do_sample=False,
        max_new_tokens=128,
    ).save_pretrained(folder)
    weights = {
        k: v.detach().to("cpu", torch.bfloat16).contiguous()
        for k, v in model.state_dict().items()
        if k != "lm_head.weight"
    }  # tied to the embedding
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    tok.save_pretrained(folder)


def _remove_leftovers(work: Path) -> None:
    """Temporaries of a run killed midway (never read: every output is renamed into place when complete)."""
    for path in work.glob(".*"):
        if path.is_file() and path.name.endswith(".tmp"):
            path.unlink()
        elif path.is_dir() and ".new-" in path.name:
            shutil.rmtree(path)


def train_pair(cfg: PairConfig, on_progress: Callback = lambda p: None) -> list[StageResult]:
    """The whole recipe; returns one result per trained model and writes cfg.out/{target,draft}."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    device = resolve_device(cfg.device)
    cfg.work.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(cfg.work)
    started = time.time()
    corpus = ensure_corpus(cfg)
    tok = ensure_tokenizer(cfg, corpus)
    tokens = ensure_tokens(cfg, corpus, tok)["train"]
    meta_path = cfg.work / "train_meta.json"
    if not meta_path.exists():  # first run only, so a resumed run keeps the original start and prep time
        meta = {
            "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
            "prep_minutes": (time.time() - started) / 60,
            "config": json.loads(cfg.model_dump_json()),
            "train_tokens": {d: int(len(a)) for d, a in tokens.items()},
            "device": device_label(device, cfg.threads),
        }
        write_bytes_atomic(meta_path, json.dumps(meta, indent=2).encode())
    budget = cfg.minutes * 60
    results = []
    target = LlamaForCausalLM(llama_config(cfg.target, cfg, tok))
    if cfg.init_from is not None and not (cfg.work / "target.pt").exists():
        load_init(target, cfg.init_from / "target", tok)
    target.to(device)
    results.append(train_stage("target", target, cfg, tokens, budget * cfg.target_share, cfg.lr_target, on_progress))
    export_model(target, tok, cfg.out / "target")
    torch.manual_seed(cfg.seed + 1)
    draft = LlamaForCausalLM(llama_config(cfg.draft, cfg, tok))
    if cfg.init_from is not None and not (cfg.work / "draft.pt").exists():
        load_init(draft, cfg.init_from / "draft", tok)
    draft.to(device)
    results.append(
        train_stage(
            "draft", draft, cfg, tokens, budget * (1 - cfg.target_share), cfg.lr_draft, on_progress, teacher=target
        )
    )
    export_model(draft, tok, cfg.out / "draft")
    write_bytes_atomic(cfg.work / "train_results.json", json.dumps([r.__dict__ for r in results], indent=2).encode())
    return results
