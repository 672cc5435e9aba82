"""Online calibration per request: a Platt-style correction of the predictor, refitted after every step.

The corrected probability is ``sigmoid(offset + slope * logit(p))`` where ``p`` is the global predictor's
output. After each verified step the correction is refitted, by a few Newton steps from its current
value, to every (p, label) pair the request has produced so far, under a Gaussian prior centred on the
identity (offset 0, slope 1): ``prior_offset`` and ``prior_slope`` are the prior's precisions, in the
units of the log-likelihood's curvature (one row at p = 0.5 adds 0.25 to the offset's curvature). So a
request starts at the global model and moves away from it only as far as its own evidence outweighs
the prior; a calibrated predictor's evidence averages out and the correction stays near the identity.

Labels: replaying logs gives each verified node's accept label. A policy only learns the step's
accepted length and how many verified nodes had an accepted parent (``decoder.StepOutcome``), so
``infer_step_labels`` turns those two counts into expected labels: the accepted path ends at a node of
depth ``accepted`` (the root when 0), each such path is weighted by the (corrected) predictions along
it and by the chance that none of its end's children was accepted, and paths whose tried count differs
from the observed one get no weight. Siblings are mutually exclusive (the target has one argmax per
parent), so a node's expected label is the posterior chance that it is on the path, given that its
parent is; the row's weight is the posterior chance that its parent is on the path.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

_CLIP = 1e-4
SLOPE_RANGE = (0.1, 10.0)  # a slope at or below 0 would invert the predictor's ranking


class OnlineConfig(BaseModel):
    """Hyper-parameters of the per-request correction (defaults chosen in docs/predictor.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prior_offset: float = Field(8.0, gt=0)  # precision of the prior on the offset
    prior_slope: float = Field(8.0, gt=0)  # precision of the prior on the slope
    iterations: int = Field(2, ge=1)  # Newton steps per update (warm-started)
    max_rows: int = Field(4096, ge=1)  # history kept per request; older rows are dropped


def logit(p: np.ndarray) -> np.ndarray:
    q = np.clip(np.asarray(p, dtype=np.float64), _CLIP, 1 - _CLIP)
    return np.log(q / (1 - q))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -50.0, 50.0)))


@dataclass
class OnlineCalibrator:
    """One request's correction; ``reset`` at the start of each request, ``update`` after each step."""

    config: OnlineConfig = field(default_factory=OnlineConfig)
    offset: float = 0.0
    slope: float = 1.0
    _z: list[np.ndarray] = field(default_factory=list, repr=False)
    _y: list[np.ndarray] = field(default_factory=list, repr=False)
    _w: list[np.ndarray] = field(default_factory=list, repr=False)
    _rows: int = field(default=0, repr=False)

    def reset(self) -> None:
        self.offset, self.slope = 0.0, 1.0
        self._z, self._y, self._w, self._rows = [], [], [], 0

    @property
    def rows(self) -> int:
        """Rows of evidence held (weights summed are at most this)."""
        return self._rows

    def __call__(self, p: np.ndarray) -> np.ndarray:
        """Corrected probabilities (the identity until the first update moves the parameters)."""
        if self.offset == 0.0 and self.slope == 1.0:
            return np.asarray(p, dtype=np.float64)
        return _sigmoid(self.offset + self.slope * logit(p))

    def update(self, p: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> None:
        """Add one step's rows (global predictions, labels in [0, 1], optional weights) and refit."""
        p = np.asarray(p, dtype=np.float64)
        if p.size == 0:
            return
        w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=np.float64)
        self._z.append(logit(p))
        self._y.append(np.asarray(labels, dtype=np.float64))
        self._w.append(w)
        self._rows += p.size
        while self._rows - self._z[0].size >= self.config.max_rows and len(self._z) > 1:
            self._rows -= self._z.pop(0).size
            self._y.pop(0)
            self._w.pop(0)
        self._refit(np.concatenate(self._z), np.concatenate(self._y), np.concatenate(self._w))

    def _refit(self, z: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
        """Newton steps on the penalised weighted log-likelihood (convex: the 2 x 2 Hessian is positive)."""
        la, lb = self.config.prior_offset, self.config.prior_slope
        a, b = self.offset, self.slope
        for _ in range(self.config.iterations):
            q = _sigmoid(a + b * z)
            r = w * (q - y)
            h = w * q * (1 - q)
            g0, g1 = r.sum() + la * a, (r * z).sum() + lb * (b - 1)
            h00, h01, h11 = h.sum() + la, (h * z).sum(), (h * z * z).sum() + lb
            det = h00 * h11 - h01 * h01
            a -= (h11 * g0 - h01 * g1) / det
            b = min(max(b - (h00 * g1 - h01 * g0) / det, SLOPE_RANGE[0]), SLOPE_RANGE[1])
        self.offset, self.slope = float(a), float(b)


@dataclass(frozen=True)
class StepLabels:
    """Expected labels of one step's verified nodes: ``label`` in [0, 1] given the parent is accepted,
    ``weight`` the chance the parent is accepted (0: the node says nothing about conditional acceptance)."""

    label: np.ndarray
    weight: np.ndarray


def _depths(parent: np.ndarray) -> np.ndarray:
    depth = np.zeros(len(parent), dtype=np.int64)
    for i, par in enumerate(parent.tolist()):  # parents precede children
        depth[i] = 1 if par < 0 else depth[par] + 1
    return depth


def infer_step_labels(parent: np.ndarray, p: np.ndarray, accepted: int, tried: int) -> StepLabels | None:
    """Expected labels from the step's accepted length and tried count (see the module docstring).

    ``parent``: for each verified node, the index of its parent among them (-1 for the root), parents
    before children; ``p``: the predicted conditional acceptance of each. None when no path of length
    ``accepted`` has ``tried`` tried nodes (the counts do not fit this tree).
    """
    parent = np.asarray(parent, dtype=np.int64)
    n = len(parent)
    q = np.clip(np.asarray(p, dtype=np.float64), _CLIP, 1 - _CLIP)
    depth = _depths(parent)
    n_children = np.bincount(parent + 1, minlength=n + 1)  # index 0: the root
    child_mass = np.bincount(parent + 1, weights=q, minlength=n + 1)
    ends = [-1] if accepted == 0 else np.flatnonzero(depth == accepted).tolist()
    post = np.zeros(n + 1)  # posterior of each end (index 0: the root)
    paths: dict[int, list[int]] = {}
    for end in ends:
        path, node = [], end
        while node >= 0:
            path.append(node)
            node = int(parent[node])
        if int(n_children[0] + sum(n_children[v + 1] for v in path)) != tried:
            continue
        stop = max(1.0 - child_mass[end + 1], _CLIP)
        post[end + 1] = float(np.prod(q[path])) * stop
        paths[end] = path
    total = post.sum()
    if total <= 0:
        return None
    on_path = np.zeros(n)
    for end, path in paths.items():
        on_path[path] += post[end + 1] / total
    weight = np.where(parent < 0, 1.0, on_path[np.maximum(parent, 0)])
    label = np.divide(on_path, weight, out=np.zeros(n), where=weight > 0)
    return StepLabels(np.clip(label, 0.0, 1.0), weight)
