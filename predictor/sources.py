"""Prompt sources: where each prompt of a suite came from, and the source families evaluation holds out.

A suite line records ``source`` per prompt (``human-eval``, ``mt-bench``, ``wordnet``, ``generated``,
``held-out:code``, ``reasoning-gym:gcd``, ...). The *family* is the part before the first ``:``: every
reasoning-gym task comes from one generator library with one prompt style, so holding out ``gcd`` while
training on ``lcm`` would still show the model that style; ``held-out:<domain>`` is one corpus
(held-out text of the pair's corpus) whose suffix only repeats the domain. A *source group* is
``domain/family``: ``generated`` is a different template generator in every domain, and mt-bench's
categories differ by domain, so the same family name in two domains is not the same source.

Node logs carry ``prompt_id`` only; the suite files join it to its source (read here with the json
module, so the predictor does not depend on the studies package that owns suites).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

UNKNOWN_SOURCE = "unknown"


class SourceError(ValueError):
    """A suite cannot be read or does not cover the logged prompts; the message says which."""


def source_family(source: str | None) -> str:
    """``reasoning-gym:gcd`` -> ``reasoning-gym``; ``held-out:code`` -> ``held-out``; None -> unknown."""
    if not source:
        return UNKNOWN_SOURCE
    return source.split(":", 1)[0]


def read_suite_sources(suite: str | Path) -> dict[str, dict[str, str]]:
    """``prompt_id -> {"source", "split", "domain"}`` for every prompt line of a suite folder."""
    folder = Path(suite)
    files = sorted(folder.glob("*.jsonl")) if folder.is_dir() else []
    if not files:
        raise SourceError(f"{folder} holds no <domain>.jsonl prompt files: pass --suite DIR (e.g. data/prompts)")
    out: dict[str, dict[str, str]] = {}
    for path in files:
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                out[str(row["id"])] = {"source": str(row.get("source") or UNKNOWN_SOURCE),
                                       "split": str(row.get("split") or ""), "domain": str(row.get("domain", ""))}
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise SourceError(f"{path}:{lineno}: not a prompt line with an id: {err}") from None
    return out


def source_groups(prompt_ids: np.ndarray, domains: np.ndarray, suite: Mapping[str, Mapping[str, str]]) -> np.ndarray:
    """``domain/family`` per row; raise naming the prompts the suite does not know."""
    uniq, inverse = np.unique(np.asarray(prompt_ids, dtype=object), return_inverse=True)
    missing = [str(p) for p in uniq if p not in suite]
    if missing:
        raise SourceError(
            f"{len(missing)} logged prompts are not in the suite (first: {missing[:3]}): pass the suite the logs "
            "were collected from (--suite)"
        )
    family = np.asarray([source_family(suite[p]["source"]) for p in uniq], dtype=object)[inverse]
    return np.asarray([f"{d}/{f}" for d, f in zip(domains.tolist(), family.tolist(), strict=True)], dtype=object)


def prompt_splits(prompt_ids: np.ndarray, suite: Mapping[str, Mapping[str, str]]) -> np.ndarray:
    """The suite's split (train, tune, test) per row; empty where the suite has none."""
    uniq, inverse = np.unique(np.asarray(prompt_ids, dtype=object), return_inverse=True)
    return np.asarray([suite.get(p, {}).get("split", "") for p in uniq], dtype=object)[inverse]


def keep_suite_split(logs: pa.Table, suite: Mapping[str, Mapping[str, str]], split: str) -> pa.Table:
    """The rows of prompts the suite puts in ``split`` (train, tune or test): train the shipped predictor
    on a run over every split without letting the bench's test prompts in."""
    ids = sorted(p for p, meta in suite.items() if meta.get("split") == split)
    if not ids:
        raise SourceError(f"the suite has no prompt in split {split!r}: use train, tune or test")
    kept = logs.filter(pc.is_in(logs.column("prompt_id"), value_set=pa.array(ids, type=pa.string())))
    if kept.num_rows == 0:
        raise SourceError(f"the logs hold no prompt of the suite's {split!r} split")
    return kept
