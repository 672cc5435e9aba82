"""`treewise collect` and `treewise study acceptance`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from decoder import NodeLogError, TreeDecoder, TreewiseError

from .acceptance import StudyConfig, analyze
from .acceptance_report import markdown_report, print_report, write_figures
from .collect import CollectConfig, CollectPlan, CollectSummary, load_decoder, plan_collect, run_collect, summarize
from .collect_store import PromptRecord, load_run, read_records
from .suites import SuiteError

console = Console()
_USER_ERRORS = (TreewiseError, SuiteError, NodeLogError, ValidationError)


def _default(model: type[BaseModel], name: str) -> Any:
    return model.model_fields[name].get_default(call_default_factory=True)


def _fail(err: Exception) -> NoReturn:
    text = str(err).splitlines()[0] if isinstance(err, ValidationError) else str(err)
    console.print(f"[red]error:[/] {text}")
    raise typer.Exit(2)


def _write_json(path: Path, model: BaseModel) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(model.model_dump_json(indent=1), encoding="utf-8")
    console.print(f"wrote {path}")


def collect_cmd(
    out: Path = typer.Option(..., help="Run folder (runs/NAME/); rerun with the same settings to resume."),
    suite: Path = typer.Option(_default(CollectConfig, "suite"), help="Suite folder of <domain>.jsonl files."),
    split: str = typer.Option(_default(CollectConfig, "split"), help="train, tune, test or all."),
    domain: list[str] = typer.Option(None, help="Only these domains (repeat the option)."),
    tree: str = typer.Option(_default(CollectConfig, "tree"), help="static:width=W,depth=D, "
                      "static:branching=W1-W2-... (children per node by level) or chain:length=L."),
    max_new_tokens: int = typer.Option(_default(CollectConfig, "max_new_tokens"), help="New tokens per prompt."),
    temperature: float = typer.Option(_default(CollectConfig, "temperature"), help="0 = greedy."),
    seed: int = typer.Option(_default(CollectConfig, "seed"), help="Sampling seed base (temperature > 0)."),
    shard: str = typer.Option(_default(CollectConfig, "shard"), help="I/N: this process takes prompts i with "
                              "i mod N = I-1 (shards count from 1)."),
    target: Path = typer.Option(_default(CollectConfig, "target"), help="Target model folder or hub id."),
    draft: Path = typer.Option(_default(CollectConfig, "draft"), help="Draft model folder or hub id."),
    device: str = typer.Option(None, help="cpu or cuda (default: cuda when present)."),
    check_greedy: bool = typer.Option(_default(CollectConfig, "check_greedy"),
                                      help="Greedy runs: also decode with plain target greedy and compare."),
    json_out: Path = typer.Option(None, "--json", help="Write the collect summary as JSON here."),
) -> None:
    """Decode a prompt suite with the tree decoder and write node, step and prompt logs."""
    try:
        cfg = CollectConfig(out=out, suite=suite, split=split, domains=domain or None, tree=tree,
                            max_new_tokens=max_new_tokens, temperature=temperature, seed=seed, shard=shard,
                            target=target, draft=draft, device=device, check_greedy=check_greedy)
        plan = plan_collect(cfg)
        console.print(f"[bold]collect[/] {plan.manifest.tree} -> {plan.layout.run_dir} ({plan.layout.name}): "
                      f"{len(plan.prompts)} prompts, {len(plan.done)} already finished"
                      + (f", {plan.orphans_removed} unfinished files removed" if plan.orphans_removed else ""))
        if plan.pending:
            decoder = load_decoder(cfg)
            summary = _run_with_progress(plan, decoder)
        else:
            summary = summarize(plan, read_records(plan.layout.records_dir), 0, {}, 0.0)
    except _USER_ERRORS as err:
        _fail(err)
    _print_collect_summary(summary)
    if json_out is not None:
        _write_json(json_out, summary)


def _run_with_progress(plan: CollectPlan, decoder: TreeDecoder) -> CollectSummary:
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


study_app = typer.Typer(no_args_is_help=True, add_completion=False, help="Studies over collected runs.")
_STUDY = StudyConfig()


@study_app.command("acceptance")
def acceptance_cmd(
    run: Path = typer.Argument(..., help="Run folder written by `treewise collect` (all shards are read)."),
    json_out: Path = typer.Option(None, "--json", help="Write the study (the machine-readable contract) here."),
    plots: Path = typer.Option(None, help="Write the PNG figures into this folder."),
    markdown: Path = typer.Option(None, help="Write the report's tables as markdown here (for docs)."),
    bootstrap_reps: int = typer.Option(_STUDY.bootstrap_reps, help="Bootstrap replicates (resampling prompts)."),
    seed: int = typer.Option(_STUDY.seed, help="Seed of the bootstrap and the fold split."),
    folds: int = typer.Option(_STUDY.folds, help="Prompt folds of the domain-vs-depth log-loss."),
    entropy_bins: int = typer.Option(_STUDY.entropy_bins, help="Quantile bins of draft entropy."),
) -> None:
    """Cross-domain acceptance study of a collected run: tables, seed claims, figures."""
    try:
        cfg = StudyConfig(bootstrap_reps=bootstrap_reps, seed=seed, folds=folds, entropy_bins=entropy_bins)
        data = load_run(run)
        study = analyze(data.nodes, data.steps, data.prompts, cfg, run=str(run), tree=data.manifest.tree,
                        temperature=data.manifest.temperature)
    except _USER_ERRORS as err:
        _fail(err)
    print_report(study, console, missing=data.missing)
    if json_out is not None:
        _write_json(json_out, study)
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(markdown_report(study, data.missing), encoding="utf-8")
        console.print(f"wrote {markdown}")
    if plots is not None:
        for path in write_figures(study, plots):
            console.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.command("collect")(collect_cmd)
    app.add_typer(study_app, name="study")
