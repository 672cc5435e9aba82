"""`treewise collect`: decode a prompt suite and write node, step and prompt logs into a run folder.

No torch at import: the command imports the collector when it runs, so `--help` is fast."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from treewise.studies.shared.commands import fail, open_pair, option_default, user_errors, write_json
from treewise.studies.shared.paths import PAIR_HELP

from .config import CollectConfig

if TYPE_CHECKING:
    from treewise.decoder import TreeDecoder
    from treewise.studies.shared.runs import PromptRecord

    from .collector import CollectPlan, CollectSummary

console = Console()


def collect_cmd(
    out: Path = typer.Option(..., help="Run folder (runs/NAME/); rerun with the same settings to resume."),
    suite: Path = typer.Option(option_default(CollectConfig, "suite"), help="Suite folder of <domain>.jsonl files."),
    split: str = typer.Option(option_default(CollectConfig, "split"), help="train, tune, test or all."),
    domain: list[str] = typer.Option(None, help="Only these domains (repeat the option)."),
    tree: str = typer.Option(option_default(CollectConfig, "tree"), help="static:width=W,depth=D, "
                      "static:branching=W1-W2-... (children per node by level) or chain:length=L."),
    max_new_tokens: int = typer.Option(option_default(CollectConfig, "max_new_tokens"), help="New tokens per prompt."),
    temperature: float = typer.Option(option_default(CollectConfig, "temperature"), help="0 = greedy."),
    seed: int = typer.Option(option_default(CollectConfig, "seed"), help="Sampling seed base (temperature > 0)."),
    shard: str = typer.Option(option_default(CollectConfig, "shard"), help="I/N: this process takes prompts i with "
                              "i mod N = I-1 (shards count from 1)."),
    pair: str = typer.Option(None, help=PAIR_HELP, show_default=False),
    target: Path = typer.Option(None, help="Target model folder or hub id (default: the pair's)."),
    draft: Path = typer.Option(None, help="Draft model folder or hub id (default: the pair's)."),
    device: str = typer.Option(None, help="cpu or cuda (default: cuda when present)."),
    batch_size: int = typer.Option(option_default(CollectConfig, "batch_size"),
                                   help="Prompts decoded together in one batch (same node rows as 1)."),
    check_greedy: bool = typer.Option(option_default(CollectConfig, "check_greedy"),
                                      help="Greedy runs: also decode with plain target greedy and compare."),
    json_out: Path = typer.Option(None, "--json", help="Write the collect summary as JSON here."),
) -> None:
    """Decode a prompt suite with the tree decoder and write node, step and prompt logs."""
    from treewise.studies.shared.runs import read_records

    from .collector import load_decoder, plan_collect, summarize

    try:
        cfg = CollectConfig(out=out, suite=suite, split=split, domains=domain or None, tree=tree,
                            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, shard=shard,
                            pair=pair, target=target, draft=draft, device=device, check_greedy=check_greedy,
                            batch_size=batch_size)
        open_pair(console, pair, target, draft)  # fetches the real target on first use, says what it borrows
        plan = plan_collect(cfg)  # holds the shard's writer lock until released
    except user_errors() as err:
        fail(console, err)
    try:
        console.print(_plan_line(plan))
        if plan.pending:
            summary = _run_with_progress(plan, load_decoder(plan.config))
        else:
            summary = summarize(plan, read_records(plan.layout.records_dir), 0, {}, 0.0)
    except user_errors() as err:
        fail(console, err)
    finally:
        plan.release()
    _print_collect_summary(summary)
    if json_out is not None:
        write_json(json_out, summary, console)


def _plan_line(plan: CollectPlan) -> str:
    line = (f"[bold]collect[/] {plan.manifest.tree} -> {plan.layout.run_dir} ({plan.layout.name}): "
            f"{len(plan.prompts)} prompts, {len(plan.done)} already finished")
    if plan.done and plan.pending:
        line += f"; resuming: {len(plan.pending)} to go"
    if plan.orphans_removed:
        line += f"; {plan.orphans_removed} unfinished files removed"
    if plan.damaged:
        line += f"; {len(plan.damaged)} prompts with a damaged node file will be collected again"
    return line


def _run_with_progress(plan: CollectPlan, decoder: TreeDecoder) -> CollectSummary:
    from .collector import run_collect

    totals: dict[str, int] = {}
    finished: dict[str, int] = {}
    for p in plan.prompts:
        totals[p.domain] = totals.get(p.domain, 0) + 1
        finished[p.domain] = finished.get(p.domain, 0) + (p.id in plan.done)
    columns = (TextColumn("{task.description:>12}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[info]}"), TimeElapsedColumn())
    with Progress(*columns, console=console) as bar:
        tasks = {d: bar.add_task(d, total=n, completed=finished[d], info="") for d, n in sorted(totals.items())}
        stats: dict[str, list[int]] = {d: [0, 0] for d in totals}

        def advance(record: PromptRecord) -> None:
            s = stats[record.domain]
            s[0], s[1] = s[0] + record.accepted, s[1] + record.n_steps
            info = f"tau {1 + s[0] / max(s[1], 1):.2f}  {record.tokens_per_s:.0f} tok/s"
            bar.update(tasks[record.domain], advance=1, info=info)

        return run_collect(plan, decoder, advance)


def _print_collect_summary(s: CollectSummary) -> None:
    t = Table(title=f"{s.run_dir} {s.shard}: {s.finished}/{s.planned} prompts ({s.collected_now} now)")
    for col in ("domain", "prompts", "steps", "new tokens", "tau", "tok/s", "greedy checked", "mismatches"):
        t.add_column(col, justify="left" if col == "domain" else "right")
    for name, d in s.domains.items():
        t.add_row(name, str(d.prompts), str(d.steps), str(d.new_tokens), f"{d.tau:.2f}", f"{d.tokens_per_s:.0f}",
                  str(d.greedy_checked), str(d.greedy_mismatches))
    console.print(t)
    for pid, err in s.failed.items():
        console.print(f"[yellow]prompt {pid} not collected:[/] {err}")
    if s.greedy_mismatches:
        console.print(f"[red]{s.greedy_mismatches} greedy outputs differ from plain target greedy[/]")



def register(app: typer.Typer) -> None:
    app.command("collect")(collect_cmd)
