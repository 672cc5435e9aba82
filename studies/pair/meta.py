"""Provenance for the model card: the recipe, shapes and timings of the run under --work."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from .corpus.build import CorpusConfig
from .train import PairConfig

INSTALL = [
    "apt-get update && apt-get install -y wordnet-base dict-foldoc dict-jargon dict-gcide python3.11-doc \\",
    "    bible-kjv bible-kjv-text fortunes fortune-anarchism",
    "pip install -e '.[data]'",
]


def demo_text(rows: list) -> str:  # rows: list[studies.pair.demo.DemoRow]
    lines = [f"{'domain':<12} {'new':>4} {'tau':>5} {'tok/s':>6} {'plain':>6} {'speedup':>7} lossless"]
    for r in rows:
        lines.append(
            f"{r.domain:<12} {r.new_tokens:>4} {r.tau:>5.2f} {r.tokens_per_s:>6.0f} "
            f"{r.plain_tokens_per_s:>6.0f} {r.speedup:>6.2f}x {'yes' if r.same_as_plain else 'NO'}"
        )
    return "\n".join(lines)


def _started(work: Path, run: dict) -> tuple[str, float, str]:
    """Start time and corpus+tokenizer minutes, from train_meta.json (`run`) or else from file times."""
    if run:
        return run["started"], run["prep_minutes"], run.get("note", "")
    t0 = (work / "corpus_train.jsonl").stat().st_mtime
    t1 = (work / "tokens.npz").stat().st_mtime
    start = (work / "train.log").stat().st_ctime if (work / "train.log").exists() else t0
    start = min(start, t0)
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(start)), (t1 - start) / 60, ""


def card_meta(work: Path, command: str, demo: str) -> dict:
    path = work / "train_meta.json"
    run = json.loads(path.read_text()) if path.exists() else {}  # the run's own settings, device and history
    cfg = PairConfig.model_validate(run["config"]) if run else PairConfig()
    started, prep, note = _started(work, run)
    shapes = {
        name: f"{s.layers} layers x {s.hidden}, {s.heads} heads, ffn {s.ffn}"
        for name, s in (("target", cfg.target), ("draft", cfg.draft))
    }
    search = work / "shape_search.json"
    return {
        "install": INSTALL,
        "command": command,
        "report_command": "python -m studies.pair.corpus.prompts && treewise pair-report",
        "seed": cfg.seed,
        "threads": cfg.threads,
        "started": started,
        "prep_minutes": prep,
        "machine": run.get("device") or f"this 2-core CPU ({platform.machine()}, {platform.processor() or 'cpu'})",
        "shapes": shapes,
        "vocab": cfg.vocab_size,
        "context": cfg.context,
        "distill": f"{cfg.distill_weight} x KL(target || draft) + {1 - cfg.distill_weight:.1f} x cross-entropy, "
        "target logits computed on the fly on the same corpus batches",
        "eval_windows": "12 windows of 512 tokens per domain",
        "eval_gen": "8 test prompts per domain, 96 new tokens each",
        "corpus_chars_per_domain": CorpusConfig().chars_per_domain,
        "shape_search": json.loads(search.read_text()) if search.exists() else None,
        "demo": demo,
        "note": note,
        "history": run.get("history", []),  # results of earlier runs this one warm-started from
    }
