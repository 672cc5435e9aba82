"""``treewise train-domains``: the ``domain="auto"`` classifier from a prompt suite's train split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from controller.domains import (
    CLASSIFIER_FILE,
    DomainClassifierConfig,
    DomainReport,
    DomainTraining,
    train_domain_classifier,
)
from decoder import TreewiseError

from .paths import data_dir
from .suites import load_suite

_C = DomainClassifierConfig()


def train_on_suite(suite: Path, config: DomainClassifierConfig | None = None) -> DomainTraining:
    """Fit on the suite's train split, report on its test split (the controller cannot read suites itself)."""
    return train_domain_classifier(load_suite(suite, "train"), load_suite(suite, "test"), config)


def _accuracy_table(report: DomainReport) -> Table:
    table = Table(title=f"domain classifier: test accuracy {report.accuracy:.3f} ({report.n_test} prompts)")
    table.add_column("domain")
    for name in ("test prompts", "correct", "accuracy"):
        table.add_column(name, justify="right")
    for domain, score in report.per_domain.items():
        table.add_row(domain, str(score.n), str(score.correct), f"{score.accuracy:.3f}")
    return table


def _confusion_table(report: DomainReport) -> Table:
    table = Table(title="confusion (rows: true domain, columns: predicted)")
    table.add_column("true \\ predicted")
    for label in report.labels:
        table.add_column(label[:8], justify="right")
    for label, row in zip(report.labels, report.confusion, strict=True):
        cells = [f"[bold]{v}[/bold]" if j == report.labels.index(label) else (str(v) if v else "·")
                 for j, v in enumerate(row)]
        table.add_row(label, *cells)
    return table


def train_domains(
    suite: Annotated[Path, typer.Option(help="prompt suite folder of <domain>.jsonl")] = data_dir() / "prompts",
    out: Annotated[Path, typer.Option(help="where to write the classifier .npz")] = data_dir() / CLASSIFIER_FILE,
    json_out: Annotated[Path | None, typer.Option("--json", help="also write the test report as JSON")] = None,
    buckets: Annotated[int | None, typer.Option(help=f"hashed feature buckets (default {_C.buckets})")] = None,
    alpha: Annotated[float | None, typer.Option(help=f"count smoothing (default {_C.alpha})")] = None,
) -> None:
    """Train the domain classifier for domain="auto" on the train split; report test accuracy and confusion."""
    console = Console()
    overrides = {k: v for k, v in {"buckets": buckets, "alpha": alpha}.items() if v is not None}
    try:
        config = DomainClassifierConfig(**overrides)
        training = train_on_suite(suite, config)
    except ValidationError as err:
        first = err.errors()[0]
        console.print(f"[red]error:[/red] --{first['loc'][0]}: {first['msg']}")
        raise typer.Exit(2) from None
    except TreewiseError as err:  # suite, split and classifier errors all name their fix
        console.print(f"[red]error:[/red] {err}")
        raise typer.Exit(2) from None
    path = training.classifier.save(out)
    report = training.report
    console.print(_accuracy_table(report))
    console.print(_confusion_table(report))
    console.print(f"trained on {report.n_train} prompts; predict median {report.predict_us_median:.0f} µs")
    console.print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report.model_dump(mode="json"), indent=2) + "\n")
        console.print(f"wrote {json_out}")


def register(app: typer.Typer) -> None:
    app.command("train-domains")(train_domains)
