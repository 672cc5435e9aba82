"""Rich output of ``treewise tune`` / ``treewise report``: a live trial table with a progress bar while
tuning, then the final report (best budgets, held-out speedups, importances) and PNGs from storage."""

from __future__ import annotations

import warnings
from collections import deque
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial
from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from treewise.controller import DomainBudget

from .results import BEST_STATIC, DEFAULTS, TUNED, StudyStart, TrialSummary, TuneReport, dashboard_command

_STATE_STYLE = {"COMPLETE": "green", "PRUNED": "yellow", "FAIL": "red", "RUNNING": "cyan", "WAITING": "dim"}


def budget_text(b: DomainBudget | None) -> str:
    """A budget in one short line; threshold and cost scale only where the family uses them."""
    if b is None:
        return "-"
    text = f"{b.policy} n={b.node_budget} d={b.max_depth} w={b.max_width}"
    return text + (f" thr={b.threshold:.3g} cost={b.cost_scale:.2f}" if b.policy == "learned" else "")


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def state_text(states: dict[str, int]) -> str:
    """``total (complete/pruned/failed)``, plus what is neither (running, waiting) so the parts add up."""
    s = states
    failed = f"[red]{s['FAIL']}[/red]" if s["FAIL"] else "0"
    rest = [f"{s[k]} {k.lower()}" for k in ("RUNNING", "WAITING") if s.get(k)]
    return f"{sum(s.values())} ({s['COMPLETE']}/{s['PRUNED']}/{failed}{', ' + ', '.join(rest) if rest else ''})"


def resume_lines(starts: dict[str, StudyStart]) -> list[str]:
    """One line per study that already has trials: what this run continues from."""
    lines = []
    for st in starts.values():
        if st.trials == st.states.get("WAITING", 0) - st.retried:  # new: at most its warm start is queued
            continue
        s = st.states
        parts = [f"{s['COMPLETE']} complete", f"{s['PRUNED']} pruned", f"{s['FAIL']} failed"]
        if s["RUNNING"]:
            parts.append(f"{s['RUNNING']} running (another worker's, or a dead worker's until its heartbeat times out)")
        if st.retried:
            parts.append(f"{st.retried} of a dead worker re-queued for this run")
        best = f"; best so far #{st.best.number} at {_f(st.best.value, '{:.3f}x')}" if st.best else ""
        lines.append(f"resuming study {st.study}: {st.trials} trials already there ({', '.join(parts)}){best}")
    return lines


class LiveTuneView:
    """A progress bar over all trials, the latest trials and the best so far per domain (from storage, so
    earlier runs and other workers count), redrawn per trial."""

    def __init__(self, console: Console, domains: list[str], trials_per_domain: int, last: int = 10) -> None:
        self.progress = Progress(TextColumn("tuning"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 console=console)
        self.task = self.progress.add_task("tune", total=len(domains) * trials_per_domain)
        self.recent: deque[tuple[str, TrialSummary]] = deque(maxlen=last)
        self.best: dict[str, TrialSummary] = {}
        self.live = Live(self._render(), console=console, refresh_per_second=4, transient=False)

        self.started = False

    def __enter__(self) -> LiveTuneView:
        return self

    def start(self, starts: dict[str, StudyStart] | None = None) -> None:
        """Say what is resumed, then begin drawing (tune calls it when trials begin, so setup errors print on a
        clean console)."""
        for domain, st in (starts or {}).items():
            if st.best is not None:
                self.best[domain] = st.best
        for line in resume_lines(starts or {}):
            self.live.console.print(f"[cyan]{line}[/cyan]")
        if not self.started and self.progress.tasks[0].total:  # nothing to draw for --trials 0
            self.live.start()
            self.started = True

    def __exit__(self, *exc: object) -> None:
        if self.started:
            self.live.stop()

    def on_trial(self, domain: str, trial: FrozenTrial, best: FrozenTrial | None = None) -> None:
        """``best``: the best trial in storage now, the one the final report will name."""
        summary = TrialSummary.of(trial)
        self.recent.append((domain, summary))
        if best is not None:
            self.best[domain] = TrialSummary.of(best)
        self.progress.advance(self.task)
        self.live.update(self._render())

    def _render(self) -> Group:
        trials = Table(title="latest trials", title_justify="left")
        for col in ("domain", "#", "state", "speedup", "tau", "s", "budget / reason"):
            trials.add_column(col, justify="left" if col in ("domain", "state", "budget / reason") else "right")
        for domain, t in self.recent:
            style = _STATE_STYLE.get(t.state, "")
            detail = budget_text(t.budget) if t.state != "FAIL" else f"[red]{t.fail_reason or '?'}[/red]"
            detail += f" (retry of #{t.retry_of}, whose worker died)" if t.retry_of is not None else ""
            trials.add_row(domain, str(t.number), f"[{style}]{t.state}[/{style}]", _f(t.value, "{:.3f}x"),
                           _f(t.tau), _f(t.duration_s, "{:.1f}"), detail)
        best = Table(title="best so far", title_justify="left")
        for col in ("domain", "#", "speedup", "budget"):
            best.add_column(col)
        for domain, t in sorted(self.best.items()):
            best.add_row(domain, str(t.number), _f(t.value, "{:.3f}x"), budget_text(t.budget))
        return Group(self.progress, trials, best)


def budgets_table(report: TuneReport) -> Table:
    t = Table(title=f"tuned budgets: study {report.study_name} ({report.trials} trials) in {report.storage}")
    for col in ("domain", "trials (ok/pruned/failed)", "best #", "speedup (tune)", "tau", "budget",
                "best static (tune)"):
        t.add_column(col, justify="right" if col in ("best #", "speedup (tune)", "tau") else "left")
    for d in report.domains.values():
        b, st = d.best, d.best_static
        t.add_row(d.domain, state_text(d.states), str(b.number) if b else "-", _f(b.value if b else None, "{:.3f}x"),
                  _f(b.tau if b else None), budget_text(b.budget if b else None),
                  f"{_f(st.value, '{:.3f}x')} {budget_text(st.budget)}" if st else "-")
    return t


def heldout_table(report: TuneReport) -> Table | None:
    rows = [d for d in report.domains.values() if d.heldout is not None]
    if not rows:
        return None
    first = rows[0].heldout
    assert first is not None
    t = Table(title=f"held-out speedup over plain decoding: split {first.split}, {first.max_new_tokens} new "
                    f"tokens, {first.repeats} repeats, median (min-max) [tau]")
    t.add_column("domain")
    t.add_column("prompts", justify="right")
    for name in (TUNED, DEFAULTS, BEST_STATIC):
        t.add_column(name, justify="right")
    t.add_column("mismatches", justify="right")
    for d in rows:
        h = d.heldout
        assert h is not None
        cells = []
        for name in (TUNED, DEFAULTS, BEST_STATIC):
            r = h.rows.get(name)
            cells.append("-" if r is None else
                         f"{r.speedup:.2f}x ({r.speedup_range[0]:.2f}-{r.speedup_range[1]:.2f}) [{_f(r.tau)}]")
        mism = sum(r.mismatches for r in h.rows.values())
        t.add_row(d.domain, str(h.prompts), *cells, f"[red]{mism}[/red]" if mism else "0")
    return t


def importances_table(report: TuneReport) -> Table:
    params = sorted({p for d in report.domains.values() for p in d.importances.values})
    t = Table(title="parameter importances (PED-ANOVA over completed trials: what separates the best 10%)")
    t.add_column("domain")
    for p in params:
        t.add_column(p, justify="right")
    t.add_column("note")
    for d in report.domains.values():
        vals = d.importances.values
        t.add_row(d.domain, *[_f(vals.get(p)) for p in params], d.importances.note)
    return t


def failures_table(report: TuneReport) -> Table | None:
    failed = [(d.domain, f) for d in report.domains.values() for f in d.failures]
    if not failed:
        return None
    t = Table(title="failed trials (latest 5 per domain)")
    for col in ("domain", "#", "reason"):
        t.add_column(col)
    for domain, f in failed:
        t.add_row(domain, str(f.number), f.fail_reason or "?")
    return t


def print_report(report: TuneReport, console: Console | None = None, notes: list[str] | None = None) -> None:
    console = console or Console()
    for table in (budgets_table(report), heldout_table(report), importances_table(report), failures_table(report)):
        if table is not None:
            console.print(table)
    held = next((d.heldout.note for d in report.domains.values() if d.heldout and d.heldout.note), "")
    for note in [*(notes or []), held]:
        if note:
            console.print(f"[yellow]note:[/yellow] {note}")
    console.print(f"[dim]trial time in storage: {sum(d.trial_s for d in report.domains.values()):.0f} s; "
                  f"`{dashboard_command(report.storage)}` browses the same studies[/dim]")


def save_plots(storage: optuna.storages.BaseStorage, report: TuneReport, out_dir: Path) -> list[Path]:
    """Optimisation history and importances per domain as PNGs (Agg backend, no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.importance import PedAnovaImportanceEvaluator
    from optuna.visualization import matplotlib as ovm

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for d in report.domains.values():
        study = optuna.load_study(study_name=d.study, storage=storage)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # optuna marks its matplotlib plots experimental
            plots = [("history", lambda s: ovm.plot_optimization_history(s, target_name="speedup"))]
            if d.importances.values:
                plots.append(("importances", lambda s: ovm.plot_param_importances(
                    s, evaluator=PedAnovaImportanceEvaluator(), target_name="speedup")))
            for kind, plot in plots:
                if kind == "history" and d.states["COMPLETE"] == 0:
                    continue
                ax = plot(study)
                loc = "left" if ax.get_title(loc="left") else "center"  # where optuna put its title
                ax.set_title(f"{d.domain}: {ax.get_title(loc=loc)}", loc=loc)
                path = out_dir / f"{d.domain}-{kind}.png"
                ax.figure.savefig(path, dpi=110, bbox_inches="tight")
                plt.close(ax.figure)
                written.append(path)
    return written

