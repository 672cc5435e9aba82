"""``treewise sweep``: tau per verified node at equal budgets (confidence tree, its learned re-rank, LearnedTree).

No torch at import: the command imports the decoder and controller when it runs, so ``--help`` is fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import Progress

from treewise.studies.shared.commands import fail, open_pair, option_default, user_errors, write_json, write_text
from treewise.studies.shared.paths import PAIR_HELP

from .sweep_config import POLICY_HELP, SweepConfig


def _s(name: str) -> Any:
    return option_default(SweepConfig, name)


def parse_budgets(items: list[str] | None) -> list[int] | None:
    """``--budgets 4 --budgets 8`` or ``--budgets 4,8,16,32``."""
    if not items:
        return None
    try:
        return [int(x) for item in items for x in item.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter(f"--budgets {items}: use integers, e.g. --budgets 4,8,16,32") from None


def sweep(
    budgets: Annotated[list[str] | None, typer.Option(
        help="verified-node budgets (repeatable or comma-separated)",
        show_default=",".join(map(str, _s("budgets"))))] = None,
    policy: Annotated[list[str] | None, typer.Option(
        help="policies to run (repeatable): " + "; ".join(f"{k}: {v}" for k, v in POLICY_HELP.items()),
        show_default=",".join(_s("policies")))] = None,
    suite: Annotated[Path, typer.Option(help="prompt suite folder")] = _s("suite"),
    split: Annotated[str, typer.Option(help="train, tune, test or all")] = _s("split"),
    domain: Annotated[list[str] | None, typer.Option(help="only these domains (repeatable)")] = None,
    per_domain: Annotated[int, typer.Option(help="prompts per domain, 0 = all")] = _s("per_domain"),
    max_new_tokens: Annotated[int, typer.Option()] = _s("max_new_tokens"),
    repeats: Annotated[int, typer.Option(help="interleaved repeats (tokens/s: median)")] = _s("repeats"),
    max_depth: Annotated[int, typer.Option(help="deepest tree level, every policy")] = _s("max_depth"),
    top_k: Annotated[int, typer.Option(
        help="confidence/rerank: nodes expanded per level and children each; learned: max_width")] = _s("top_k"),
    online: Annotated[bool, typer.Option("--online/--no-online",
                                         help="learned policies: per-request online correction")] = _s("online"),
    predictor: Annotated[Path | None, typer.Option(
        help="predictor folder", show_default="the pair's predictor")] = None,
    pair: Annotated[str | None, typer.Option(help=PAIR_HELP, show_default=False)] = None,
    target: Annotated[str | None, typer.Option(help="target id or folder (default: the pair's)")] = None,
    draft: Annotated[str | None, typer.Option(help="draft id or folder (default: the pair's)")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result as JSON")] = None,
    plot: Annotated[Path | None, typer.Option(help="write tau against verified nodes as PNG")] = None,
    markdown: Annotated[Path | None, typer.Option(help="write the table and target verdicts as markdown")] = None,
) -> None:
    """Tau, verified and drafted nodes per step and tokens/s of each policy capped at each node budget."""
    console = Console()
    given: dict[str, Any] = {"budgets": parse_budgets(budgets), "policies": policy or None, "domains": domain or None}
    try:
        cfg = SweepConfig(suite=suite, split=split, per_domain=per_domain, max_new_tokens=max_new_tokens,
                          repeats=repeats, max_depth=max_depth, top_k=top_k, online=online, predictor=predictor,
                          pair=pair, target=target, draft=draft, **{k: v for k, v in given.items() if v is not None})
    except ValidationError as err:
        e = err.errors()[0]
        fail(console, f"--{'-'.join(str(x) for x in e['loc']).replace('_', '-')}: {e['msg']}")
    from .sweep import bench_config, run_sweep
    from .sweep_report import plot_sweep, print_sweep, sweep_markdown

    try:
        from treewise.studies.shared.measure import select_prompts

        n = len(select_prompts(bench_config(cfg)))
        open_pair(console, pair, target, draft)  # fetches the real target on first use, says what it borrows
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("sweep", total=n * cfg.repeats)
            result = run_sweep(cfg, on_progress=lambda: progress.advance(task))
    except (*user_errors(), OSError, ValueError) as err:
        fail(console, err)
    print_sweep(result, console)
    if json_out is not None:
        write_json(json_out, result, console)
    if markdown is not None:
        write_text(markdown, sweep_markdown(result), console)
    if plot is not None:
        console.print(f"wrote {plot_sweep(result, plot)}")
