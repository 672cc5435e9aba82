"""``treewise tune`` (Optuna tunes per-domain budgets against measured speedup) and ``treewise report``.

Several workers may run ``treewise tune`` on one storage at once (give each ``--worker`` and its own
``--seed``, then finish with ``--trials 0``, which writes the budgets and runs the held-out comparison).
``optuna-dashboard sqlite:///runs/tune.db`` (or ``optuna-dashboard PATH`` for a journal file) shows the
same studies in a browser while they run.

No optuna or torch at import: each command imports the tuner when it runs, so `--help` is fast.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError
from rich.console import Console

from treewise.studies.shared.commands import open_pair, option_default
from treewise.studies.shared.paths import PAIR_HELP

from .config import SearchSpace, TuneConfig

if TYPE_CHECKING:
    from .results import TuneReport


def _t(name: str) -> Any:
    """A TuneConfig default; read field by field because building a TuneConfig validates its search space
    against the controller's bounds, which imports torch."""
    return option_default(TuneConfig, name)


def _write_json(report: TuneReport, path: Path, console: Console, extra: dict | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**report.model_dump(mode="json"), **(extra or {})}, indent=2) + "\n")
    console.print(f"wrote {path}")


def _fail(console: Console, message: str) -> typer.Exit:
    console.print(f"[red]error:[/red] {message}")
    return typer.Exit(2)


def _validation_message(err: ValidationError) -> str:
    e = err.errors()[0]
    return f"--{'-'.join(str(x) for x in e['loc']).replace('_', '-')}: {e['msg']}"


def _command_line(ctx: typer.Context) -> str:
    """The options given on the command line (not defaults), for the budgets file's provenance."""
    parts = ["treewise", ctx.info_name or "tune"]
    for param in ctx.command.params:
        source = ctx.get_parameter_source(param.name or "")
        if source is None or source.name != "COMMANDLINE":  # typer may bundle its own click: compare by name
            continue
        value = ctx.params[param.name or ""]
        if isinstance(value, bool):
            parts += [param.opts[0]] if value else []
        else:
            values = value if isinstance(value, (list, tuple)) else [value]
            parts += [x for v in values for x in (param.opts[0], str(v))]
    return shlex.join(parts)


def tune_cmd(
    ctx: typer.Context,
    domain: Annotated[list[str] | None, typer.Option(help="domain to tune (repeatable) or all")] = None,
    trials: Annotated[int, typer.Option(help="more trials per domain (added to the study); 0 only finalises")]
    = _t("trials"),
    storage: Annotated[str, typer.Option(help="Optuna storage URL; journal:///PATH for a journal file")]
    = _t("storage"),
    study_name: Annotated[str, typer.Option(help="study prefix; each domain's study is NAME-DOMAIN")]
    = _t("study_name"),
    suite: Annotated[Path, typer.Option(help="prompt suite folder")] = _t("suite"),
    family: Annotated[list[str] | None, typer.Option(help="policy families to search (repeatable): "
                                                          "static, confidence, learned")] = None,
    per_domain: Annotated[int, typer.Option(help="tune-split prompts per domain")] = _t("per_domain"),
    heldout_per_domain: Annotated[int, typer.Option(help="test-split prompts per domain; 0 skips")]
    = _t("heldout_per_domain"),
    max_new_tokens: Annotated[int, typer.Option()] = _t("max_new_tokens"),
    repeats: Annotated[int, typer.Option(help="interleaved plain/policy repeats per prompt")] = _t("repeats"),
    seed: Annotated[int | None, typer.Option(help="sampler seed (give each worker its own)")] = _t("seed"),
    timeout: Annotated[float | None, typer.Option(help="seconds per domain before stopping its trials")] = None,
    pruner: Annotated[str, typer.Option(help="median or none")] = _t("pruner"),
    pruner_warmup: Annotated[int, typer.Option(help="prompts measured before pruning")] = _t("pruner_warmup_steps"),
    predictor: Annotated[Path | None, typer.Option(help="predictor folder (default: data/predictor)")] = None,
    node_budget_max: Annotated[int, typer.Option(help="largest node budget searched (a target whose verification "
                                                      "costs grow fast, such as a CPU one, wants a small one)")]
    = option_default(SearchSpace, "node_budget").high,
    depth_max: Annotated[int, typer.Option(help="deepest tree searched")] = option_default(
        SearchSpace, "max_depth").high,
    warm_start: Annotated[bool, typer.Option(help="a new study's first trial measures the budgets file's present "
                                                  "entry for its domain")] = _t("warm_start"),
    budgets_out: Path | None = typer.Option(None, help="budgets file to write", show_default="the pair's "
                                            "budgets.json: data/budgets.json (micro), data/smollm2/budgets.json"),
    worker: Annotated[bool, typer.Option("--worker", help="only run trials: no budgets file, no held-out run")]
    = False,
    heartbeat: Annotated[int, typer.Option(help="seconds between heartbeats of a running trial (SQLite, PostgreSQL, "
                                                "MySQL); one silent 3x as long is failed and re-run")]
    = _t("heartbeat_s"),
    pair: Annotated[str | None, typer.Option(help=PAIR_HELP, show_default=False)] = None,
    target: Annotated[str | None, typer.Option(help="target id or folder (default: the pair's)")] = None,
    draft: Annotated[str | None, typer.Option(help="draft id or folder (default: the pair's)")] = None,
    json_out: Annotated[Path | None, typer.Option("--json", help="write the report as JSON")] = None,
    plots: Annotated[Path | None, typer.Option(help="folder for history and importance PNGs")] = None,
) -> None:
    """Tune each domain's tree budget with Optuna against speedup measured over plain decoding."""
    import optuna

    console = Console()
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # the live table shows each trial and failure reason
    domains = None if not domain or "all" in domain else domain
    space = _space(family, node_budget_max, depth_max, console)
    try:
        cfg = TuneConfig(domains=domains, trials=trials, storage=storage, study_name=study_name, suite=suite,
                         per_domain=per_domain, heldout_per_domain=heldout_per_domain, max_new_tokens=max_new_tokens,
                         repeats=repeats, seed=seed, timeout_s=timeout, pruner=pruner,
                         pruner_warmup_steps=pruner_warmup, space=space, predictor=predictor,
                         budgets_out=budgets_out, finalize=not worker, pair=pair, target=target, draft=draft,
                         heartbeat_s=heartbeat, warm_start=warm_start)
    except ValidationError as err:
        raise _fail(console, _validation_message(err)) from None
    _run(cfg, _command_line(ctx), console, json_out, plots)


def _space(family: list[str] | None, node_budget_max: int, depth_max: int, console: Console) -> SearchSpace:
    """The search space the options ask for: the default's families and ranges, their highs overridden."""
    try:
        base = SearchSpace()
        return SearchSpace(
            families=tuple(family) if family else base.families,
            node_budget=base.node_budget.model_copy(update={"high": node_budget_max}),
            max_depth=base.max_depth.model_copy(update={"high": depth_max}))
    except ValidationError as err:
        raise _fail(console, f"--family/--node-budget-max/--depth-max: {err.errors()[0]['msg']}") from None


def _run(cfg: TuneConfig, command: str, console: Console, json_out: Path | None, plots: Path | None) -> None:
    """Tune under the live view, then print, plot and write what came out."""
    from treewise.decoder import TreewiseError

    from .report import LiveTuneView, print_report
    from .search import resolve_domains, tune
    from .storage import safe_url

    try:
        names = resolve_domains(cfg)
        open_pair(console, cfg.pair, cfg.target, cfg.draft)  # fetches the real target on first use
        console.print(f"[dim]tuning {', '.join(names)}: loading models...[/dim]")
        with LiveTuneView(console, names, cfg.trials) as view:  # drawn once the trials start
            result = tune(cfg, on_trial=view.on_trial, on_start=view.start, command=command)
    except TreewiseError as err:
        raise _fail(console, str(err)) from None
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted[/yellow]: finished trials are saved in {safe_url(cfg.storage)}; rerun "
                      "the same command to continue")
        raise typer.Exit(130) from None
    print_report(result.report, console, result.notes)
    console.print(f"tuning took {result.wall_s:.0f} s")
    if result.budgets_path is not None:
        console.print(f"wrote {result.budgets_path}")
    elif cfg.finalize:
        console.print("[red]no trial completed in any domain: no budgets written[/red]")
    _outputs(result.report, cfg.storage, console, json_out, plots,
             {"budgets_path": str(result.budgets_path) if result.budgets_path else None, "notes": result.notes,
              "wall_s": result.wall_s})
    if cfg.finalize and result.budgets_path is None:
        raise typer.Exit(1)


def _outputs(report: TuneReport, storage: str, console: Console, json_out: Path | None, plots: Path | None,
             extra: dict | None = None) -> None:
    from .report import save_plots
    from .results import open_storage

    if plots is not None:
        for path in save_plots(open_storage(storage, must_exist=True), report, plots):
            console.print(f"wrote {path}")
    if json_out is not None:
        _write_json(report, json_out, console, extra)


def report_cmd(
    storage: Annotated[str, typer.Option(help="the Optuna storage URL `treewise tune` used")] = _t("storage"),
    study_name: Annotated[str, typer.Option(help="the study prefix `treewise tune` used")] = _t("study_name"),
    json_out: Annotated[Path | None, typer.Option("--json", help="write the report as JSON")] = None,
    plots: Annotated[Path | None, typer.Option(help="folder for history and importance PNGs")] = None,
) -> None:
    """Reprint a tuning report from storage alone (no models loaded, nothing decoded)."""
    import optuna

    from treewise.decoder import TreewiseError

    from .report import print_report
    from .results import build_report, open_storage
    from .storage import safe_url

    console = Console()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    try:
        report = build_report(open_storage(storage, must_exist=True), study_name, storage_url=safe_url(storage))
    except TreewiseError as err:
        raise _fail(console, str(err)) from None
    print_report(report, console)
    _outputs(report, storage, console, json_out, plots)


def register(app: typer.Typer) -> None:
    app.command("tune")(tune_cmd)
    app.command("report")(report_cmd)
