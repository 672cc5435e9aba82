"""`treewise study acceptance`: the cross-domain acceptance study of a collected run.

No numpy, pyarrow or matplotlib at import: the command imports the study when it runs."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from treewise.studies.shared.commands import fail, user_errors, write_json, write_text

from .config import StudyConfig

console = Console()


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
    from treewise.studies.shared.runs import load_run

    from .report import markdown_report, print_report, write_figures
    from .study import analyze

    try:
        cfg = StudyConfig(bootstrap_reps=bootstrap_reps, seed=seed, folds=folds, entropy_bins=entropy_bins)
        data = load_run(run)
        study = analyze(data.nodes, data.steps, data.prompts, cfg, run=str(run), tree=data.manifest.tree,
                        temperature=data.manifest.temperature)
    except user_errors() as err:
        fail(console, err)
    print_report(study, console, missing=data.missing)
    if json_out is not None:
        write_json(json_out, study, console)
    if markdown is not None:
        write_text(markdown, markdown_report(study, data.missing), console)
    if plots is not None:
        for path in write_figures(study, plots):
            console.print(f"wrote {path}")


def register(app: typer.Typer) -> None:
    app.add_typer(study_app, name="study")
