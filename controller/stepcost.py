"""MeasuredCosts: what a request's steps actually cost, next to what the latency profile predicts.

The profile prices model forwards only, measured on a quiet machine. A step also pays work outside the
forwards (drafting bookkeeping, the policy, verification, cache compaction: per row, so it grows with the
batch), and a busy machine slows both, small kernels most. Each step, the decoder reports how long its
forwards took (``StepOutcome.forward_ms``) and the policy's clock gives the whole step (root plan to root
plan), so a request learns two things:

- ``scale``: measured forwards over predicted ones (a slower or busier machine);
- the step time outside the forwards, for tree steps and for plain steps, in the profile's units
  (``tree_ms`` and ``plain_ms``: the measured overhead divided by ``scale``).

Step times are steady where tokens per step are not (1-7 between neighbouring steps), so these averages
settle in a few steps; ``PayoffGuard`` judged drafting from tokens per step and cost more than it saved
(docs/performance.md). Estimates from n steps count n / (n + ``prior``) against the profile's own view
(scale 1, no overhead). A step that carries a prefill (a request's first) or a draft catch-up (the first tree
step after plain steps) is not measured.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Avg:
    value: float = 0.0
    n: int = 0

    def add(self, x: float, weight: float) -> None:
        self.value = x if self.n == 0 else (1 - weight) * self.value + weight * x
        self.n += 1

    def shrunk(self, prior: float, toward: float) -> float:
        return toward + self.n / (self.n + prior) * (self.value - toward) if self.n else toward


@dataclass
class MeasuredCosts:
    weight: float = 0.2  # of the newest step in each moving average
    prior: float = 2.0  # steps' worth of trust in the profile's own view
    clock: Callable[[], float] = time.perf_counter
    _scale: _Avg = field(default_factory=_Avg, init=False, repr=False)
    _tree: _Avg = field(default_factory=_Avg, init=False, repr=False)
    _plain: _Avg = field(default_factory=_Avg, init=False, repr=False)
    _t0: float | None = field(default=None, init=False, repr=False)
    _open: tuple[float, float, bool] | None = field(default=None, init=False, repr=False)  # the step to close

    def start(self) -> None:
        """A new request: nothing measured."""
        self._scale, self._tree, self._plain = _Avg(), _Avg(), _Avg()
        self._t0 = self._open = None

    def begin(self) -> None:
        """At a step's root: the previous step ends here; fold it in if it was measurable."""
        now = self.clock()
        if self._t0 is not None and self._open is not None:
            predicted, forward, drafted = self._open
            step = 1000 * (now - self._t0)
            self._scale.add(forward / predicted, self.weight)
            (self._tree if drafted else self._plain).add(max(step - forward, 0.0), self.weight)
        self._t0, self._open = now, None

    def end(self, predicted_ms: float, forward_ms: float, drafted: bool, measurable: bool) -> None:
        """After verification: the step's forwards as predicted by the profile and as measured."""
        if measurable and predicted_ms > 0 and math.isfinite(forward_ms) and forward_ms > 0:
            self._open = (predicted_ms, forward_ms, drafted)

    @property
    def scale(self) -> float:
        return max(self._scale.shrunk(self.prior, 1.0), 1e-3)

    @property
    def tree_ms(self) -> float:
        """Time a tree step spends outside its forwards, in profile milliseconds."""
        return self._tree.shrunk(self.prior, 0.0) / self.scale

    @property
    def plain_ms(self) -> float:
        """Time a plain step spends outside its forward, in profile milliseconds."""
        return self._plain.shrunk(self.prior, 0.0) / self.scale
