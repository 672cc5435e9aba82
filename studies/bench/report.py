"""Rich tables for ``treewise bench`` and ``treewise decode``."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from treewise.decoder import GenerationStats
from treewise.studies.shared.measure import BenchResult, Metrics

if TYPE_CHECKING:
    from treewise.controller import LatencyProfile

    from .batched import BatchBenchResult


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _row(name: str, m: Metrics, spec: str | None = None) -> list[str]:
    lo, hi = m.speedup_range
    mism = f"[red]{m.mismatches}[/red]" if m.mismatches else "0"
    return [name + (f" [dim]{spec}[/dim]" if spec else ""), _f(m.tau), _f(m.verified_per_step, "{:.1f}"),
            _f(m.drafted_per_step, "{:.1f}"), f"{m.tokens_per_s:.0f}",
            f"{m.speedup:.2f}x [dim]({lo:.2f}-{hi:.2f})[/dim]",
            "-" if m.speedup_ci95 is None else "{:.2f}-{:.2f}".format(*m.speedup_ci95),
            _f(m.policy_ms_per_step, "{:.3f}"), _f(m.overhead_share, "{:.0%}"), mism]


_COLUMNS = ["row", "tau", "verified/step", "drafted/step", "tokens/s", "speedup vs plain (min-max)",
            "95% interval", "policy ms/step", "overhead", "mismatches"]


def bench_tables(result: BenchResult, per_domain: bool = True) -> list[Table]:
    cfg = result.config
    overall = Table(title=f"treewise bench: {next(iter(result.policies.values())).prompts} prompts, "
                          f"{cfg.max_new_tokens} new tokens, {cfg.repeats} repeats, split {cfg.split}")
    for col in _COLUMNS:
        overall.add_column(col, justify="left" if col == "row" else "right")
    for name, row in result.policies.items():
        overall.add_row(*_row(name, row, row.spec))
    tables = [overall]
    if per_domain:
        domains = sorted({d for r in result.policies.values() for d in r.per_domain})
        t = Table(title="speedup over plain decoding by domain (tau in brackets)")
        t.add_column("row")
        for d in domains:
            t.add_column(d, justify="right")
        for name, row in result.policies.items():
            cells = []
            for d in domains:
                m = row.per_domain[d]
                cells.append(f"{m.speedup:.2f}x" + (f" [dim]({m.tau:.2f})[/dim]" if m.tau is not None else ""))
            t.add_row(name, *cells)
        tables.append(t)
    return tables


def ranking_table(result: BenchResult) -> Table:
    """Every row against the fastest, paired prompt by prompt; the rows the bench cannot tell apart come first."""
    fastest = [r.row for r in result.ranking if r.tied]
    t = Table(title="fastest: " + " = ".join(fastest) + (" (tied: 95% intervals reach 1)" if len(fastest) > 1 else ""))
    for col in ("row", "policy", "tokens/s (pooled)", "vs fastest", "95% interval", ""):
        t.add_column(col, justify="left" if col in ("row", "policy", "") else "right")
    for r in result.ranking:
        lo, hi = r.ci95
        t.add_row(r.row, r.policy, f"{r.tokens_per_s:.1f}", f"{r.vs_fastest:.3f}x", f"{lo:.3f}-{hi:.3f}",
                  "[green]tied[/green]" if r.tied else "")
    return t


def print_bench(result: BenchResult, console: Console | None = None) -> None:
    console = console or Console()
    for t in bench_tables(result):
        console.print(t)
    for row, why in result.skipped.items():
        console.print(f"[yellow]skipped {row}:[/yellow] {why}")
    if result.ranking:
        console.print(ranking_table(result))
    for p in result.paired:
        lo, hi = p.ci95
        console.print(f"{p.a} vs {p.b}: {p.ratio:.3f}x tokens/s (95% bootstrap interval over {p.prompts} prompts: "
                      f"{lo:.3f}-{hi:.3f})")
    hf = result.config
    console.print(f"[dim]hf_assisted: generate(assistant_model=draft), "
                  f"num_assistant_tokens={hf.hf_num_assistant_tokens}, "
                  f"schedule={hf.hf_schedule}, assistant_confidence_threshold={hf.hf_confidence_threshold}; "
                  f"plain: target.generate(do_sample=False). tau = 1 + accepted/steps (vLLM convention). "
                  f"{result.environment}[/dim]")


def step_table(stats: GenerationStats, limit: int = 12) -> Table:
    t = Table(title=f"{stats.n_steps} steps, tau {stats.tau:.2f}, {stats.tokens_per_s:.0f} tokens/s, "
                    f"overhead {stats.overhead_share:.0%}")
    for col in ("step", "drafted", "verified", "accepted", "emitted", "draft ms", "verify ms", "other ms"):
        t.add_column(col, justify="right")
    for i, s in enumerate(stats.steps[:limit]):
        t.add_row(str(i), str(s.drafted), str(s.verified), str(s.accepted), str(s.emitted),
                  f"{1e3 * s.draft_s:.2f}", f"{1e3 * s.verify_s:.2f}", f"{1e3 * s.other_s:.2f}")
    if stats.n_steps > limit:
        t.add_row("...", *[""] * 7)
    return t


def print_batch_bench(result: BatchBenchResult, console: Console) -> None:
    t = Table(title=f"treewise bench --batch-size: {result.prompts} prompts, {result.max_new_tokens} new tokens, "
                    f"{result.repeats} repeats; speedup against batched plain decoding at the same batch size")
    for col in ("batch", "row", "tokens/s (min-max)", "speedup", "tau", "verified/step", "ms/step",
                "target ms/step", "draft", "target", "other", "mismatches"):
        t.add_column(col, justify="left" if col == "row" else "right")
    for r in result.rows:
        lo, hi = r.tokens_per_s_range
        mism = f"[red]{r.mismatches}[/red]" if r.mismatches else "0"
        t.add_row(str(r.batch_size), r.row + (f" [dim]{r.spec}[/dim]" if r.spec else ""),
                  f"{r.tokens_per_s:.0f} [dim]({lo:.0f}-{hi:.0f})[/dim]", f"{r.speedup:.2f}x", _f(r.tau),
                  _f(r.verified_per_step, "{:.1f}"), f"{r.step_ms:.1f}", _f(r.target_ms_per_step, "{:.1f}"),
                  _f(r.draft_share, "{:.0%}"), _f(r.verify_share, "{:.0%}"),
                  _f(r.other_share, "{:.0%}"), mism)
    console.print(t)
    console.print("[dim]draft / target / other: shares of the tree rows' step time (model forwards vs the rest)[/dim]")


def plot_batch_bench(result: BatchBenchResult, path: Path, title: str = "") -> Path:
    """Speedup against batched plain decoding by batch size, one line per row, as a PNG (atomic write)."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from treewise.decoder.records.atomic import write_bytes_atomic

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    names = list(dict.fromkeys(r.row for r in result.rows))
    for name in names:
        rows = sorted((r for r in result.rows if r.row == name), key=lambda r: r.batch_size)
        ax.plot([r.batch_size for r in rows], [r.speedup for r in rows], marker="o", label=name,
                linestyle="--" if name == "plain" else "-")
    ax.set_xscale("log", base=2)
    ax.set_xticks(result.batch_sizes, [str(b) for b in result.batch_sizes])
    ax.set_xlabel("batch size")
    ax.set_ylabel("tokens/s over batched plain decoding")
    ax.set_title(title or f"{result.prompts} prompts, {result.max_new_tokens} new tokens, {result.repeats} repeats")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    write_bytes_atomic(path, buf.getvalue())
    return path


def curve_table(profile: LatencyProfile, title: str) -> Table:
    """A latency profile's curve: ms by new tokens, and each against a plain step (`latency`, `host`)."""
    table = Table(title=title)
    for col in ("tokens", "target", "draft", "target / 1-token target", "draft / 1-token target"):
        table.add_column(col, justify="right")
    one = profile.target_ms[0]  # sizes start at 1: the cost of a plain decoding step
    for n, t, d in zip(profile.sizes, profile.target_ms, profile.draft_ms, strict=True):
        table.add_row(str(n), f"{t:.2f}", f"{d:.2f}", f"{t / one:.2f}", f"{d / one:.3f}")
    return table
