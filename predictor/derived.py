"""Request-context features: what the decoder knows at run time beyond the node itself.

The node log already carries the request's running acceptance (``running_accept_rate``) and the last
step's accepted length (``prev_accepted``). These add a recent view and the parent's own draft:

- ``recent_accepted``: exponential moving average (weight ``ALPHA`` on the newest) of the accepted
  lengths of the request's earlier steps, a step that drafted nothing counting 0; NaN at the first step.
- ``recent_accept_rate``: the same average of each earlier step's conditional acceptance (accepted /
  tried, steps that tried nothing skipped); NaN until a step tried something.
- ``parent_margin``, ``parent_entropy``: top-1 minus top-2 probability and entropy of the distribution
  the node's parent was drafted from (how sure the draft was one level up); NaN at depth 1.

Both producers are here so that training and serving compute them the same way: ``derived_columns``
from node logs, ``RequestFeatures`` in a policy while decoding (``tests/predictor`` checks that they
agree on a real decode).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

ALPHA = 0.5

DERIVED_COLUMNS: dict[str, pa.DataType] = {
    "recent_accepted": pa.float32(),
    "recent_accept_rate": pa.float32(),
    "parent_margin": pa.float32(),
    "parent_entropy": pa.float32(),
}


def _ema(values: list[float], valid: list[bool]) -> list[float]:
    """The average *before* each step (NaN until a valid value), over the valid earlier steps."""
    out, avg = [], math.nan
    for v, ok in zip(values, valid, strict=True):
        out.append(avg)
        if ok:
            avg = v if avg != avg else ALPHA * v + (1 - ALPHA) * avg
    return out


def _history(req: np.ndarray, step: np.ndarray, on_path: np.ndarray, cond: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per row: the request's recent accepted length and recent acceptance before the row's step."""
    n_req = int(req.max(initial=-1)) + 1
    n_step = int(step.max(initial=-1)) + 2
    accepted = np.bincount(req * n_step + step, weights=on_path, minlength=n_req * n_step).reshape(n_req, n_step)
    tried = np.bincount(req * n_step + step, weights=cond, minlength=n_req * n_step).reshape(n_req, n_step)
    last = np.full(n_req, -1)
    np.maximum.at(last, req, step)
    rec_acc = np.full((n_req, n_step), np.nan)
    rec_rate = np.full((n_req, n_step), np.nan)
    for r in range(n_req):
        k = last[r] + 1
        a, t = accepted[r, :k].tolist(), tried[r, :k].tolist()
        rec_acc[r, :k] = _ema(a, [True] * k)
        rec_rate[r, :k] = _ema([x / y if y else 0.0 for x, y in zip(a, t, strict=True)], [y > 0 for y in t])
    return rec_acc[req, step], rec_rate[req, step]


def parent_row(req: np.ndarray, step: np.ndarray, node: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Each row's parent's row index in the table (-1 at depth 1 or a missing parent): one int64 key per
    (request, step, node), parents looked up by the same key."""
    n_step = int(step.max(initial=0)) + 1
    n_node = int(max(node.max(initial=0), parent.max(initial=0))) + 2
    key = (req * n_step + step) * n_node + node
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    parent_key = (req * n_step + step) * n_node + parent
    pos = np.clip(np.searchsorted(sorted_key, parent_key), 0, max(len(key) - 1, 0))
    found = (parent >= 0) & (sorted_key[pos] == parent_key) if len(key) else np.zeros(0, bool)
    return np.where(found, order[pos] if len(key) else pos, -1)


def _parent_lookup(req: np.ndarray, step: np.ndarray, node: np.ndarray, parent: np.ndarray,
                   values: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Each row's parent's value of every column in ``values`` (NaN at depth 1 or a missing parent)."""
    at = parent_row(req, step, node, parent)
    found = at >= 0
    out = {}
    for name, col in values.items():
        v = np.full(len(at), np.nan)
        v[found] = col[at[found]]
        out[name] = v
    return out


def derived_columns(columns: Mapping[str, np.ndarray], request: np.ndarray, cond: np.ndarray) -> dict[str, np.ndarray]:
    """Derived features for every row of a node-log table (``columns``: its numpy columns; ``request``: the
    run + prompt key per row; ``cond``: rows that count as tried, verified with an accepted parent)."""
    req = np.unique(request, return_inverse=True)[1].astype(np.int64).reshape(-1)
    step = np.asarray(columns["step"], dtype=np.int64)
    on_path = np.asarray(columns["on_accepted_path"], dtype=bool) & np.asarray(columns["verified"], dtype=bool)
    rec_acc, rec_rate = _history(req, step, on_path.astype(np.float64), cond.astype(np.float64))
    par = _parent_lookup(req, step, np.asarray(columns["node_id"], dtype=np.int64),
                         np.asarray(columns["parent_id"], dtype=np.int64),
                         {"parent_margin": np.asarray(columns["draft_margin"], dtype=np.float64),
                          "parent_entropy": np.asarray(columns["draft_entropy"], dtype=np.float64)})
    out = {"recent_accepted": rec_acc, "recent_accept_rate": rec_rate, **par}
    return {k: v.astype(np.float32) for k, v in out.items()}


def _parent_rows(n: int) -> np.ndarray:
    rows = np.zeros((n, 2), dtype=np.float32)
    rows[0] = np.nan
    return rows


@dataclass
class RequestFeatures:
    """The derived features while decoding one request: call ``start`` per request, ``begin_step`` at a
    step's root, ``add`` for each level's features (fills the derived columns in place) and ``observe``
    after each verified step (a step that drafted nothing is observed as 0 accepted, 0 tried).

    A caller that fills its own rows uses ``recent_accepted`` / ``recent_rate``, ``parent_rows`` and
    ``push`` instead of ``add`` (``controller.features``): the same numbers without the dict.
    """

    recent_accepted: float = math.nan
    recent_rate: float = math.nan
    # Row i + 1: (draft_margin, draft_entropy) of this step's candidate i; row 0 is NaN, what a root child reads.
    _parents: np.ndarray = field(default_factory=lambda: _parent_rows(256), repr=False)  # [cap + 1, 2] float32
    _count: int = field(default=0, repr=False)  # this step's candidates pushed so far

    def start(self) -> None:
        self.recent_accepted = self.recent_rate = math.nan
        self.begin_step()

    def begin_step(self) -> None:
        self._count = 0

    def parent_rows(self, parent: np.ndarray) -> np.ndarray:
        """[m, 2] float32 (parent_margin, parent_entropy) of each candidate, NaN under the root; ``parent``:
        candidate index in the step, -1 for the root. One gather: the hot path of ``controller.features``."""
        return self._parents[parent + 1]

    def parent_values(self, parent: np.ndarray) -> dict[str, np.ndarray]:
        """``parent_margin`` and ``parent_entropy`` ([m] float32, NaN under the root) of each candidate;
        ``parent``: candidate index in the step, -1 for the root."""
        rows = self.parent_rows(np.asarray(parent))
        return {"parent_margin": rows[:, 0], "parent_entropy": rows[:, 1]}

    def push(self, margin: np.ndarray, entropy: np.ndarray) -> None:
        """Record one level's candidates (in candidate order) as the parents of the next level."""
        rows, start = self.claim(len(margin))
        rows[start:start + len(margin), 0] = margin
        rows[start:start + len(margin), 1] = entropy

    def claim(self, m: int) -> tuple[np.ndarray, int]:
        """Rows for one level's ``m`` candidates as the next level's parents: the [cap + 1, 2] float32 buffer
        and the row of the first; the caller writes (draft_margin, draft_entropy) there, as ``push`` does."""
        start, end = self._count + 1, self._count + 1 + m
        if end > len(self._parents):
            grown = _parent_rows(2 * end)
            grown[:start] = self._parents[:start]
            self._parents = grown
        self._count += m
        return self._parents, start

    def add(self, features: dict[str, np.ndarray], parent: np.ndarray) -> dict[str, np.ndarray]:
        """Add the derived columns to one level's features; ``parent``: candidate index in the step, -1 root."""
        m = len(parent)
        features["recent_accepted"] = np.full(m, self.recent_accepted, dtype=np.float32)
        features["recent_accept_rate"] = np.full(m, self.recent_rate, dtype=np.float32)
        features |= self.parent_values(parent)
        self.push(features["draft_margin"], features["draft_entropy"])
        return features

    def observe(self, accepted: int, tried: int) -> None:
        a = float(accepted)
        self.recent_accepted = a if self.recent_accepted != self.recent_accepted else (
            ALPHA * a + (1 - ALPHA) * self.recent_accepted)
        if tried > 0:
            r = a / tried
            self.recent_rate = r if self.recent_rate != self.recent_rate else (
                ALPHA * r + (1 - ALPHA) * self.recent_rate)
