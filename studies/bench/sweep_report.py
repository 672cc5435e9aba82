"""``treewise sweep`` output: a rich table, a markdown table (docs/performance.md) and the tau plot."""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .sweep import SweepResult, SweepRow
from .sweep_config import POLICY_HELP

_COLUMNS = ("budget", "policy", "tau", "verified/step", "drafted/step", "tokens/s", "speedup vs plain",
            "tau vs confidence", "mismatches")


def _f(x: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if x is None else fmt.format(x)


def _cells(result: SweepResult, r: SweepRow) -> list[str]:
    check = next((c for c in result.checks if c.policy == r.policy and c.budget == r.budget), None)
    gain = "-" if check is None else f"{check.gain:+.1%}"
    return [str(r.budget), r.policy, _f(r.tau), _f(r.verified_per_step, "{:.1f}"), _f(r.drafted_per_step, "{:.1f}"),
            f"{r.tokens_per_s:.0f}", f"{r.speedup:.2f}x", gain, str(r.mismatches)]


def _title(result: SweepResult) -> str:
    c = result.config
    return (f"treewise sweep: {result.plain.prompts} prompts ({c.split} split), {c.max_new_tokens} new tokens, "
            f"{c.repeats} repeat(s); plain {result.plain.tokens_per_s:.0f} tokens/s")


def _verdicts(result: SweepResult) -> list[str]:
    cfg = result.config
    lines = []
    for c in result.checks:
        if c.policy != cfg.learned_selection:
            continue
        word = "met" if c.met else "MISSED"
        lines.append(f"budget {c.budget}: {c.policy} tau {c.tau:.2f} vs {cfg.baseline} {c.baseline_tau:.2f} "
                     f"({c.gain:+.1%}, target >= {c.required_gain:+.0%}): {word}")
    return lines


def print_sweep(result: SweepResult, console: Console) -> None:
    t = Table(title=_title(result))
    for col in _COLUMNS:
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in result.rows:
        cells = _cells(result, r)
        if r.mismatches:
            cells[-1] = f"[red]{cells[-1]}[/red]"
        t.add_row(*cells)
    console.print(t)
    for line in _verdicts(result):
        console.print(line.replace("MISSED", "[red]MISSED[/red]"))
    for policy in result.config.policies:
        console.print(f"[dim]{policy}: {POLICY_HELP[policy]}[/dim]")


def sweep_markdown(result: SweepResult) -> str:
    """The sweep's table and target verdicts as markdown (what docs/performance.md shows)."""
    lines = [f"{_title(result)}.", "", "| " + " | ".join(_COLUMNS) + " |",
             "|" + "|".join("---" if i == 1 else "---:" for i in range(len(_COLUMNS))) + "|"]
    lines += ["| " + " | ".join(_cells(result, r)) + " |" for r in result.rows]
    lines += [""] + [f"- {v}" for v in _verdicts(result)]
    return "\n".join(lines) + "\n"


def plot_sweep(result: SweepResult, path: Path) -> Path:
    """Tau against verified nodes per step, one line per policy (one point per budget), written as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from treewise.decoder.records.atomic import write_bytes_atomic

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for policy in result.config.policies:
        pts = sorted((r.verified_per_step, r.tau, r.budget) for r in result.rows
                     if r.policy == policy and r.tau is not None and r.verified_per_step is not None)
        if not pts:
            continue
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=policy)
        for x, y, b in pts:
            ax.annotate(str(b), (x, y), textcoords="offset points", xytext=(4, -10), fontsize=7, color="gray")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("verified nodes per step (log2; labels: node budget)")
    ax.set_ylabel("tau (tokens per target call)")
    ax.set_title(f"tau per verified node at equal budgets ({result.plain.prompts} prompts, "
                 f"{result.config.max_new_tokens} tokens)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return write_bytes_atomic(path, buf.getvalue())
