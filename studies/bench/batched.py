"""``treewise bench --batch-size N``: batched tree decoding against batched plain decoding, side by side.

For each batch size the prompts are cut into batches of that size; every row (plain ``model.generate`` with
left padding, then each tree policy through ``generate_batch``) decodes the same batches, interleaved batch
by batch in a row order shuffled per batch and repeat. Every row's greedy output is checked against the target's
solo greedy decoding of that prompt.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable

import torch
from pydantic import BaseModel

from treewise.decoder import GenerationResult, TreeDecoder
from treewise.studies.shared.measure import row_order
from treewise.studies.shared.suites import Prompt
from treewise.studies.shared.treespec import build_tree

PLAIN = "plain"


class BatchRow(BaseModel):
    row: str
    batch_size: int
    spec: str | None
    new_tokens: int
    tokens_per_s: float  # median over repeats
    tokens_per_s_range: tuple[float, float]
    speedup: float  # median over repeats of plain time / row time, same batch size
    # Profile fields below come from the repeat with the median time (a disturbed repeat does not skew them).
    tau: float | None  # tokens per target call per row (1 + accepted / steps)
    verified_per_step: float | None
    draft_share: float | None  # shares of the row's step time: draft forwards, target forward, the rest
    verify_share: float | None
    other_share: float | None
    step_ms: float  # wall time per batched step (plain: per generated position), median repeat
    target_ms_per_step: float | None  # the batched target forward of one step (tree rows)
    mismatches: int  # outputs (prompts x repeats) that differ from the target's solo greedy decoding


class BatchBenchResult(BaseModel):
    prompts: int
    max_new_tokens: int
    repeats: int
    batch_sizes: list[int]
    specs: dict[str, str]
    rows: list[BatchRow]
    environment: dict[str, str]
    wall_s: float


Batcher = Callable[[list[Prompt]], list[GenerationResult]]


def run_batch_bench(dec: TreeDecoder, prompts: list[Prompt], sizes: list[int], specs: dict[str, str],
                    max_new_tokens: int, repeats: int, on_progress: Callable[[], None] | None = None,
                    pair: str | None = None, continuous: dict[str, str] | None = None) -> BatchBenchResult:
    """Measure every row at every batch size; ``specs`` maps row name -> tree spec (learned and budgeted rows
    read model ``pair``'s data files). ``continuous`` rows (name -> spec) decode all prompts as one continuous
    batch of at most that many rows (``generate_batch(max_batch=size)``): a finished row's place goes to the
    next prompt instead of idling until its batch ends; once per repeat and batch size, before the first batch
    in even repeats and after the last in odd ones."""
    t_start = time.perf_counter()
    solo = {p.id: dec.generate_plain(p.prompt, max_new_tokens).token_ids for p in prompts}
    batchers: dict[str, Batcher] = {PLAIN: lambda ps: dec.generate_plain_batch([p.prompt for p in ps], max_new_tokens)}
    for name, spec in specs.items():
        batchers[name] = (lambda pol: lambda ps: dec.generate_batch(
            [p.prompt for p in ps], max_new_tokens, tree=pol, domain=[p.domain for p in ps],
            prompt_ids=[p.id for p in ps]))(build_tree(spec, pair))
    flowing = {name: build_tree(spec, pair) for name, spec in (continuous or {}).items()}
    times: dict[tuple[str, int], list[float]] = {}
    outputs: dict[tuple[str, int], list[list[GenerationResult]]] = {}  # per repeat
    names = list(batchers)

    def run_continuous(rep: int, size: int) -> None:
        for name, policy in flowing.items():
            t0 = time.perf_counter()
            outs = dec.generate_batch([p.prompt for p in prompts], max_new_tokens, tree=policy,
                                      domain=[p.domain for p in prompts], prompt_ids=[p.id for p in prompts],
                                      max_batch=size)
            times.setdefault((name, size), [0.0] * repeats)[rep] = time.perf_counter() - t0
            outputs.setdefault((name, size), [[] for _ in range(repeats)])[rep] = outs

    for rep in range(repeats):
        for size in sizes:
            if rep % 2 == 0:
                run_continuous(rep, size)
            for start in range(0, len(prompts), size):
                batch = prompts[start : start + size]
                for name in row_order(names, rep, start):  # shuffled per batch: drift and carry-over hit rows alike
                    t0 = time.perf_counter()
                    outs = batchers[name](batch)
                    elapsed = time.perf_counter() - t0
                    key = (name, size)
                    times.setdefault(key, [0.0] * repeats)[rep] += elapsed
                    outputs.setdefault(key, [[] for _ in range(repeats)])[rep].extend(outs)
                if on_progress is not None:
                    on_progress()
            if rep % 2 == 1:
                run_continuous(rep, size)
    every = {**specs, **(continuous or {})}
    rows = [_row(name, size, every.get(name), times, outputs[(name, size)], prompts, solo, name in flowing)
            for size in sizes for name in [*names, *flowing]]
    env = {"torch": torch.__version__, "threads": str(torch.get_num_threads()), "python": platform.python_version(),
           "machine": platform.machine(), "device": str(dec.device)}
    return BatchBenchResult(prompts=len(prompts), max_new_tokens=max_new_tokens, repeats=repeats, batch_sizes=sizes,
                            specs=specs, rows=rows, environment=env, wall_s=time.perf_counter() - t_start)


def _row(name: str, size: int, spec: str | None, times: dict[tuple[str, int], list[float]],
         repeats_outs: list[list[GenerationResult]], prompts: list[Prompt],
         solo: dict[str, list[int]], continuous: bool = False) -> BatchRow:
    mine, plain = times[(name, size)], times[(PLAIN, size)]
    outs = repeats_outs[sorted(range(len(mine)), key=mine.__getitem__)[len(mine) // 2]]  # the median repeat's
    tokens = sum(len(o.token_ids) for o in outs)
    batches = [outs[i : i + size] for i in range(0, len(outs), size)]
    # A batch takes as many steps as its slowest row (plain: as many positions as its longest row); a continuous
    # batch's step of r rows is one step of each of them.
    batch_steps = (sum(1 / s.rows for o in outs for s in o.stats.steps) if continuous
                   else sum(max(len(o.stats.steps) for o in b) for b in batches))
    rates = [tokens / t for t in mine]
    steps = [s for o in outs for s in o.stats.steps] if name != PLAIN else []
    busy = sum(s.draft_s + s.verify_s + s.other_s for s in steps)
    share = (lambda part: sum(getattr(s, part) for s in steps) / busy) if busy else (lambda part: None)
    return BatchRow(
        row=name, batch_size=size, spec=spec, new_tokens=tokens, tokens_per_s=statistics.median(rates),
        tokens_per_s_range=(min(rates), max(rates)),
        speedup=statistics.median(p / t for p, t in zip(plain, mine, strict=True)),
        tau=1 + sum(s.accepted for s in steps) / len(steps) if steps else None,
        verified_per_step=sum(s.verified for s in steps) / len(steps) if steps else None,
        draft_share=share("draft_s"), verify_share=share("verify_s"), other_share=share("other_s"),
        step_ms=1000 * statistics.median(mine) / batch_steps,
        target_ms_per_step=1000 * sum(s.verify_s for s in steps) / batch_steps if steps else None,
        mismatches=sum(o.token_ids != solo[p.id] for rep in repeats_outs for o, p in zip(rep, prompts, strict=True)),
    )
