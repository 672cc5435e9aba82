"""Measurements of the trained pair for its model card: perplexity, agreement, repetition, latency, samples."""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel

from treewise.studies.shared.suites import load_suite

from .config import EvalConfig
from .corpus.build import DOMAINS


@dataclass
class DomainEval:
    domain: str
    target_ppl: float
    draft_ppl: float
    agreement: float  # teacher-forced argmax agreement of draft and target on held-out text
    repeated_4gram: float  # share of 4-grams in target greedy outputs that repeat an earlier one
    reference_4gram: float = float("nan")  # the same share in held-out text of the same length (natural level)
    looping: float = float("nan")  # share of greedy outputs that end in a loop (see ends_in_loop)
    sample_prompt: str = ""
    sample_output: str = ""


@dataclass
class PairEval:
    domains: list[DomainEval] = field(default_factory=list)
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> "n tokens" -> ms
    params: dict[str, int] = field(default_factory=dict)
    weights_bytes: int = 0
    seconds: float = 0.0
    load_average: list[float] = field(default_factory=list)  # 1/5/15-min load while measuring: a shared CPU


def heldout_windows(work: Path, domain: str, n: int, length: int) -> list[torch.Tensor]:
    arr = np.load(work / "tokens.npz")[f"valid/{domain}"]
    starts = np.linspace(0, max(0, len(arr) - length - 1), n).astype(int)
    return [torch.from_numpy(arr[s : s + length].astype(np.int64)) for s in sorted(set(starts))]


@torch.inference_mode()
def ppl_and_agreement(
    target: PreTrainedModel,
    draft: PreTrainedModel,
    windows: list[torch.Tensor],
) -> tuple[float, float, float]:
    nll_t = nll_d = agree = count = 0.0
    for ids in windows:
        lt, ld = target(ids[None, :-1]).logits[0], draft(ids[None, :-1]).logits[0]
        y = ids[1:]
        nll_t += torch.nn.functional.cross_entropy(lt, y, reduction="sum").item()
        nll_d += torch.nn.functional.cross_entropy(ld, y, reduction="sum").item()
        agree += (lt.argmax(-1) == ld.argmax(-1)).sum().item()
        count += y.numel()
    return math.exp(nll_t / count), math.exp(nll_d / count), agree / count


def repeated_ngram_fraction(ids: list[int], n: int = 4) -> float:
    grams = [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]
    return 1 - len(set(grams)) / len(grams) if grams else 0.0


def ends_in_loop(ids: list[int], tail: int = 32, max_period: int = 16) -> bool:
    """True when the last `tail` tokens repeat with a period of at most `max_period` (an endless loop).

    Outputs shorter than `tail` stopped on their own (EOS) and do not count as loops.
    """
    if len(ids) < tail + max_period:
        return False
    end = ids[-tail:]
    return any(end == ids[-tail - p : len(ids) - p] for p in range(1, max_period + 1))


@torch.inference_mode()
def greedy(model: PreTrainedModel, tok: AutoTokenizer, prompt: str, new: int) -> list[int]:
    ids = tok(prompt, return_tensors="pt").input_ids[:, -(model.config.max_position_embeddings - new) :]
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, pad_token_id=tok.pad_token_id
    )
    return out[0, ids.shape[1] :].tolist()


@torch.inference_mode()
def forward_latency_ms(
    model: PreTrainedModel, sizes: tuple[int, ...] = (1, 16, 32, 64), context: int = 128, reps: int = 40
) -> dict[str, float]:
    """Median time of one forward of n new tokens onto a KV cache of `context` tokens."""
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(0, vocab, (1, context), generator=gen)
    out: dict[str, float] = {}
    for n in sizes:
        times = []
        for _ in range(reps):
            cache = DynamicCache()
            model(prefix, past_key_values=cache, use_cache=True)
            x = torch.randint(0, vocab, (1, n), generator=gen)
            t0 = time.perf_counter()
            model(x, past_key_values=cache, use_cache=True)
            times.append(time.perf_counter() - t0)
        out[str(n)] = 1000 * float(np.median(times))
    return out


def evaluate_pair(cfg: EvalConfig) -> PairEval:
    torch.set_num_threads(cfg.threads)
    start = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(cfg.models / "target")
    target = AutoModelForCausalLM.from_pretrained(cfg.models / "target").eval()
    draft = AutoModelForCausalLM.from_pretrained(cfg.models / "draft").eval()
    result = PairEval(
        params={n: sum(p.numel() for p in m.parameters()) for n, m in (("target", target), ("draft", draft))},
        weights_bytes=sum(p.stat().st_size for p in cfg.models.rglob("*.safetensors")),
    )
    tests = load_suite(cfg.prompts, split="test")
    for domain in DOMAINS:
        windows = heldout_windows(cfg.work, domain, cfg.windows, cfg.window)
        pt, pd, agree = ppl_and_agreement(target, draft, windows)
        mine = [p for p in tests if p.domain == domain][: cfg.gen_prompts]
        outs = [greedy(target, tok, p.prompt, cfg.gen_tokens) for p in mine]
        rep = float(np.mean([repeated_ngram_fraction(o) for o in outs])) if outs else 0.0
        ref = float(np.mean([repeated_ngram_fraction(w[: cfg.gen_tokens].tolist()) for w in windows]))
        loops = float(np.mean([ends_in_loop(o) for o in outs])) if outs else 0.0
        sample = tok.decode(outs[0], skip_special_tokens=True) if outs else ""
        result.domains.append(
            DomainEval(domain, pt, pd, agree, rep, ref, loops, mine[0].prompt if mine else "", sample)
        )
    result.latency_ms = {"target": forward_latency_ms(target), "draft": forward_latency_ms(draft)}
    result.load_average = [round(x, 2) for x in os.getloadavg()]
    result.seconds = time.perf_counter() - start
    return result


def save_eval(result: PairEval, path: Path) -> None:
    path.write_text(json.dumps(asdict(result), indent=2), encoding="utf-8")
