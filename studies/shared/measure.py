"""Timed decoding rows side by side with plain target decoding: what bench and tune both measure.

Every row decodes the same prompts, interleaved prompt by prompt so drift in machine speed hits all rows
alike, in a row order shuffled afresh for every prompt and repeat (``row_order``): a row that always ran
right after the same other row would inherit that row's warm or cold caches in every repeat (a rotation
keeps each row's neighbours). Greedy outputs of every row are checked against plain decoding.
``studies.bench`` builds its rows (policies, HF assisted) on this; ``studies.tune`` measures budgets with it.
"""

from __future__ import annotations

import platform
import random
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import transformers
from pydantic import BaseModel, Field

from treewise.decoder import GenerationResult, TreeDecoder, TreewiseError

from .config import BenchConfig
from .pairs import load_pair_decoder, resolve_pair
from .suites import Prompt, load_suite

PLAIN, HF, HF_LOOKUP = "plain", "hf_assisted", "hf_prompt_lookup"


class Metrics(BaseModel):
    prompts: int
    new_tokens: int
    tau: float | None  # tokens per target call (1 + accepted / steps); None where not observable
    verified_per_step: float | None
    drafted_per_step: float | None
    tokens_per_s: float  # median over repeats
    tokens_per_s_range: tuple[float, float]  # min, max over repeats
    speedup: float  # median over repeats of plain time / row time
    speedup_range: tuple[float, float]
    # 95 % bootstrap interval over prompts of the speedup pooled over repeats (``paired_ratio``)
    speedup_ci95: tuple[float, float] | None = None
    policy_ms_per_step: float | None  # controller overhead (policy + predictor)
    overhead_share: float | None  # share of step time outside model forwards
    mismatches: int  # prompts whose greedy output differs from plain decoding


class PairedRatio(BaseModel):
    """Row ``a``'s tokens/s over row ``b``'s on the same prompts, both rows' time summed over repeats."""

    a: str
    b: str
    ratio: float  # pooled over every prompt and repeat; > 1: a is faster
    ci95: tuple[float, float]  # 95 % bootstrap interval, prompts resampled with replacement
    prompts: int


class Ranked(BaseModel):
    """One row against the run's fastest row, prompt by prompt: is its place in the ranking real?"""

    row: str
    policy: str  # the policy its spec names ("learned" for learned:online=false); plain and HF: the row's name
    tokens_per_s: float  # pooled over every prompt and repeat (what the paired ratio divides)
    vs_fastest: float  # this row's tokens/s over the fastest row's, pooled (``paired_ratio``); 1 for the fastest
    ci95: tuple[float, float]  # 95 % bootstrap interval over prompts of ``vs_fastest``
    tied: bool  # the interval reaches 1: the bench cannot tell this row from the fastest


class RowResult(Metrics):
    spec: str | None = None
    per_domain: dict[str, Metrics] = Field(default_factory=dict)


class BenchResult(BaseModel):
    config: BenchConfig
    policies: dict[str, RowResult]
    skipped: dict[str, str] = Field(default_factory=dict)  # row -> why it could not run (e.g. no predictor)
    paired: list[PairedRatio] = Field(default_factory=list)  # the config's compared rows that both ran
    # Every row, fastest first, each paired against the fastest (``rank_rows``); empty in results from before it.
    ranking: list[Ranked] = Field(default_factory=list)
    environment: dict[str, str]
    wall_s: float


@dataclass
class _Runs:
    """Per row, per prompt id: one result per repeat."""

    by_row: dict[str, dict[str, list[GenerationResult]]] = field(default_factory=dict)

    def add(self, row: str, pid: str, res: GenerationResult) -> None:
        self.by_row.setdefault(row, {}).setdefault(pid, []).append(res)


Runner = Callable[[Prompt], GenerationResult]


def select_prompts(cfg: BenchConfig) -> list[Prompt]:
    prompts = load_suite(cfg.suite, cfg.split, cfg.domains)
    if not prompts:
        raise TreewiseError(f"no prompts in {cfg.suite} for split {cfg.split!r} and domains {cfg.domains}")
    if cfg.per_domain <= 0:
        return prompts
    seen: dict[str, int] = {}
    chosen = []
    for p in prompts:
        if seen.get(p.domain, 0) < cfg.per_domain:
            chosen.append(p)
            seen[p.domain] = seen.get(p.domain, 0) + 1
    return chosen


def load_bench_decoder(cfg: BenchConfig) -> TreeDecoder:
    """The pair ``cfg`` names (``--pair``, with ``--target``/``--draft`` overriding its folders)."""
    return load_pair_decoder(resolve_pair(cfg.pair, cfg.target, cfg.draft))


def row_order(names: list[str], repeat: int, index: int, seed: int = 0) -> list[str]:
    """The rows' order for one prompt of one repeat: a seeded shuffle, so over a run every row follows every
    other about equally often (no row inherits one neighbour's cache state in every repeat) and a rerun
    repeats the same order."""
    order = list(names)
    random.Random(f"{seed}:{repeat}:{index}").shuffle(order)
    return order


def measure(runners: dict[str, Runner], prompts: list[Prompt], repeats: int,
            on_progress: Callable[[], None] | None = None) -> _Runs:
    """Interleave rows prompt by prompt in a shuffled order (``row_order``); one warm-up pass first."""
    names = list(runners)
    for name in names:
        runners[name](prompts[0])
    runs = _Runs({name: {} for name in names})  # reports keep the rows' order, not the shuffle's
    for r in range(repeats):
        for i, p in enumerate(prompts):
            for name in row_order(names, r, i):
                runs.add(name, p.id, runners[name](p))
            if on_progress is not None:
                on_progress()
    return runs


BOOTSTRAP_DRAWS = 2000


def paired_ratio(tokens_a: np.ndarray, seconds_a: np.ndarray, tokens_b: np.ndarray, seconds_b: np.ndarray,
                 draws: int = BOOTSTRAP_DRAWS, seed: int = 0) -> tuple[float, tuple[float, float]]:
    """Pooled tokens/s of a over b ([n] per prompt each, the same prompts) and a seeded 95 % bootstrap interval
    that resamples prompts: each draw keeps a prompt's two rows together, so what the machine did to that
    prompt hits both sides."""
    def ratio(idx: np.ndarray) -> np.ndarray:
        return (tokens_a[idx].sum(-1) / seconds_a[idx].sum(-1)) / (tokens_b[idx].sum(-1) / seconds_b[idx].sum(-1))

    n = len(tokens_a)
    draws_idx = np.random.default_rng(seed).integers(0, n, size=(draws, n))
    lo, hi = np.percentile(ratio(draws_idx), [2.5, 97.5])
    return float(ratio(np.arange(n))), (float(lo), float(hi))


def _per_prompt(runs: _Runs, row: str, ids: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """[n] tokens and [n] seconds per prompt, each summed over the repeats."""
    res = runs.by_row[row]
    tokens = np.asarray([sum(len(r.token_ids) for r in res[i]) for i in ids], dtype=np.float64)
    return tokens, np.asarray([sum(r.stats.total_s for r in res[i]) for i in ids], dtype=np.float64)


def _metrics(runs: _Runs, row: str, prompts: list[Prompt], repeats: int) -> Metrics:
    rows, plain = runs.by_row[row], runs.by_row[PLAIN]
    ids = [p.id for p in prompts]
    row_t = [sum(rows[i][r].stats.total_s for i in ids) for r in range(repeats)]
    plain_t = [sum(plain[i][r].stats.total_s for i in ids) for r in range(repeats)]
    tokens = sum(len(rows[i][0].token_ids) for i in ids)
    tps = [tokens / t for t in row_t]
    speed = [pt / t for pt, t in zip(plain_t, row_t, strict=True)]
    stats = [rows[i][0].stats for i in ids]
    steps = sum(s.n_steps for s in stats)
    tree_row = row not in (PLAIN, HF, HF_LOOKUP)
    return Metrics(
        prompts=len(ids), new_tokens=tokens,
        tau=(1 + sum(s.accepted for s in stats) / steps) if tree_row and steps else (1.0 if row == PLAIN else None),
        verified_per_step=sum(s.verified for s in stats) / steps if tree_row and steps else None,
        drafted_per_step=sum(s.drafted for s in stats) / steps if tree_row and steps else None,
        tokens_per_s=statistics.median(tps), tokens_per_s_range=(min(tps), max(tps)),
        speedup=statistics.median(speed), speedup_range=(min(speed), max(speed)),
        speedup_ci95=paired_ratio(*_per_prompt(runs, row, ids), *_per_prompt(runs, PLAIN, ids))[1],
        policy_ms_per_step=1000 * sum(s.policy_s for s in stats) / steps if tree_row and steps else None,
        overhead_share=_overhead(stats) if tree_row else None,
        mismatches=sum(rows[i][0].token_ids != plain[i][0].token_ids for i in ids),
    )


def _overhead(stats: list) -> float:
    other = sum(s.other_s for s in stats)
    busy = sum(s.draft_s + s.verify_s + s.other_s for s in stats)
    return other / busy if busy else 0.0


def summarize(runs: _Runs, specs: dict[str, str], prompts: list[Prompt], cfg: BenchConfig,
              wall_s: float, skipped: dict[str, str] | None = None) -> BenchResult:
    domains = sorted({p.domain for p in prompts})
    rows: dict[str, RowResult] = {}
    chosen: dict[str, str] = {}  # row name -> the key of the candidate it reports
    for key in runs.by_row:
        overall = _metrics(runs, key, prompts, cfg.repeats)
        per = {d: _metrics(runs, key, [p for p in prompts if p.domain == d], cfg.repeats) for d in domains}
        name = key.split("@", 1)[0]
        cand = RowResult(**overall.model_dump(), spec=specs.get(key), per_domain=per)
        if name not in rows or cand.tokens_per_s > rows[name].tokens_per_s:
            rows[name], chosen[name] = cand, key  # a multi-candidate row keeps its fastest candidate
    ids = [p.id for p in prompts]
    per_prompt = {name: _per_prompt(runs, key, ids) for name, key in chosen.items()}  # what pairs and ranking read
    paired = []
    for a, b in cfg.compare:
        if a in chosen and b in chosen:
            ratio, ci = paired_ratio(*per_prompt[a], *per_prompt[b])
            paired.append(PairedRatio(a=a, b=b, ratio=ratio, ci95=ci, prompts=len(ids)))
    env = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
           "threads": str(torch.get_num_threads()), "machine": platform.machine(), "processor": platform.processor()}
    ranking = rank_rows(per_prompt, {name: specs.get(key) for name, key in chosen.items()})
    return BenchResult(config=cfg, policies=rows, environment=env, wall_s=wall_s, skipped=skipped or {},
                       paired=paired, ranking=ranking)


def rank_rows(per_prompt: dict[str, tuple[np.ndarray, np.ndarray]], specs: dict[str, str | None]) -> list[Ranked]:
    """Rows fastest first by pooled tokens/s, each paired against the fastest over the same prompts.

    ``per_prompt``: row -> ([n] tokens, [n] seconds), the same prompts in the same order for every row. A row
    whose interval reaches 1 is ``tied`` with the fastest: "the fastest row" is then a set, and a report says so
    instead of crowning whichever row the noise put first."""
    pooled = {row: float(t.sum() / s.sum()) for row, (t, s) in per_prompt.items()}
    order = sorted(pooled, key=pooled.__getitem__, reverse=True)
    if not order:
        return []
    top = per_prompt[order[0]]
    ranked = []
    for row in order:
        ratio, ci = (1.0, (1.0, 1.0)) if row == order[0] else paired_ratio(*per_prompt[row], *top)
        spec = specs.get(row)
        ranked.append(Ranked(row=row, policy=spec.split(":", 1)[0] if spec else row, tokens_per_s=pooled[row],
                             vs_fastest=ratio, ci95=ci, tied=ci[1] >= 1.0))
    return ranked
