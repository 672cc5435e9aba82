"""Replay logged requests in order through the online correction (no decoding needed).

For each request, steps in order: the step's nodes are scored with the correction as it stands (what a
policy would have used), then the correction is updated with the step's labels. ``labels="exact"``
uses the logged accept label of every tried node; ``labels="counts"`` uses only what a policy learns
(the accepted length and the tried count, turned into expected labels by ``infer_step_labels``), which
is what ``controller.LearnedTree`` does while decoding.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from .features import NodeRows
from .online import OnlineCalibrator, OnlineConfig, infer_step_labels

LabelSource = Literal["exact", "counts"]


def _steps(rows: NodeRows) -> list[list[np.ndarray]]:
    """Row indices per request, then per step (nodes in candidate order, parents first)."""
    req = np.unique(rows.request, return_inverse=True)[1].reshape(-1)
    step = rows.columns["step"].astype(np.int64)
    node = rows.columns["node_id"].astype(np.int64)
    order = np.lexsort((node, step, req))
    cut_req = np.flatnonzero(np.diff(req[order])) + 1
    out = []
    for idx in np.split(order, cut_req):
        cuts = np.flatnonzero(np.diff(step[idx])) + 1
        out.append(np.split(idx, cuts))
    return out


def _local_parents(node: np.ndarray, parent: np.ndarray) -> np.ndarray:
    where = {int(n): i for i, n in enumerate(node.tolist())}
    return np.asarray([where.get(int(q), -1) if q >= 0 else -1 for q in parent.tolist()], dtype=np.int64)


def replay_online(rows: NodeRows, p: np.ndarray, config: OnlineConfig | None = None,
                  labels: LabelSource = "exact") -> np.ndarray:
    """The corrected prediction of every row, replaying each request's steps in order.

    ``rows`` must hold every verified row (``select_rows(..., untried=True)``) for ``labels="counts"``;
    ``p`` is the global predictor's output for them.
    """
    tried = rows.columns.get("tried", np.ones(len(rows), dtype=bool))
    on_path = rows.columns.get("on_accepted_path", rows.hard > 0.5)
    node, parent = rows.columns["node_id"].astype(np.int64), rows.columns["parent_id"].astype(np.int64)
    out = np.asarray(p, dtype=np.float64).copy()
    cal = OnlineCalibrator(config or OnlineConfig())
    for request in _steps(rows):
        cal.reset()
        for idx in request:
            base = np.asarray(p[idx], dtype=np.float64)
            out[idx] = cal(base)
            if labels == "exact":
                t = tried[idx]
                cal.update(base[t], rows.hard[idx][t])
                continue
            inferred = infer_step_labels(_local_parents(node[idx], parent[idx]), out[idx],
                                         int(on_path[idx].sum()), int(tried[idx].sum()))
            if inferred is not None:
                m = inferred.weight > 0
                cal.update(base[m], inferred.label[m], inferred.weight[m])
    return out
