"""Rich tables, PNG figures and markdown tables for the acceptance predictor's training and evaluation,
and the domain classifier's test report.

Everything here renders the plain dicts that ``AcceptancePredictor.metrics`` and
``EvaluationReport.to_dict()`` produce, so the same figures reach the terminal, the JSON and the docs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: figures render to files, no display needed
import matplotlib.pyplot as plt
from rich.console import Console
from rich.table import Table

from treewise.controller.domains import DomainReport

from .heldout import fmt

METRIC_KEYS = ("n", "auc", "log_loss", "brier", "ece")
ABLATION_KEYS = ("auc", "log_loss", "ece", "delta_auc", "delta_auc_sd", "delta_log_loss", "delta_log_loss_sd")


def _metrics_table(title: str, first: str, rows: dict[str, dict[str, Any]], keys: tuple[str, ...] = METRIC_KEYS
                   ) -> Table:
    table = Table(title=title)
    table.add_column(first)
    for k in keys:
        table.add_column(k, justify="right")
    for name, m in rows.items():
        table.add_row(name, *(fmt(m.get(k)) for k in keys))
    return table


def print_training(console: Console, metrics: dict[str, Any], out: Path) -> None:
    rows, prompts = metrics["rows"], metrics["prompts"]
    split = Table(title=f"predictor trained -> {out}")
    for col in ("split", "prompts", "rows"):
        split.add_column(col, justify="right")
    for side in ("train", "valid", "test"):
        split.add_row(side, str(prompts[side]), str(rows[side]))
    console.print(split)
    console.print(_metrics_table(
        f"label={metrics['label']} calibration={metrics['calibration']} trees={metrics['num_trees']}",
        "set", {k: metrics[k] for k in ("valid_uncalibrated", "valid", "test")},
    ))


def _online(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {"predictor+online": report["online"]} if report.get("online") else {}


def print_evaluation(console: Console, report: dict[str, Any]) -> None:
    overall = {"predictor": report} | _online(report) | {f"baseline: {k}": v for k, v in report["baselines"].items()}
    console.print(_metrics_table(f"test prompts: {report['n_prompts']}", "scorer", overall))
    console.print(_metrics_table("predictor per domain", "domain", report["per_domain"]))
    if report.get("online"):
        console.print(_metrics_table("predictor + online correction per domain (requests replayed in order)",
                                     "domain", report["online"]["per_domain"]))
    console.print(_metrics_table("predictor per depth", "depth", report["per_depth"]))
    if report.get("per_source"):  # the draft model's nodes, lookup nodes, and nodes both proposed
        console.print(_metrics_table("predictor per source", "source", report["per_source"]))
        gain = report.get("importance_gain", {})
        lookup = {k: gain[k] for k in ("source", "lookup_prob", "lookup_count", "match_len") if k in gain}
        if lookup:
            console.print("source features' importance (gain): "
                          + ", ".join(f"{k} {fmt(v)}" for k, v in lookup.items()))
    auc = Table(title="AUC per domain: predictor vs baselines")
    auc.add_column("domain")
    auc.add_column("predictor", justify="right")
    for name in report["baselines"]:
        auc.add_column(name, justify="right")
    for dom, m in report["per_domain"].items():
        auc.add_row(dom, fmt(m["auc"]), *(fmt(b["per_domain"][dom]["auc"]) for b in report["baselines"].values()))
    console.print(auc)
    t = report["targets"]
    console.print(
        f"AUC gain over draft prob: {fmt(t['auc_gain_over_draft_prob'])} (target >= 0.03); domains meeting it: "
        f"{len(t['domains_with_auc_gain'])}/{t['domains']}; max domain ECE {fmt(t['max_domain_ece'])} "
        f"(target <= 0.03), over target: {t['domains_over_ece_target'] or 'none'}"
        + (f"; with the online correction {fmt(t.get('max_domain_ece_online'))}, over target: "
           f"{t.get('domains_over_ece_target_online') or 'none'}" if report.get("online") else "")
    )
    lat = report.get("predict_batch_latency", [])
    if lat:
        console.print(_metrics_table("predict_batch wall time", "candidates",
                                     {str(r["batch"]): r for r in lat}, ("calls", "median_us", "p90_us")))
    if "ablation" in report:
        seeds = report["ablation"][0]["seeds"]
        console.print(_metrics_table(f"ablation: drop one feature group and retrain; deltas = mean over {seeds} "
                                     "prompt split(s), sd across them", "dropped",
                                     {a["dropped"]: a for a in report["ablation"]}, ABLATION_KEYS))
    if "labels" in report:
        console.print(_metrics_table("hard vs soft labels (same split, same test rows)", "trained on",
                                     report["labels"], ("auc", "log_loss_hard", "ece_hard", "ece_soft", "brier_soft")))


def write_plots(report: dict[str, Any], directory: Path) -> list[Path]:
    """calibration.png (reliability diagram) and importance.png (gain per feature)."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / "calibration.png", directory / "importance.png"]
    fig, ax = plt.subplots(figsize=(5, 5))
    curve = report["calibration_curve"]
    ax.plot([0, 1], [0, 1], color="grey", linestyle="--", label="perfect")
    ax.plot([b["mean_prediction"] for b in curve], [b["mean_label"] for b in curve], marker="o",
            label=f"predictor (ECE {report['ece']:.3f})")
    ax.set(xlabel="mean predicted acceptance", ylabel="observed acceptance", xlim=(0, 1), ylim=(0, 1),
           title="calibration on test prompts")
    ax.legend()
    fig.tight_layout()
    fig.savefig(paths[0], dpi=120)
    plt.close(fig)
    gain = sorted(report["importance_gain"].items(), key=lambda kv: kv[1])
    fig, ax = plt.subplots(figsize=(6, 0.3 * len(gain) + 1.5))
    ax.barh([k for k, _ in gain], [v for _, v in gain])
    ax.set(xlabel="total split gain", title="feature importance (gain)")
    fig.tight_layout()
    fig.savefig(paths[1], dpi=120)
    plt.close(fig)
    return paths


def markdown_tables(report: dict[str, Any]) -> str:
    """The evaluation as markdown tables (for docs/predictor.md)."""
    def table(first: str, rows: dict[str, dict[str, Any]], keys: tuple[str, ...]) -> str:
        lines = [f"| {first} | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
        lines += [f"| {name} | " + " | ".join(fmt(m.get(k)) for k in keys) + " |" for name, m in rows.items()]
        return "\n".join(lines)

    overall = {"predictor": report} | _online(report) | {f"{k}": v for k, v in report["baselines"].items()}
    parts = [table("scorer", overall, METRIC_KEYS), table("domain", report["per_domain"], METRIC_KEYS)]
    if report.get("online"):
        parts.append(table("domain (+online)", report["online"]["per_domain"], METRIC_KEYS))
    parts.append(table("depth", report["per_depth"], METRIC_KEYS))
    per_dom = {d: {"predictor": m["auc"]} | {b: v["per_domain"][d]["auc"] for b, v in report["baselines"].items()}
               for d, m in report["per_domain"].items()}
    parts.append(table("domain (AUC)", per_dom, ("predictor", *report["baselines"])))
    if report.get("predict_batch_latency"):
        parts.append(table("candidates", {str(r["batch"]): r for r in report["predict_batch_latency"]},
                           ("calls", "median_us", "p90_us")))
    if "ablation" in report:
        parts.append(table("dropped", {a["dropped"]: a for a in report["ablation"]}, ABLATION_KEYS))
    if "labels" in report:
        parts.append(table("trained on", report["labels"],
                           ("auc", "log_loss_hard", "ece_hard", "ece_soft", "brier_soft")))
    return "\n\n".join(parts) + "\n"


def accuracy_table(report: DomainReport) -> Table:
    table = Table(title=f"domain classifier: test accuracy {report.accuracy:.3f} ({report.n_test} prompts)")
    table.add_column("domain")
    for name in ("test prompts", "correct", "accuracy"):
        table.add_column(name, justify="right")
    for domain, score in report.per_domain.items():
        table.add_row(domain, str(score.n), str(score.correct), f"{score.accuracy:.3f}")
    return table


def confusion_table(report: DomainReport) -> Table:
    table = Table(title="confusion (rows: true domain, columns: predicted)")
    table.add_column("true \\ predicted")
    for label in report.labels:
        table.add_column(label[:8], justify="right")
    for label, row in zip(report.labels, report.confusion, strict=True):
        cells = [f"[bold]{v}[/bold]" if j == report.labels.index(label) else (str(v) if v else "·")
                 for j, v in enumerate(row)]
        table.add_row(label, *cells)
    return table
