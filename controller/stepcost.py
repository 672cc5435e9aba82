"""MeasuredCosts: what a request's steps actually cost, next to what the latency profile predicts.

The profile prices model forwards only, measured once on one machine. A step also pays work outside the
forwards (drafting bookkeeping, the policy, verification, cache compaction: per row, so it grows with the
batch), and another machine or a busy one changes the forwards' costs unevenly: a host with faster memory
runs a one-token forward far faster while a tree's forward, which computes more, gains less; a busy one
slowed a one-token forward 21x and a tree's 16x (docs/benchmarks.md), each kind by its own factor. Each
step, the decoder reports how long its forwards took (``StepOutcome.forward_ms``) and the policy's clock
gives the whole step (root plan to root plan), so the policy learns, separately for tree steps and plain steps:

- the scale: measured forwards over the profile's (``tree_scale``, ``plain_scale``); their quotient ``ratio``
  says how much dearer a tree step's forwards are, against a plain step's, than the profile thinks;
- the step time outside the forwards (``tree_ms``, ``plain_ms``), in each kind's profile units (divided by
  its scale).

A drafting request measures plain steps only if it takes some: ``plain_due`` asks for one plain step after the
first few measured tree steps and then one every ``plain_every`` while the decision is close (the caller says
whether trees would still pay were a plain step ``doubt`` times cheaper than measured): a plain step taken where
trees pay by far costs a tree step's tokens and cannot change what the rule does. Step times are steady where
tokens per step are not (1-7 between neighbouring steps), so these averages settle in a few steps (a rule that
judged drafting from tokens per step cost more than it saved: docs/performance.md). Estimates from n steps
count n / (n + ``prior``) against the profile's own view (scale 1, no overhead). A step that carries a prefill (a
request's first) is not measured; the first tree step after plain steps is, its draft catch-up (the plain steps'
tokens fed in its root's draft forward) in its predicted forwards, and a probe after a run of plain steps weighs
``probe_weight``: the tree steps measured before the run are stale, and only a probe can show that drafting pays
again. What was learned carries over to the next request (the machine is the same) with the weight of ``carry``
step: the ratio waits for the request's own first measured tree step.
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
class _Kind:
    """Averages of one kind of step (tree or plain)."""

    scale: _Avg = field(default_factory=_Avg)  # measured forwards over predicted ones
    outside: _Avg = field(default_factory=_Avg)  # ms outside the forwards, as measured


@dataclass
class MeasuredCosts:
    weight: float = 0.2  # of the newest step in each moving average
    prior: float = 2.0  # steps' worth of trust in the profile's own view
    first_plain: int = 2  # measured tree steps before the first plain step a drafting request is asked for
    plain_every: int = 32  # then measured tree steps between plain steps, while the decision is close
    doubt: float = 1.5  # how much cheaper than measured a plain step may be before a far decision counts as close
    probe_weight: float = 0.6  # of a tree step after a run of plain steps (a probe): the averages are stale then
    carry: int = 1  # steps' worth of trust a new request gives what earlier requests measured
    clock: Callable[[], float] = time.perf_counter
    _tree: _Kind = field(default_factory=_Kind, init=False, repr=False)
    _plain: _Kind = field(default_factory=_Kind, init=False, repr=False)
    _since_plain: int = field(default=0, init=False, repr=False)  # measured tree steps since a plain one
    _t0: float | None = field(default=None, init=False, repr=False)
    _open: tuple[float, float, bool, bool] | None = field(default=None, init=False, repr=False)  # step to close

    def start(self) -> None:
        """A new request: its first step carries a prefill. What the machine's steps cost is kept, but trusted
        as ``carry`` steps at most: a request that stopped drafting measures tree steps only by its probes, so each
        new request weighs the profile back in and re-measures."""
        for kind in (self._tree, self._plain):
            kind.scale.n, kind.outside.n = min(kind.scale.n, self.carry), min(kind.outside.n, self.carry)
        self._t0 = self._open = None

    def forget(self) -> None:
        """Back to the profile's own view: nothing measured."""
        self._tree, self._plain, self._since_plain = _Kind(), _Kind(), 0
        self.start()

    def begin(self) -> None:
        """At a step's root: the previous step ends here; fold it in if it was measurable."""
        now = self.clock()
        if self._t0 is not None and self._open is not None:
            predicted, forward, drafted, probe = self._open
            kind = self._tree if drafted else self._plain
            w = self.probe_weight if probe else self.weight
            kind.scale.add(forward / predicted, w)
            kind.outside.add(max(1000 * (now - self._t0) - forward, 0.0), w)
            self._since_plain = self._since_plain + 1 if drafted else 0
        self._t0, self._open = now, None

    def end(self, predicted_ms: float, forward_ms: float, drafted: bool, measurable: bool,
            probe: bool = False) -> None:
        """After verification: the step's forwards as predicted by the profile and as measured; ``probe``: a
        tree step after a run of plain steps, whose measure outweighs what tree steps measured before the run."""
        if measurable and predicted_ms > 0 and math.isfinite(forward_ms) and forward_ms > 0:
            self._open = (predicted_ms, forward_ms, drafted, probe)

    def _scale(self, kind: _Kind) -> float:
        return max(kind.scale.shrunk(self.prior, 1.0), 1e-3)

    @property
    def tree_scale(self) -> float:
        return self._scale(self._tree)

    @property
    def plain_scale(self) -> float:
        return self._scale(self._plain)

    @property
    def ratio(self) -> float:
        """A tree step's forwards against a plain step's, measured over predicted: 1 until two tree steps and
        a plain step are measured, then their moving averages' quotient as it stands. Forward times are
        steady, and shrinking both toward the profile would hide the ratio for most of a request, which
        measures a plain step only now and then."""
        if self._tree.scale.n < 2 or self._plain.scale.n < 1:
            return 1.0
        return max(self._tree.scale.value, 1e-3) / max(self._plain.scale.value, 1e-3)

    @property
    def tree_ms(self) -> float:
        """Time a tree step spends outside its forwards, in the profile's milliseconds of tree steps."""
        return self._tree.outside.shrunk(self.prior, 0.0) / self.tree_scale

    @property
    def plain_ms(self) -> float:
        """Time a plain step spends outside its forward, in the profile's milliseconds of plain steps."""
        return self._plain.outside.shrunk(self.prior, 0.0) / self.plain_scale

    def plain_due(self, close: bool = True) -> bool:
        """Whether a drafting request should take a plain step now to measure what one costs: the first after
        ``first_plain`` measured tree steps, later ones only where the decision is ``close``."""
        if self._plain.scale.n == 0:
            return self._since_plain >= self.first_plain
        return close and self._since_plain >= self.plain_every
