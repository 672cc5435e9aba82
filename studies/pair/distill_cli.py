"""`treewise pair train-draft`: distil the real target's draft from its teacher shards (imports no torch)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from treewise.studies.shared.commands import fail, option_default, user_errors
from treewise.studies.shared.config import given

from .config import DistillConfig, FeatureTrainConfig

console = Console()


def _d(name: str) -> object:
    return option_default(DistillConfig, name)


def _f(name: str) -> object:
    return option_default(FeatureTrainConfig, name)


def _layers(text: str | None) -> tuple[int, ...] | None:
    try:
        return tuple(int(x) for x in text.split(",")) if text else None
    except ValueError:
        raise typer.BadParameter(f"--init-layers {text!r}: give comma-separated layer indices, e.g. 0,29") from None


def train_draft_cmd(
    kind: str = typer.Option("standalone", help="standalone (a small model of its own) or feature (one layer fed "
                             "the target's hidden states; reads --features)."),
    features: list[Path] = typer.Option([], help="--kind feature: `treewise pair features` folders (default: the "
                                        "user cache's features/smollm2)."),
    passes: int = typer.Option(3, help="--kind feature: passes over the draft's own guesses (training-time test)."),
    test: list[Path] = typer.Option([], help="--kind feature: features of the test split's teacher answers, scored "
                                    "per domain for the card (`treewise pair teacher --split test`, then "
                                    "`treewise pair features --teacher`)."),
    init: Path | None = typer.Option(None, help="--kind feature: a feature draft folder a fresh run starts from "
                                     "(e.g. data/models/smollm2-feature-draft), so training adds up across "
                                     "machines; a checkpoint in --work wins."),
    teacher: Path = typer.Option(_d("teacher"), help="Shards of `treewise pair teacher`."),
    target: Path | None = typer.Option(None, help="Target folder (default: the fetched SmolLM2)."),
    work: Path | None = typer.Option(None, help="Checkpoint folder (a rerun resumes from it).", show_default=
                                     f"{_d('work')}, feature: {_f('work')}"),
    out: Path | None = typer.Option(None, help="Where the draft folder is written.", show_default=
                                    "data/models/smollm2-draft, feature: data/models/smollm2-feature-draft"),
    layers: int = typer.Option(_d("layers"), help="Draft layers (initialised from the target's first ones)."),
    init_layers: str | None = typer.Option(None, help="Target layers to copy, one per draft layer, e.g. 0,29 "
                                           "(default: the first ones)."),
    vocab: int = typer.Option(_d("vocab"), help="Target tokens the draft keeps (most frequent in answers)."),
    minutes: float | None = typer.Option(None, help="Training budget across restarts.",
                                         show_default=f"{_d('minutes')}, feature: {_f('minutes')}"),
    batch_tokens: int | None = typer.Option(None, help="Padded tokens per optimiser step.",
                                            show_default=f"{_d('batch_tokens')}, feature: {_f('batch_tokens')}"),
    lr: float | None = typer.Option(None, help="Peak learning rate.", show_default=f"{_d('lr')}, feature: {_f('lr')}"),
    threads: int = typer.Option(_d("threads"), help="torch threads."),
) -> None:
    """Distil a small draft for SmolLM2 from its own answers; resumable; writes the folder and its model card."""
    from transformers.utils import logging as hf_logging

    from .distill import train_draft
    from .fetch import SOURCES, fetch

    hf_logging.disable_progress_bar()
    if kind not in ("standalone", "feature"):
        fail(console, f"--kind {kind!r}: use standalone or feature")
    chosen = given({"work": work, "out": out, "minutes": minutes, "batch_tokens": batch_tokens, "lr": lr})
    if kind == "feature":  # each kind's config holds its own defaults for the options not given
        _train_feature(features, test, target, passes, threads, chosen | given({"init": init}))
        return
    try:
        cfg = DistillConfig(teacher=teacher, target=target or fetch(SOURCES["smollm2"]), layers=layers, vocab=vocab,
                            init_layers=_layers(init_layers), threads=threads, **chosen)
        card = _with_bar("train-draft", cfg.minutes, lambda update: train_draft(cfg, update))
    except user_errors() as err:
        fail(console, err)
    table = Table("held-out domain", "tokens", "loss", "coverage", "top-1 agreement")
    for domain, row in card["heldout"].items():
        table.add_row(domain, str(row["tokens"]), f"{row['loss']:.3f}", f"{row['coverage']:.3f}",
                      f"{row['top1_agreement']:.3f}")
    console.print(table)
    console.print(f"{card['steps']} steps, {card['cpu_minutes']} min: {cfg.out}")


def feature_config(features: list[Path], test: list[Path], target: Path | None, passes: int, threads: int,
                   given: dict[str, Any]) -> FeatureTrainConfig:
    """The feature draft's config: the options given, else its own defaults (never the standalone draft's)."""
    from treewise.studies.shared.fetch import cache_root
    from treewise.studies.shared.paths import data_dir

    from .fetch import SOURCES, fetch

    return FeatureTrainConfig(features=tuple(features or [cache_root() / "features" / "smollm2"]), test=tuple(test),
                              target=target or fetch(SOURCES["smollm2"]),
                              to_target=data_dir() / "models" / "smollm2-draft", passes=passes, threads=threads,
                              **given)


def _train_feature(features: list[Path], test: list[Path], target: Path | None, passes: int, threads: int,
                   given: dict[str, Any]) -> None:
    from .feature_train import train_feature_draft

    try:
        cfg = feature_config(features, test, target, passes, threads, given)
        card = _with_bar("feature draft", cfg.minutes, lambda update: train_feature_draft(cfg, update))
    except user_errors() as err:
        fail(console, err)
    table = Table("held-out source", "tokens", *(f"top-1 agreement, pass {i + 1}" for i in range(passes)))
    for source, row in {**card["heldout"], **{f"test {d}": r for d, r in card.get("test", {}).items()}}.items():
        table.add_row(source, str(row["tokens"]), *(f"{a:.3f}" for a in row["top1_agreement"]))
    console.print(table)
    console.print(f"{card['steps']} steps, {card['cpu_minutes']} min: {cfg.out}")


def _with_bar(name: str, minutes: float, train: Callable[[Callable[[Any], None]], dict]) -> dict:
    """Run ``train`` with a progress callback drawing a bar over its time budget (step and loss)."""
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task(name, total=minutes * 60)
        return train(lambda p: bar.update(task, completed=p.elapsed_s, description=f"{name} step {p.step} "
                                          f"loss {p.loss:.3f}"))
