"""`treewise train` and `treewise evaluate` (the acceptance predictor from node logs) and `treewise train-domains`
(the ``domain="auto"`` classifier from a suite's train split).

No torch, LightGBM or matplotlib at import: each command imports what it runs, so `--help` is fast."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from treewise.studies.shared.commands import write_text
from treewise.studies.shared.paths import data_dir

if TYPE_CHECKING:
    from treewise.predictor.config import PredictorConfig

# The predictor's and the classifier's defaults live in predictor.config and controller.domains, which import
# torch (through the decoder); they are read when a command runs, and --help names where they live.
_PREDICTOR_DEFAULT = "PredictorConfig's"
_MODEL_DIR = "data/predictor, predictor.config.DEFAULT_MODEL_DIR"


def _model_dir() -> Path:
    from treewise.predictor.config import DEFAULT_MODEL_DIR

    return DEFAULT_MODEL_DIR


def _classifier_path() -> Path:
    from treewise.controller.domains import CLASSIFIER_FILE

    return data_dir() / CLASSIFIER_FILE


def _expected() -> tuple[type[Exception], ...]:
    from treewise.decoder.records.nodelog import NodeLogError
    from treewise.predictor.features import FeatureSchemaError
    from treewise.predictor.model import PredictorError

    return (PredictorError, FeatureSchemaError, NodeLogError)


def _fail(console: Console, message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}")
    return typer.Exit(code=1)


def _config(console: Console, config_file: Path | None, overrides: dict[str, Any]) -> PredictorConfig:
    from treewise.predictor.config import PredictorConfig

    try:
        base = json.loads(config_file.read_text()) if config_file else {}
        return PredictorConfig.model_validate(base | {k: v for k, v in overrides.items() if v is not None})
    except (OSError, json.JSONDecodeError) as err:
        raise _fail(console, f"cannot read --config {config_file}: {err}") from None
    except ValidationError as err:
        raise _fail(console, f"invalid predictor config: {err.errors()[0]['loc']}: {err.errors()[0]['msg']}") from None


_LOGS_HELP = "Run folders (runs/NAME/, read from their nodes/ subfolder) or node-log parquet folders."


def train_command(
    logs: list[Path] = typer.Argument(..., help=_LOGS_HELP),
    out: Path = typer.Option(default_factory=_model_dir, show_default=_MODEL_DIR,
                             help="Folder for model.txt, schema, metrics."),
    label: str | None = typer.Option(None, "--label", help=f"hard|soft (default: {_PREDICTOR_DEFAULT})."),
    calibration: str | None = typer.Option(
        None, "--calibration", help=f"none|isotonic (default: {_PREDICTOR_DEFAULT})."
    ),
    seed: int | None = typer.Option(None, "--seed", help=f"Split and LightGBM seed (default: {_PREDICTOR_DEFAULT})."),
    config_file: Path | None = typer.Option(None, "--config", help="PredictorConfig JSON; flags override it."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the training metrics here."),
    suite_split: str | None = typer.Option(None, "--suite-split", help="Train only on prompts the suite puts "
                                           "in this split (train, tune, test), e.g. logs of a run over all."),
    suite: Path = typer.Option(data_dir() / "prompts", "--suite", help="Suite folder for --suite-split."),
) -> None:
    """Train the LightGBM acceptance predictor on node logs (split by prompt, early stopping, calibration)."""
    from treewise.predictor.model import train
    from treewise.predictor.sources import SourceError, keep_suite_split, read_suite_sources

    from .data import read_runs
    from .report import print_training

    console = Console()
    config = _config(console, config_file, {"label": label, "calibration": calibration, "seed": seed})
    try:
        table = read_runs(logs)
        if suite_split is not None:
            table = keep_suite_split(table, read_suite_sources(suite), suite_split)
        predictor = train(table, config)
    except (*_expected(), SourceError) as err:
        raise _fail(console, str(err)) from None
    predictor.save(out)
    if json_out:
        write_text(json_out, json.dumps(predictor.metrics, indent=2) + "\n")
    print_training(console, predictor.metrics, out)


def evaluate_command(
    logs: list[Path] = typer.Argument(..., help=_LOGS_HELP),
    model: Path = typer.Option(default_factory=_model_dir, show_default=_MODEL_DIR,
                               help="Folder written by `treewise train`."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the full evaluation here."),
    plots: Path | None = typer.Option(None, "--plots", help="Folder for calibration.png and importance.png."),
    ablation: bool = typer.Option(False, "--ablation", help="Retrain without each feature group (same split)."),
    ablation_seeds: int = typer.Option(1, "--ablation-seeds", help="Prompt splits the ablation averages over."),
    compare_labels: bool = typer.Option(False, "--compare-labels", help="Retrain with the other label kind."),
    markdown: Path | None = typer.Option(None, "--markdown", help="Write the tables as markdown here."),
    latency_calls: int = typer.Option(300, "--latency-calls", help="predict_batch calls timed per batch size."),
    online: bool = typer.Option(True, "--online/--no-online", help="Also score the per-request online "
                                "correction, replaying each test request in order."),
    split_by: str | None = typer.Option(None, "--split-by", help="prompt|source|domain: instead of the model's "
                                        "test prompts, cross-fit on folds of the logs held out by prompt, by source "
                                        "family or by domain (trains per fold with --config; ignores --model)."),
    suite: Path = typer.Option(data_dir() / "prompts", "--suite", help="Suite folder (prompt sources, splits)."),
    folds: int = typer.Option(3, "--folds", help="Folds for --split-by prompt|source (domain: one per domain)."),
    online_grid: bool = typer.Option(False, "--online-grid", help="With --split-by: also replay a grid of the "
                                     "correction's prior strengths, scored per suite split."),
    config_file: Path | None = typer.Option(None, "--config", help="PredictorConfig JSON for --split-by."),
    suite_split: str | None = typer.Option(None, "--suite-split", help="Only prompts the suite puts in this split "
                                           "(train, tune, test)."),
) -> None:
    """Score a predictor on the test prompts against draft-prob, entropy, table and HF-threshold baselines."""
    from treewise.predictor.evaluate import evaluate
    from treewise.predictor.model import AcceptancePredictor
    from treewise.predictor.online import OnlineConfig
    from treewise.predictor.sources import SourceError, keep_suite_split, read_suite_sources

    from .data import read_runs
    from .heldout import run_heldout

    console = Console()
    if split_by is not None:
        if split_by not in ("prompt", "source", "domain"):
            raise _fail(console, f"--split-by {split_by!r}: use prompt, source or domain")
        config = _config(console, config_file, {})
        try:
            held = run_heldout(logs, split_by, suite, folds, config, ablation, max(ablation_seeds, 1), online_grid)
        except (*_expected(), SourceError) as err:
            raise _fail(console, str(err)) from None
        return _write_heldout(console, held, json_out, markdown)
    try:
        predictor = AcceptancePredictor.load(model)
        table = read_runs(logs)
        if suite_split is not None:
            table = keep_suite_split(table, read_suite_sources(suite), suite_split)
        report = evaluate(predictor, table, ablation=ablation, compare_labels=compare_labels,
                          ablation_seeds=ablation_seeds, latency_calls=latency_calls,
                          online=OnlineConfig() if online else None).to_dict()
    except (*_expected(), SourceError) as err:
        raise _fail(console, str(err)) from None
    report = {"model": str(model), "logs": [str(p) for p in logs], "suite_split": suite_split} | report
    _write_evaluation(console, report, json_out, plots, markdown)


def _write_evaluation(console: Console, report: dict[str, Any], json_out: Path | None, plots: Path | None,
                      markdown: Path | None) -> None:
    """Print the evaluation and write what the options ask for."""
    from .report import markdown_tables, print_evaluation, write_plots

    print_evaluation(console, report)
    if json_out:
        write_text(json_out, json.dumps(report, indent=2) + "\n")
    if plots:
        for path in write_plots(report, plots):
            console.print(f"wrote {path}")
    if markdown:
        write_text(markdown, markdown_tables(report))


def _write_heldout(console: Console, report: dict[str, Any], json_out: Path | None, markdown: Path | None) -> None:
    from .heldout import heldout_markdown, print_heldout

    print_heldout(console, report)
    if json_out:
        write_text(json_out, json.dumps(report, indent=2) + "\n")
    if markdown:
        write_text(markdown, heldout_markdown(report))


def train_domains(
    suite: Annotated[Path, typer.Option(help="prompt suite folder of <domain>.jsonl")] = data_dir() / "prompts",
    out: Path = typer.Option(default_factory=_classifier_path, help="where to write the classifier .npz",
                             show_default="data/domain_classifier.npz, controller.domains.CLASSIFIER_FILE"),
    json_out: Annotated[Path | None, typer.Option("--json", help="also write the test report as JSON")] = None,
    buckets: Annotated[int | None, typer.Option(help="hashed feature buckets (default: DomainClassifierConfig's)")]
    = None,
    alpha: Annotated[float | None, typer.Option(help="count smoothing (default: DomainClassifierConfig's)")] = None,
) -> None:
    """Train the domain classifier for domain="auto" on the train split; report test accuracy and confusion."""
    from treewise.controller.domains import DomainClassifierConfig
    from treewise.decoder import TreewiseError

    from .data import train_on_suite
    from .report import accuracy_table, confusion_table

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
    console.print(accuracy_table(report))
    console.print(confusion_table(report))
    console.print(f"trained on {report.n_train} prompts; predict median {report.predict_us_median:.0f} µs")
    console.print(f"wrote {path} ({path.stat().st_size / 1024:.0f} KiB)")
    if json_out is not None:
        write_text(json_out, json.dumps(report.model_dump(mode="json"), indent=2) + "\n", console)


def register(app: typer.Typer) -> None:
    app.command("train")(train_command)
    app.command("evaluate")(evaluate_command)
    app.command("train-domains")(train_domains)
