"""PayoffGuard: stop drafting in a request where drafting does not pay, measured on that request.

A tree step pays when its tokens per millisecond beat a plain target step's one token per plain-step
time. The guard times whole steps (from one step's root plan to the next's), keeps moving averages of
tree steps' time and tokens and of plain steps' time (starting from the latency profile's one-token
target forward until plain steps of the request are measured), and answers at each step's root whether
the policy may draft. After ``warmup`` measured tree steps, a request whose tree rate falls under the
plain rate decodes plain steps, with a tree step every ``probe_every`` plain steps to notice a change.

A request's first step is never measured: it carries the prompt's prefill for both models. Nor is the first
tree step after plain steps: it also feeds the draft every token the plain steps committed (catch-up), a
cost that steady drafting does not pay. So a probe drafts two steps and measures the second.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class _Avg:
    """Exponential moving average; ``n`` counts the samples folded in."""

    value: float = 0.0
    n: int = 0

    def add(self, x: float, weight: float) -> None:
        self.value = x if self.n == 0 else (1 - weight) * self.value + weight * x
        self.n += 1


@dataclass
class PayoffGuard:
    plain_ms: float  # prior time of one plain step (e.g. LatencyProfile.target_time(1))
    margin: float = 1.0  # drafting must reach margin x the plain rate
    warmup: int = 4  # measured tree steps before judging
    probe_every: int = 8  # plain steps between probes once drafting stopped
    weight: float = 0.1  # of the newest step: tokens per step vary a lot, so average over ~10 steps
    clock: Callable[[], float] = time.perf_counter
    _tree_ms: _Avg = field(default_factory=_Avg, init=False, repr=False)
    _tree_tokens: _Avg = field(default_factory=_Avg, init=False, repr=False)
    _plain_ms: _Avg = field(default_factory=_Avg, init=False, repr=False)
    _t0: float | None = field(default=None, init=False, repr=False)  # when the open step began
    _drafted: bool = field(default=False, init=False, repr=False)  # whether the open step drafted
    _caught_up: bool = field(default=False, init=False, repr=False)  # ... and the step before it too
    _tokens: int = field(default=0, init=False, repr=False)
    _steps: int = field(default=0, init=False, repr=False)
    _plain_run: int = field(default=0, init=False, repr=False)  # plain steps since the last tree step

    def start(self) -> None:
        """A new request: nothing measured yet."""
        self._tree_ms, self._tree_tokens, self._plain_ms = _Avg(), _Avg(), _Avg()
        self._t0, self._steps, self._plain_run = None, 0, 0
        self._drafted = self._caught_up = False

    @property
    def pays(self) -> bool:
        """Whether drafting beats plain steps on what this request has measured (True until it has)."""
        if self._tree_ms.n < self.warmup:
            return True
        plain = self._plain_ms.value if self._plain_ms.n else self.plain_ms
        return self._tree_tokens.value / max(self._tree_ms.value, 1e-9) >= self.margin / max(plain, 1e-9)

    def allow(self) -> bool:
        """At a step's root: close the previous step's timing; may this step draft?"""
        now = self.clock()
        if self._t0 is not None and self._steps > 1:  # step 0 (prefill) is not measured
            ms = 1000 * (now - self._t0)
            if self._drafted and self._caught_up:
                self._tree_ms.add(ms, self.weight)
                self._tree_tokens.add(self._tokens, self.weight)
            elif not self._drafted:
                self._plain_ms.add(ms, self.weight)
        self._t0 = now
        self._steps += 1
        probe_again = self._drafted and not self._caught_up and self._steps > 2  # a probe's measured step
        return self.pays or self._plain_run >= self.probe_every or probe_again

    def observe(self, verified: int, accepted: int) -> None:
        """After the step: what it was (a tree when anything was verified) and the tokens it emitted."""
        drafted = verified > 0
        self._caught_up = drafted and (self._drafted or self._steps <= 1)  # step 0 drafts from a fresh cache
        self._drafted, self._tokens = drafted, accepted + 1
        self._plain_run = 0 if self._drafted else self._plain_run + 1
