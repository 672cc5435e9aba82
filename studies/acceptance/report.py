"""Printing and plotting the acceptance study: rich tables and matplotlib PNGs (Agg backend)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display needed
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

from .results import DomainStats
from .study import AcceptanceStudy


def _f(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _seed_value(study: AcceptanceStudy, domain: str) -> float | None:
    inverse = {v: k for k, v in study.seed.domain_map.items()}
    return study.seed.acceptance.get(inverse.get(domain, ""))


def _rows(study: AcceptanceStudy) -> list[tuple[str, DomainStats]]:
    return [*study.domains.items(), ("all", study.overall)]


@dataclass
class TableData:
    """A table independent of how it is shown (rich in the terminal, markdown in docs)."""

    title: str
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)


def summary_table(study: AcceptanceStudy) -> TableData:
    t = TableData(f"Acceptance by domain — {study.tree}, T={study.temperature:g}",
                  ["domain", "prompts", "steps", "drafted", "verified", "accept", "seed accept", "tau", "E[L]",
                   "util", "savings", "entropy", "rho [95% CI]", "tok/s"])
    for name, d in _rows(study):
        t.rows.append([name, str(d.prompts), str(d.steps), str(d.drafted_nodes), str(d.verified_nodes),
                       _f(d.acceptance_rate), _f(_seed_value(study, name)), _f(d.tau, 2),
                       _f(d.mean_accepted_length, 2), _f(d.node_utilisation), _f(d.target_call_savings),
                       _f(d.mean_entropy, 2), f"{_f(d.spearman_rho)} [{_f(d.spearman_ci95[0])}, "
                       f"{_f(d.spearman_ci95[1])}]", _f(d.tokens_per_s, 0)])
    return t


def _list_table(title: str, study: AcceptanceStudy, attr: str, label: str) -> TableData:
    width = max(len(getattr(d, attr)) for _, d in _rows(study))
    first = 0 if label == "L=" else 1
    t = TableData(title, ["domain", *[f"{label}{k + first}" for k in range(width)]])
    for name, d in _rows(study):
        values = getattr(d, attr)
        t.rows.append([name, *[_f(v) for v in values], *[""] * (width - len(values))])
    return t


def _rate_table(title: str, study: AcceptanceStudy, attr: str) -> TableData:
    keys = sorted({r.key for _, d in _rows(study) for r in getattr(d, attr)}, key=_sort_key)
    t = TableData(title, ["domain", *keys])
    for name, d in _rows(study):
        by = {r.key: r for r in getattr(d, attr)}
        t.rows.append([name, *[f"{_f(by[k].rate)} ({by[k].nodes})" if k in by else "" for k in keys]])
    return t


def _sort_key(key: str) -> tuple[int, str]:
    return (int(key), "") if key.isdigit() else (10**9, key)


def dvd_table(study: AcceptanceStudy) -> TableData:
    t = TableData("Domain vs depth: out-of-fold log-loss reduction over one global rate (nats per verified node)",
                  ["nodes used", "domains", "nodes", "prompts", "one-rate log-loss", "domain-only [95% CI]",
                   "depth-only [95% CI]", "difference [95% CI]", "stronger"])
    cases = (("all nodes", study.domain_vs_depth), ("all nodes", study.domain_vs_depth_seed_domains),
             ("rank-0 children", study.domain_vs_depth_top1))
    for rows, dvd in cases:
        if dvd is None:
            continue
        ci = lambda lo, hi: f"[{_f(lo, 5)}, {_f(hi, 5)}]"  # noqa: E731
        t.rows.append([rows, ", ".join(dvd.domains), str(dvd.nodes), str(dvd.prompts), _f(dvd.baseline_logloss, 4),
                       f"{_f(dvd.domain_reduction, 5)} {ci(*dvd.domain_ci95)}",
                       f"{_f(dvd.depth_reduction, 5)} {ci(*dvd.depth_ci95)}",
                       f"{_f(dvd.difference, 5)} {ci(*dvd.difference_ci95)}", dvd.stronger])
    return t


def claims_table(study: AcceptanceStudy) -> TableData:
    t = TableData(f"Seed claims ({study.seed.source}: {study.seed.pair}, {study.seed.tree})",
                  ["#", "claim", "holds", "evidence"])
    for c in study.claims:
        t.rows.append([str(c.id), c.claim, "yes" if c.holds else "no", c.evidence])
    return t


def report_tables(study: AcceptanceStudy) -> list[TableData]:
    return [
        summary_table(study),
        _list_table("Distribution of accepted lengths (share of steps)", study, "accepted_length_dist", "L="),
        _list_table("Per-position acceptance (vLLM): share of steps reaching draft position k", study,
                    "per_position_acceptance", "k="),
        _list_table("Depth acceptance, node level (seed definition)", study, "depth_acceptance", "d="),
        _list_table("Depth acceptance given the parent was accepted", study, "depth_acceptance_given_parent", "d="),
        _list_table("On-path acceptance: share of steps reaching depth d", study, "depth_on_path", "d="),
        _rate_table("Acceptance by sibling rank: rate (verified nodes)", study, "by_sibling_rank"),
        _rate_table("Acceptance by token type: rate (verified nodes)", study, "by_token_type"),
        dvd_table(study),
        claims_table(study),
    ]


def _to_rich(t: TableData) -> Table:
    table = Table(title=t.title, show_lines=t.columns[-1] == "evidence")
    for col in t.columns:
        left = col in ("domain", "domains", "nodes used", "claim", "evidence")
        table.add_column(col, justify="left" if left else "right")
    for row in t.rows:
        table.add_row(*[{"yes": "[green]yes[/]", "no": "[red]no[/]"}.get(c, c) for c in row])
    return table


def _notes(study: AcceptanceStudy, missing: int) -> list[str]:
    notes = [f"Greedy check: {study.greedy_checked} prompts compared with plain target greedy, "
             f"{study.greedy_mismatches} mismatches."]
    if study.log_consistency_errors:
        notes.append(f"{study.log_consistency_errors} steps where node rows and the step log disagree on the "
                     "accepted length.")
    if missing:
        notes.append(f"{missing} prompts of the run are not finished yet (shards still running, or refused).")
    return notes


def print_report(study: AcceptanceStudy, console: Console, missing: int = 0) -> None:
    for t in report_tables(study):
        console.print(_to_rich(t))
    for note in _notes(study, missing):
        console.print(note, style="red" if "mismatches" in note and study.greedy_mismatches else None)
    console.print("[dim]Definitions: " + "; ".join(f"{k}: {v}" for k, v in study.definitions.items()) + "[/]")


def markdown_report(study: AcceptanceStudy, missing: int = 0) -> str:
    """The same tables as markdown, for docs."""
    parts = [f"Run `{study.run}`, tree `{study.tree}`, temperature {study.temperature:g}."]
    for t in report_tables(study):
        parts.append(f"**{t.title}**\n")
        parts.append("| " + " | ".join(t.columns) + " |")
        parts.append("|" + "|".join("---" for _ in t.columns) + "|")
        parts.extend("| " + " | ".join(c.replace("|", "/") for c in row) + " |" for row in t.rows)
        parts.append("")
    parts.extend(_notes(study, missing))
    return "\n".join(parts) + "\n"


def _depths(values: list[float]) -> list[int]:
    return list(range(1, len(values) + 1))


def write_figures(study: AcceptanceStudy, out_dir: Path) -> list[Path]:
    """The study's PNGs; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return [fig(study, out_dir) for fig in (_fig_depth, _fig_lengths, _fig_entropy, _fig_seed, _fig_rank_type)]


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _fig_depth(study: AcceptanceStudy, out: Path) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(14, 4), sharey=True)
    panels = (("depth_acceptance", "node-level (seed definition)"),
              ("depth_acceptance_given_parent", "given parent accepted"), ("depth_on_path", "on accepted path"))
    for ax, (attr, title) in zip(axes, panels, strict=True):
        for name, d in study.domains.items():
            ax.plot(_depths(getattr(d, attr)), getattr(d, attr), marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel("depth")
        ax.set_xticks(_depths(study.overall.depth_acceptance))
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("acceptance")
    axes[0].legend()
    fig.suptitle(f"Depth acceptance — {study.tree}")
    return _save(fig, out / "depth_acceptance.png")


def _grouped_bars(ax: plt.Axes, series: dict[str, list[float]], labels: list[str], legend: bool = True) -> None:
    n = max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [k + (i - (n - 1) / 2) * 0.8 / n for k in range(len(values))]
        ax.bar(xs, values, width=0.8 / n, label=name)
    ax.set_xticks(range(len(labels)), labels, rotation=30 if max(map(len, labels), default=0) > 3 else 0)
    ax.grid(alpha=0.3, axis="y")
    if legend:
        ax.legend(fontsize="small")


def _fig_lengths(study: AcceptanceStudy, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4))
    series = {n: d.accepted_length_dist for n, d in study.domains.items()}
    width = max((len(v) for v in series.values()), default=0)
    _grouped_bars(ax, {n: v + [0.0] * (width - len(v)) for n, v in series.items()}, [str(k) for k in range(width)])
    ax.set_xlabel("accepted draft tokens in a step")
    ax.set_ylabel("share of steps")
    ax.set_title(f"Accepted lengths — {study.tree}")
    return _save(fig, out / "accepted_lengths.png")


def _bin_mid(key: str) -> float:
    lo, hi = key.split(":", 1)[1].split("-", 1)
    return (float(lo) + float(hi)) / 2


def _fig_entropy(study: AcceptanceStudy, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4))
    for name, d in study.domains.items():
        ax.plot([_bin_mid(r.key) for r in d.by_entropy_bin], [r.rate for r in d.by_entropy_bin], marker="o",
                label=f"{name} (rho {_f(d.spearman_rho, 2)})")
    ax.set_xlabel("draft entropy (nats), quantile bins")
    ax.set_ylabel("acceptance")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(f"Acceptance vs draft entropy — {study.tree}")
    return _save(fig, out / "entropy_acceptance.png")


def _fig_seed(study: AcceptanceStudy, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 4))
    seed_names = list(study.seed.acceptance)
    ours = [study.domains[study.seed.domain_map[s]].acceptance_rate if study.seed.domain_map[s] in study.domains
            else float("nan") for s in seed_names]
    labels = [f"{s}\n({study.seed.domain_map[s]})" for s in seed_names]
    _grouped_bars(ax, {f"seed ({study.seed.pair})": list(study.seed.acceptance.values()),
                       f"ours ({study.tree})": ours}, labels)
    ax.set_ylabel("conditional acceptance")
    ax.set_title("Per-domain acceptance: seed vs this run")
    return _save(fig, out / "seed_vs_ours.png")


def _fig_rank_type(study: AcceptanceStudy, out: Path) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(14, 4))
    for ax, attr, xlabel in ((axes[0], "by_sibling_rank", "sibling rank"), (axes[1], "by_token_type", "token type")):
        keys = sorted({r.key for d in study.domains.values() for r in getattr(d, attr)}, key=_sort_key)
        series = {}
        for name, d in study.domains.items():
            by = {r.key: r.rate for r in getattr(d, attr)}
            series[name] = [by.get(k, float("nan")) for k in keys]
        _grouped_bars(ax, series, keys, legend=attr == "by_sibling_rank")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("acceptance")
    fig.suptitle(f"Acceptance by sibling rank and token type — {study.tree}")
    return _save(fig, out / "rank_and_token_type.png")
