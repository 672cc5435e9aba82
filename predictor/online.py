"""Online calibration per request: a Platt-style correction of the predictor, updated after every step.

The corrected probability is ``sigmoid(offset + slope * logit(p))`` where ``p`` is the global predictor's
output. The correction starts at a Gaussian prior centred on the identity (offset 0, slope 1):
``prior_offset`` and ``prior_slope`` are the prior's precisions, in the units of the log-likelihood's
curvature (one row at p = 0.5 adds 0.25 to the offset's curvature). After each verified step it takes in
the step's (p, label) pairs by a Bayesian filtering update (``OnlineCalibrator``), so a request moves
away from the global model only as far as its own evidence outweighs the prior; a calibrated predictor's
evidence averages out and the correction stays near the identity.

Labels: every tried node (verified, its parent accepted) is labelled by whether the target accepted it.
LearnedTree reads them off the step's accepted path (``decoder.StepOutcome.path``), and replaying logs
reads them from the node log (``replay_online(labels="exact")``). A policy that only keeps the step's
counts, the accepted length and how many verified nodes had an accepted parent, can turn them into
expected labels with ``infer_step_labels``: the accepted path ends at a node of depth ``accepted`` (the
root when 0), each such path is weighted by the (corrected) predictions along it and by the chance that
none of its end's children was accepted, and paths whose tried count differs from the observed one get
no weight. Siblings are mutually exclusive (the target has one argmax per parent), so a node's expected
label is the posterior chance that it is on the path, given that its parent is; the row's weight is the
posterior chance that its parent is on the path."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

_CLIP = 1e-4
_SMALL = 32  # up to this many values, float arithmetic beats numpy's per-call cost
SLOPE_RANGE = (0.1, 10.0)  # a slope at or below 0 would invert the predictor's ranking


class OnlineConfig(BaseModel):
    """Hyper-parameters of the per-request correction (defaults chosen in docs/predictor.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prior_offset: float = Field(8.0, gt=0)  # precision of the prior on the offset
    prior_slope: float = Field(8.0, gt=0)  # precision of the prior on the slope
    iterations: int = Field(2, ge=1)  # Newton steps per update (from the posterior so far)
    slope_floor: float = Field(SLOPE_RANGE[0], ge=SLOPE_RANGE[0], le=1.0)  # the smallest slope it may take
    # Apply the correction only once the request's evidence against the identity reaches this (``evidence``,
    # chi^2 with 2 degrees of freedom: 6 is its 95 % point); 0 applies it from the first update.
    gate: float = Field(6.0, ge=0)


def logit(p: np.ndarray) -> np.ndarray:
    q = np.clip(np.asarray(p, dtype=np.float64), _CLIP, 1 - _CLIP)
    return np.log(q / (1 - q))


@dataclass
class OnlineCalibrator:
    """One request's correction; ``reset`` at the start of each request, ``update`` after each step.

    Fitted as a Bayesian logistic regression filtered step by step (assumed-density filtering): the
    posterior over (offset, slope) is kept as a Gaussian, its mean and its 2 x 2 precision; each update
    takes ``iterations`` Newton steps on the new rows' log-likelihood under that Gaussian, then adds the
    new rows' curvature to the precision. The first update starts from the prior, so a request's
    evidence accumulates exactly as in a refit over its whole history up to the Gaussian approximation of
    the earlier steps, but an update costs only its own few rows: plain float arithmetic, no vector ops,
    cheap enough to run every step (its measured cost: docs/performance.md).
    """

    config: OnlineConfig = field(default_factory=OnlineConfig)
    offset: float = 0.0
    slope: float = 1.0
    _precision: tuple[float, float, float] = (0.0, 0.0, 0.0)  # (aa, ab, bb); set by reset
    _rows: int = field(default=0, repr=False)

    def __post_init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.offset, self.slope, self._rows = 0.0, 1.0, 0
        self._precision = (self.config.prior_offset, 0.0, self.config.prior_slope)

    @property
    def rows(self) -> int:
        """Rows of evidence taken in (weights summed are at most this)."""
        return self._rows

    @property
    def evidence(self) -> float:
        """How far the correction sits from the identity in its own posterior's units: the squared Mahalanobis
        distance of (offset, slope - 1) under the posterior precision (chi^2 with 2 degrees of freedom)."""
        d0, d1 = self.offset, self.slope - 1.0
        p00, p01, p11 = self._precision
        return p00 * d0 * d0 + 2.0 * p01 * d0 * d1 + p11 * d1 * d1

    @property
    def active(self) -> bool:
        """Whether ``__call__`` corrects: the parameters have moved and their evidence has reached ``gate``."""
        return not (self.offset == 0.0 and self.slope == 1.0) and (
            self.config.gate <= 0.0 or self.evidence >= self.config.gate)

    def __call__(self, p: np.ndarray) -> np.ndarray:
        """Corrected probabilities (the identity until the first update moves the parameters, and while the
        evidence against the identity stays under ``gate``)."""
        if not self.active:
            return np.asarray(p, dtype=np.float64)
        # sigmoid(a + b * logit(q)) = 1 / (1 + e^-a * ((1 - q) / q)^b); a frontier's few values in floats
        scale, b, lo, hi = math.exp(-self.offset), self.slope, _CLIP, 1 - _CLIP
        if len(p) <= _SMALL:
            return np.asarray([1.0 / (1.0 + scale * ((1.0 - q) / q) ** b)
                               for q in (min(max(v, lo), hi) for v in _floats(p))], dtype=np.float64)
        q = np.clip(p, lo, hi)
        return 1.0 / (1.0 + scale * ((1.0 - q) / q) ** b)

    def update(self, p: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray,
               weights: Sequence[float] | np.ndarray | None = None) -> None:
        """Take in one step's rows (global predictions, labels in [0, 1], optional weights); plain lists are
        taken as they are (a step's handful of rows costs less in floats than in vector operations)."""
        if len(p) == 0:
            return
        y = _floats(labels)
        w = [1.0] * len(y) if weights is None else _floats(weights)
        if not len(p) == len(y) == len(w):
            raise ValueError(f"update: {len(p)} predictions, {len(y)} labels and {len(w)} weights; "
                             "give one of each per row")
        self.absorb(newton(_floats(p), y, w, self.offset, self.slope, *self._precision, self.config.iterations,
                           self.config.slope_floor), len(y))

    @property
    def posterior(self) -> Posterior:
        """The correction's posterior: mean (offset, slope) and precision (aa, ab, bb), as ``newton`` takes it."""
        return Posterior(self.offset, self.slope, *self._precision)

    def absorb(self, posterior: Posterior, rows: int) -> None:
        """Take the posterior ``newton`` computed over ``rows`` new rows."""
        self.offset, self.slope = float(posterior.offset), float(posterior.slope)
        self._precision = (float(posterior.p00), float(posterior.p01), float(posterior.p11))
        self._rows += rows


class Posterior(NamedTuple):
    """The online correction's posterior: mean (offset, slope) and precision matrix [[p00, p01], [p01, p11]]; a
    NamedTuple so numba builds and returns it inside the level kernel too."""

    offset: float
    slope: float
    p00: float
    p01: float
    p11: float


def newton(p: Sequence[float], y: Sequence[float], w: Sequence[float], m0: float, m1: float, p00: float,
           p01: float, p11: float, iterations: int, floor: float) -> Posterior:
    """One filtering update: ``iterations`` Newton steps from the prior mean (m0, m1) with precision (p00, p01,
    p11) on rows of global predictions ``p``, labels ``y`` and weights ``w``; the posterior mean and precision.

    Scalar loops only, so one source serves plain floats (``OnlineCalibrator.update``) and numba over arrays
    (``controller.level``, a step's update in one native call)."""
    lo, hi = _CLIP, 1 - _CLIP
    z = [0.0] * len(p)  # each row's logit, once for every iteration (plain floats in the Python path)
    for i in range(len(p)):
        q = min(max(p[i], lo), hi)
        z[i] = math.log(q / (1.0 - q))
    a, b = m0, m1
    h00, h01, h11 = p00, p01, p11
    for _ in range(iterations):
        g0, g1 = p00 * (a - m0) + p01 * (b - m1), p01 * (a - m0) + p11 * (b - m1)
        h00, h01, h11 = p00, p01, p11
        for i in range(len(p)):
            zi, wi = z[i], w[i]
            t = a + b * zi
            qi = 1.0 / (1.0 + math.exp(-t)) if t > -50.0 else 0.0
            r, h = wi * (qi - y[i]), wi * qi * (1.0 - qi)
            g0, g1 = g0 + r, g1 + r * zi
            h00, h01, h11 = h00 + h, h01 + h * zi, h11 + h * zi * zi
        det = h00 * h11 - h01 * h01
        a -= (h11 * g0 - h01 * g1) / det
        b = min(max(b - (h00 * g1 - h01 * g0) / det, floor), SLOPE_RANGE[1])
    return Posterior(a, b, h00, h01, h11)


def _floats(values: Sequence[float] | np.ndarray) -> list[float]:
    return np.asarray(values, dtype=np.float64).tolist() if isinstance(values, np.ndarray) else [
        float(v) for v in values]


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
