"""`treewise evaluate --split-by prompt|source|domain`: the cross-fitted held-out evaluation, its rich
tables and the same tables as markdown (rendered from ``HeldoutReport.to_dict()``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

SCORER_KEYS = ("n", "auc", "log_loss", "brier", "ece")
ONLINE_SCORERS = ("predictor", "predictor+online", "predictor+online_from_counts")


def run_heldout(logs: list[Path], split_by: str, suite: Path, folds: int, config: Any, ablation: bool,
                ablation_seeds: int, online_grid: bool) -> dict[str, Any]:
    """Evaluate (and optionally ablate) on held-out folds; the JSON-ready report."""
    from treewise.predictor.heldout import evaluate_heldout, heldout_ablation, prepare
    from treewise.predictor.sources import read_suite_sources

    from .data import read_runs

    data = prepare(read_runs(logs), split_by, read_suite_sources(suite), k=folds, seed=config.seed)
    grid = [(a, b) for a in (2.0, 8.0, 32.0) for b in (2.0, 8.0, 32.0, 1e6)] if online_grid else None
    gates = [0.0, 2.0, 4.0, 6.0, 9.0] if online_grid else None
    report = evaluate_heldout(data, config, grid=grid, gates=gates).to_dict()
    report = {"logs": [str(p) for p in logs], "suite": str(suite), "features": list(config.features)} | report
    if ablation:
        report["ablation"] = [_clean(vars(r)) for r in heldout_ablation(data, config, ablation_seeds)]
    return report


def _clean(d: dict[str, Any]) -> dict[str, Any]:
    return {k: (None if isinstance(v, float) and v != v else v) for k, v in d.items()}


def fmt(value: Any) -> str:
    """A table cell: 4 decimals for floats, "-" for a missing value (the learn reports share it)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def _tables(report: dict[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """(title, header, rows) of every table, shared by the terminal and markdown renderers."""
    scorers = report["scorers"]
    domains = sorted(scorers["predictor"]["per_domain"])
    out = [(f"held out by {report['split_by']}: {report['n_prompts']} prompts, {len(report['folds'])} folds",
            ["scorer", *SCORER_KEYS, "max domain ece"],
            [[name, *(fmt(s.get(k)) for k in SCORER_KEYS),
              fmt(max((m["ece"] for m in s["per_domain"].values() if m["ece"] is not None), default=None))]
             for name, s in scorers.items()])]
    on = [n for n in ONLINE_SCORERS if n in scorers]
    out.append(("per domain: AUC (draft prob) and ECE before / after the online correction",
                ["domain", "n", "auc draft_prob", *(f"auc {n}" for n in on), *(f"ece {n}" for n in on)],
                [[d, fmt(scorers["predictor"]["per_domain"][d]["n"]),
                  fmt(scorers["draft_prob"]["per_domain"][d]["auc"]),
                  *(fmt(scorers[n]["per_domain"][d]["auc"]) for n in on),
                  *(fmt(scorers[n]["per_domain"][d]["ece"]) for n in on)] for d in domains]))
    out.append(("folds", ["fold", "held out", "train rows", "trees"],
                [[str(f["fold"]), ", ".join(f["held_out"]), str(f["train_rows"]), str(f["trees"])]
                 for f in report["folds"]]))
    if report.get("by_suite_split"):
        out.append(("by the suite's split", ["split", "scorer", "auc", "log_loss", "ece", "max domain ece"],
                    [[split, name, *(fmt(m[k]) for k in ("auc", "log_loss", "ece", "max_domain_ece"))]
                     for split, per in report["by_suite_split"].items() for name, m in per.items()]))
    if report.get("online_grid"):
        splits = [k for k in report["online_grid"][0] if k not in ("prior_offset", "prior_slope")]
        out.append(("online correction grid (replayed in request order, tried nodes with their labels)",
                    ["prior_offset", "prior_slope", *(f"{s} {k}" for s in splits for k in ("log_loss", "ece",
                                                                                         "max domain ece"))],
                    [[fmt(g["prior_offset"]), fmt(g["prior_slope"]),
                      *(fmt(g[s][k]) for s in splits for k in ("log_loss", "ece", "max_domain_ece"))]
                     for g in report["online_grid"]]))
    if report.get("online_gates"):
        keys = ("auc", "log_loss", "ece", "max_domain_ece")
        out.append(("online correction gate (every row, replayed in request order)", ["gate", *keys, "worst domain"],
                    [[fmt(g["gate"]), *(fmt(g[k]) for k in keys), g["worst_domain"]] for g in report["online_gates"]]))
    if report.get("ablation"):
        keys = ("auc", "log_loss", "ece", "max_domain_ece", "delta_auc", "delta_auc_sd", "delta_log_loss",
                "delta_log_loss_sd")
        out.append((f"feature groups dropped (-) or added (+), {report['ablation'][0]['seeds']} seeds",
                    ["change", "features", *keys],
                    [[a["group"], " ".join(a["features"]), *(fmt(a[k]) for k in keys)] for a in report["ablation"]]))
    return out


def print_heldout(console: Console, report: dict[str, Any]) -> None:
    for title, header, rows in _tables(report):
        table = Table(title=title)
        for i, h in enumerate(header):
            table.add_column(h, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        console.print(table)
    t = report["targets"]
    console.print(f"AUC gain over draft prob {fmt(t['auc_gain_over_draft_prob'])} "
                  f"({fmt(t['auc_gain_online'])} with the correction); max domain ECE {fmt(t['max_domain_ece'])} "
                  f"-> {fmt(t['max_domain_ece_online'])} with the correction; over 0.03: "
                  f"{', '.join(t['domains_over_ece_online']) or 'none'}")


def heldout_markdown(report: dict[str, Any]) -> str:
    parts = []
    for title, header, rows in _tables(report):
        lines = [f"**{title}**", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"
