"""The target's own answers, for distilling a draft: token ids and the target's top-k logits at every position.

A draft learns the distribution it will be verified against, so its training text is what the target itself
says (DistillSpec, arXiv 2310.08461): each prompt goes through the target's chat template and the target answers
greedily and once more by sampling; every answer token keeps the target's top-k raw logits as the soft label.
Prompts come from the train and tune splits of one or more suites (data/prompts; a larger teacher suite built
by ``treewise pair prompts``) only, so the test split that benches and studies score is never trained on. Jobs
run in a seeded order mixed over suites and domains, so a budget that ends early still covers every domain.

Batches are written as ``shard-NNNNN.npz`` through ``atomic_path`` and the manifest (done prompt keys, elapsed
seconds) is rewritten atomically after each one, so a killed run resumes with at most one batch lost and the
minutes budget holds across restarts.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, field_validator

from treewise.decoder.chat import chat_ids
from treewise.decoder.errors import TreewiseError
from treewise.decoder.records.atomic import atomic_path, write_bytes_atomic
from treewise.studies.shared.suites import load_suite

MANIFEST = "manifest.json"


class TeacherConfig(BaseModel):
    target: Path
    out: Path
    suite: tuple[Path, ...]  # one folder or several; their ids must not collide
    splits: tuple[str, ...] = ("train", "tune")
    max_prompt_tokens: int = 384  # longer prompts keep their last tokens (the question usually ends them)
    max_new_tokens: int = 128
    batch_size: int = 8
    top_k: int = 32
    temperature: float = 0.8  # the sampled pass; the greedy pass is always there
    sampled: bool = True
    minutes: float = 60.0
    threads: int = 2
    seed: int = 0

    @field_validator("suite", mode="before")
    @classmethod
    def _one_or_more(cls, value: object) -> object:
        return (value,) if isinstance(value, (str, Path)) else value


@dataclass(frozen=True)
class TeacherJob:
    key: str  # prompt id + "/greedy" or "/sampled"
    domain: str
    text: str
    sample: bool


@dataclass(frozen=True)
class TeacherProgress:
    done: int
    total: int
    elapsed_s: float
    tokens: int


def teacher_jobs(cfg: TeacherConfig) -> list[TeacherJob]:
    """Every (prompt, mode) pair to answer, greedy passes first so a short budget still covers every prompt, each
    pass in an order shuffled by a hash of the prompt id (domains and suites mixed, the same on every restart)."""
    prompts = [p for suite in cfg.suite for split in cfg.splits for p in load_suite(suite, split)]
    ids = [p.id for p in prompts]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise TreewiseError(f"prompt id {dup!r} is in more than one teacher suite: give each suite its own ids")
    prompts.sort(key=lambda p: zlib.crc32(f"{cfg.seed}:{p.id}".encode()))
    window = cfg.batch_size * 8  # similar lengths share a batch: a left-padded batch costs its longest prompt
    prompts = [p for at in range(0, len(prompts), window)
               for p in sorted(prompts[at:at + window], key=lambda p: len(p.prompt))]
    modes = [False, True] if cfg.sampled else [False]
    return [TeacherJob(f"{p.id}/{'sampled' if s else 'greedy'}", p.domain, p.prompt, s) for s in modes for p in prompts]


def read_manifest(out: Path) -> dict:
    path = out / MANIFEST
    return json.loads(path.read_text()) if path.is_file() else {"done": [], "elapsed_s": 0.0, "shards": 0, "tokens": 0}


def run_teacher(cfg: TeacherConfig, on_progress: Callable[[TeacherProgress], None] | None = None) -> TeacherProgress:
    """Answer every job not yet in the manifest, batch by batch, until done or the minutes run out."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(cfg.threads)
    cfg.out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(cfg.out)
    jobs = teacher_jobs(cfg)
    done = set(manifest["done"])
    todo = [j for j in jobs if j.key not in done]
    tokenizer = AutoTokenizer.from_pretrained(cfg.target)
    model = AutoModelForCausalLM.from_pretrained(cfg.target, dtype=torch.float32).eval()
    started = time.perf_counter() - manifest["elapsed_s"]
    for at in range(0, len(todo), cfg.batch_size):
        if time.perf_counter() - started > cfg.minutes * 60:
            break
        batch = todo[at:at + cfg.batch_size]
        for sample in (False, True):
            part = [j for j in batch if j.sample == sample]
            if part:
                shard = _answer(model, tokenizer, part, cfg, seed=cfg.seed + manifest["shards"])
                name = f"shard-{manifest['shards']:05d}.npz"
                with atomic_path(cfg.out / name) as tmp, open(tmp, "wb") as handle:
                    np.savez(handle, **shard)
                manifest["shards"] += 1
                manifest["tokens"] += int(shard["answer_len"].sum())
        manifest["done"] += [j.key for j in batch]
        manifest["elapsed_s"] = time.perf_counter() - started
        write_bytes_atomic(cfg.out / MANIFEST, json.dumps(manifest).encode())
        if on_progress:
            on_progress(TeacherProgress(len(manifest["done"]), len(jobs), manifest["elapsed_s"], manifest["tokens"]))
    return TeacherProgress(len(manifest["done"]), len(jobs), manifest["elapsed_s"], manifest["tokens"])


def _answer(model: torch.nn.Module, tokenizer: object, jobs: list[TeacherJob], cfg: TeacherConfig,
            seed: int) -> dict[str, np.ndarray]:
    """One left-padded batch: prompt ids, answer ids (cut after the first end of turn) and top-k logits."""
    prompts = [chat_ids(tokenizer, j.text, cfg.max_prompt_tokens) for j in jobs]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id  # type: ignore[attr-defined]
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    sample = jobs[0].sample
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=cfg.max_new_tokens,  # type: ignore[operator]
                             do_sample=sample, temperature=cfg.temperature if sample else None, top_p=None,
                             top_k=None, pad_token_id=pad, output_logits=True, return_dict_in_generate=True)
    answers = out.sequences[:, width:]
    logits = torch.stack(out.logits, dim=1)  # [B, T, V] raw, before sampling processors
    values, indices = logits.topk(cfg.top_k, dim=-1)
    eos = set(np.atleast_1d(model.generation_config.eos_token_id).tolist())  # type: ignore[union-attr]
    lengths = []
    for row in answers.tolist():
        stop = next((t + 1 for t, tok in enumerate(row) if tok in eos), len(row))
        lengths.append(stop)
    return {
        "prompt_ids": np.concatenate([np.asarray(p, np.int32) for p in prompts]),
        "prompt_len": np.asarray([len(p) for p in prompts], np.int32),
        "answer_ids": answers.numpy().astype(np.int32),
        "answer_len": np.asarray(lengths, np.int32),
        "topk_ids": indices.numpy().astype(np.int32),
        "topk_logits": values.numpy().astype(np.float16),
        "keys": np.asarray([j.key for j in jobs]),
        "domains": np.asarray([j.domain for j in jobs]),
    }
