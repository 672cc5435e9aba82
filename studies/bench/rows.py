"""The bench's rows: every tree policy of the config, plain target decoding and HF assisted generation."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from treewise.decoder import GenerationResult, TreeDecoder
from treewise.studies.shared.measure import (
    HF,
    HF_LOOKUP,
    PLAIN,
    BenchConfig,
    BenchResult,
    Runner,
    load_bench_decoder,
    measure,
    select_prompts,
    summarize,
)
from treewise.studies.shared.suites import Prompt
from treewise.studies.shared.treespec import TreeSpecError, build_tree


def hf_assisted_runner(dec: TreeDecoder, cfg: BenchConfig) -> Runner:
    gc = dec.draft.generation_config
    gc.num_assistant_tokens = cfg.hf_num_assistant_tokens
    gc.num_assistant_tokens_schedule = cfg.hf_schedule
    gc.assistant_confidence_threshold = cfg.hf_confidence_threshold

    def run(p: Prompt) -> GenerationResult:
        return dec.generate_plain(p.prompt, cfg.max_new_tokens, assistant=dec.draft)

    return run


@dataclass
class _Rows:
    runners: dict[str, Runner]
    specs: dict[str, str]  # runner key -> tree spec
    skipped: dict[str, str]  # row -> reason


def build_runners(dec: TreeDecoder, cfg: BenchConfig) -> _Rows:
    """Row name (or ``row@spec`` for multi-candidate rows) -> runner.

    A row whose policy needs shipped data that is missing (the learned predictor) is skipped with its reason;
    a malformed spec is an error.
    """
    runners: dict[str, Runner] = {PLAIN: lambda p: dec.generate_plain(p.prompt, cfg.max_new_tokens)}
    specs: dict[str, str] = {}
    skipped: dict[str, str] = {}
    if cfg.hf_assisted and dec.reads_features:
        skipped[HF] = "HF assisted generation runs a standalone draft only; this pair's draft is a feature draft"
    elif cfg.hf_assisted:
        runners[HF] = hf_assisted_runner(dec, cfg)
    if cfg.hf_prompt_lookup > 0:
        runners[HF_LOOKUP] = lambda p: dec.generate_plain(p.prompt, cfg.max_new_tokens,
                                                          prompt_lookup=cfg.hf_prompt_lookup)
    for row, candidates in cfg.trees.items():
        for spec in candidates:
            try:
                policy = build_tree(spec, cfg.pair)
            except TreeSpecError:
                raise
            except (ValueError, OSError) as err:  # e.g. no shipped predictor: the row cannot run here
                skipped[row] = str(err)
                continue
            key = row if len(candidates) == 1 else f"{row}@{spec}"
            runners[key] = (lambda pol: lambda p: dec.generate(p.prompt, cfg.max_new_tokens, tree=pol,
                                                               domain=p.domain, prompt_id=p.id))(policy)
            specs[key] = spec
    return _Rows(runners, specs, skipped)



def run_bench(cfg: BenchConfig, dec: TreeDecoder | None = None,
              on_progress: Callable[[], None] | None = None) -> BenchResult:
    prompts = select_prompts(cfg)
    dec = dec or load_bench_decoder(cfg)
    rows = build_runners(dec, cfg)
    t0 = time.perf_counter()
    runs = measure(rows.runners, prompts, cfg.repeats, on_progress)
    return summarize(runs, rows.specs, prompts, cfg, time.perf_counter() - t0, rows.skipped)
