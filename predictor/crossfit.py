"""Cross-fitted evaluation: every prompt scored by a model trained without its fold.

Three ways to cut the folds, from easiest to hardest:

- ``prompt``: prompts shuffled per domain and dealt round-robin into ``k`` folds (what the shipped
  train / test split does, but every prompt is scored once);
- ``source``: per domain, whole source groups (``domain/family``, see ``predictor.sources``) dealt into
  ``k`` folds, the largest first into the fold with the fewest rows of that domain, so a test prompt's
  corpus, generator or template family never appears in training;
- ``domain``: leave one domain out (``k`` is the number of domains); the held-out domain is an unknown
  category to its model, as a user's own domain name would be.

Within a fold's training prompts, ``valid_fraction / (train_fraction + valid_fraction)`` of each domain's
prompts are held back for early stopping and isotonic calibration, as in ``train``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from .config import PredictorConfig
from .features import NodeRows, schema_from_columns
from .model import AcceptancePredictor, PredictorError, fit
from .split import PromptSplit

SplitKind = Literal["prompt", "source", "domain"]


@dataclass(frozen=True)
class Folds:
    kind: str
    fold: np.ndarray  # fold index per row
    held_out: list[list[str]]  # per fold: the prompts' groups it holds out (sources, domains, or a count)

    @property
    def k(self) -> int:
        return len(self.held_out)


def _prompt_folds(prompts: np.ndarray, domains: np.ndarray, k: int, seed: int) -> tuple[np.ndarray, list[list[str]]]:
    keys, first, inverse = np.unique(prompts, return_index=True, return_inverse=True)
    rng = np.random.default_rng(seed)
    fold_of = np.zeros(len(keys), dtype=np.int64)
    start = 0
    for dom in sorted(set(domains[first].tolist())):
        idx = np.flatnonzero(domains[first] == dom)
        fold_of[idx[rng.permutation(len(idx))]] = (np.arange(len(idx)) + start) % k
        start += len(idx)
    counts = np.bincount(fold_of, minlength=k)
    return fold_of[inverse.reshape(-1)], [[f"{int(c)} prompts"] for c in counts]


def _group_folds(groups: np.ndarray, domains: np.ndarray, k: int) -> tuple[np.ndarray, list[list[str]]]:
    """Whole groups per domain into folds, largest first into the fold with the fewest rows so far (over all
    domains: a load kept per domain sent every domain's largest group to fold 0)."""
    fold = np.zeros(len(groups), dtype=np.int64)
    held: list[list[str]] = [[] for _ in range(k)]
    load = np.zeros(k)
    for dom in sorted(set(domains.tolist())):
        in_dom = domains == dom
        names, sizes = np.unique(groups[in_dom], return_counts=True)
        for i in sorted(range(len(names)), key=lambda j: (-sizes[j], names[j])):
            f = int(np.argmin(load))
            load[f] += sizes[i]
            fold[in_dom & (groups == names[i])] = f
            held[f].append(str(names[i]))
    return fold, held


def make_folds(rows: NodeRows, kind: SplitKind, k: int = 3, sources: np.ndarray | None = None,
               seed: int = 0) -> Folds:
    """Fold per row (``sources``: the ``domain/family`` group per row, needed for ``kind="source"``)."""
    prompts, domains = rows.columns["prompt_id"], rows.columns["domain"]
    if kind == "prompt":
        fold, held = _prompt_folds(prompts, domains, k, seed)
    elif kind == "source":
        if sources is None:
            raise PredictorError("a source split needs each prompt's source: pass the suite (--suite)")
        fold, held = _group_folds(np.asarray(sources, dtype=object), domains, k)
    elif kind == "domain":
        names = sorted(set(domains.tolist()))
        lookup = {d: i for i, d in enumerate(names)}
        fold, held = np.asarray([lookup[d] for d in domains.tolist()], dtype=np.int64), [[d] for d in names]
    else:
        raise PredictorError(f"unknown split kind {kind!r}: use prompt, source or domain")
    return Folds(kind, fold, held)


def _valid_split(rows: NodeRows, config: PredictorConfig, seed: int) -> PromptSplit:
    """Hold back a share of each domain's prompts (at least one where a domain has two) for validation."""
    share = config.valid_fraction / (config.train_fraction + config.valid_fraction)
    keys, first = np.unique(rows.group, return_index=True)
    dom = rows.columns["domain"][first]
    rng = np.random.default_rng(seed)
    train: list[str] = []
    valid: list[str] = []
    for d in sorted(set(dom.tolist())):
        members = [str(x) for x in keys[dom == d]]
        members = [members[i] for i in rng.permutation(len(members))]
        n_valid = max(1, round(share * len(members))) if len(members) >= 2 else 0
        valid += members[:n_valid]
        train += members[n_valid:]
    return PromptSplit(sorted(train), sorted(valid), [])


@dataclass(frozen=True)
class CrossFit:
    """Out-of-fold predictions for every row of ``rows`` (also untried rows, when the rows hold them)."""

    folds: Folds
    p: np.ndarray  # calibrated prediction of the model that did not train on the row's fold
    models: list[AcceptancePredictor]

    def fold_info(self) -> list[dict[str, object]]:
        return [{"fold": i, "held_out": h, "trees": int(m.booster.num_trees()),
                 "train_rows": m.metrics["rows"]["train"], "valid_rows": m.metrics["rows"]["valid"]}
                for i, (h, m) in enumerate(zip(self.folds.held_out, self.models, strict=True))]


def cross_fit(rows: NodeRows, folds: Folds, config: PredictorConfig) -> CrossFit:
    """Train one model per fold on the other folds' tried rows; predict the fold's rows."""
    tried = rows.columns.get("tried", np.ones(len(rows), dtype=bool))
    p = np.full(len(rows), np.nan)
    models = []
    for f in range(folds.k):
        test = folds.fold == f
        train_rows = rows.subset(~test & tried)
        if len(train_rows) == 0 or not test.any():
            raise PredictorError(f"fold {f} ({folds.held_out[f]}) leaves no training or no test rows: use fewer folds")
        schema = schema_from_columns(train_rows.columns, config.features)
        model = fit(train_rows, _valid_split(train_rows, config, config.seed + f), schema, config)
        p[test] = model.predict_rows(rows.subset(test))
        models.append(model)
    return CrossFit(folds, p, models)
