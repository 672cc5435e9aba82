"""``treewise profile``: the per-stage time of a decode step for each tree policy (rich table + ``--json``).

No torch at import (the decoder is imported when the command runs), so ``--help`` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from treewise.studies.shared.commands import fail, open_pair, user_errors, write_json
from treewise.studies.shared.config import ProfileConfig
from treewise.studies.shared.paths import PAIR_HELP

if TYPE_CHECKING:
    from .profile import ProfileResult

_P = ProfileConfig()
_LABELS = {
    "draft_model": "draft forwards", "target_model": "target forward", "masks": "masks, positions, feeds",
    "drafting": "drafting (top-k, frontier, tree)", "policy": "policy (without predictor)",
    "predictor": "predictor", "verify": "verification", "settle": "emit, log, observe",
    "commit": "cache compaction", "other": "other",
}


def profile(
    suite: Annotated[Path, typer.Option(help="prompt suite folder")] = _P.suite,
    split: Annotated[str, typer.Option(help="train, tune, test or all")] = _P.split,
    domain: Annotated[list[str] | None, typer.Option(help="only these domains (repeatable)")] = None,
    per_domain: Annotated[int, typer.Option(help="prompts per domain, 0 = all")] = _P.per_domain,
    max_new_tokens: Annotated[int, typer.Option()] = _P.max_new_tokens,
    tree: Annotated[list[str] | None, typer.Option(
        help="profile NAME=SPEC instead of the default rows (repeatable), e.g. wide=static:width=4,depth=2")] = None,
    pair: Annotated[str | None, typer.Option(help=PAIR_HELP, show_default=False)] = None,
    target: Annotated[str | None, typer.Option(help="target id or folder (default: the pair's)")] = None,
    draft: Annotated[str | None, typer.Option(help="draft id or folder (default: the pair's)")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result as JSON")] = None,
) -> None:
    """Where a decode step's time goes, stage by stage, for each tree policy."""
    from .profile import run_profile

    console = Console()
    trees = dict(_P.trees)
    if tree:
        trees = {}
        for item in tree:
            name, eq, spec = item.partition("=")
            if not eq:
                raise typer.BadParameter(f"--tree {item!r}: use NAME=SPEC")
            trees[name] = spec
    try:
        cfg = ProfileConfig(suite=suite, split=split, domains=domain or None, per_domain=per_domain,
                            max_new_tokens=max_new_tokens, trees=trees, pair=pair, target=target, draft=draft)
        open_pair(console, pair, target, draft)  # fetches the real target on first use, says what it borrows
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("profile", total=None)
            result = run_profile(cfg, on_progress=lambda: progress.advance(task))
    except user_errors() as err:
        fail(console, err)
    print_profile(result, console)
    if json_out is not None:
        write_json(json_out, result, console)


def print_profile(result: ProfileResult, console: Console) -> None:
    names = list(result.policies)
    table = Table(title=f"treewise profile: ms per step (share of step), {result.prompts} prompts, "
                        f"{result.config.max_new_tokens} new tokens")
    table.add_column("stage")
    for name in names:
        table.add_column(name, justify="right")
    for stage, label in _LABELS.items():
        cells = [result.policies[n].stages[stage] for n in names]
        table.add_row(label, *(f"{c.ms_per_step:.3f} ({100 * c.share:.1f}%)" for c in cells))
    table.add_section()
    pols = [result.policies[n] for n in names]
    table.add_row("step", *(f"{p.ms_per_step:.2f}" for p in pols))
    table.add_row("outside model forwards", *(f"{100 * p.outside_forwards_share:.1f}%" for p in pols))
    table.add_row("tau", *(f"{p.tau:.2f}" for p in pols))
    table.add_row("verified / drafted per step", *(f"{p.verified_per_step:.1f} / {p.drafted_per_step:.1f}"
                                                   for p in pols))
    table.add_row("tokens/s (step time only)", *(f"{p.tokens_per_s:.0f}" for p in pols))
    console.print(table)


def forest_bench(
    model: Annotated[Path, typer.Option(help="predictor folder (holds model.txt)")] = Path("data/predictor"),
    rows: Annotated[list[int] | None, typer.Option(help="rows per call (repeatable)")] = None,
    calls: Annotated[int, typer.Option(help="timed calls per size (median)")] = 2000,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the result as JSON")] = None,
) -> None:
    """Microseconds per call of the predictor's forest: numba walk vs LightGBM's predict."""
    from .forest import time_forest

    console = Console()
    try:
        result = time_forest(model, tuple(rows or (4, 16, 64)), calls)
    except user_errors() as err:
        fail(console, err)
    table = Table(title=f"forest of {result.trees} trees ({result.nodes} nodes): median us per call")
    for col in ("rows", "numba forest", "LightGBM predict"):
        table.add_column(col, justify="right")
    for t in result.timings:
        table.add_row(str(t.rows), "-" if t.numba_us is None else f"{t.numba_us:.1f}", f"{t.lightgbm_us:.1f}")
    console.print(table)
    if json_out is not None:
        write_json(json_out, result, console)


def register(app: typer.Typer) -> None:
    app.command()(profile)
    app.command("forest-bench")(forest_bench)
