"""Hybrid: a tree policy's drafted tree plus free candidates, what earlier text says comes next.

Each step looks up the longest suffix of the request's text (its prompt and output so far and, with a
``SuffixStore``, earlier requests' outputs of its domain; ``decoder.candidates.lookup``) and values each lookup node by
its shrunk empirical path probability, ``count / (occurrences + prior)``, times what lookup nodes of that
domain and matched length have delivered per unit of such value so far (``LookupCalibration``: a match of one
common word promises less than its counts say). Nodes valued below ``min_value`` stay out. When the kept
lookup nodes promise ``skip_gain`` tokens or more, and more tokens per millisecond of forwards than the
request's drafting steps have delivered (both measured: the first such step is a probe that times one), the step
skips the draft model (no draft forward: the tree is the lookup's alone); otherwise the inner policy
drafts as it would and the lookup nodes join its tree (``decoder.candidates.merge``), best value first while each pays
for the verify it adds at the pair's latency profile (with no profile: all kept nodes). Verification is
unchanged, so the output is the target's.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
import torch

from treewise.decoder import Candidates, Frontier, LevelPlan, RequestInfo, StepOutcome, TreePolicy
from treewise.decoder.candidates.lookup import LookupConfig, LookupSource, LookupTree, SuffixStore, empty_tree
from treewise.decoder.draft import DraftContext, DraftResult
from treewise.decoder.loop.batch import fresh_policy

from .latency import LatencyProfile

_LOOKUP = LookupConfig(max_nodes=16, max_depth=8)


@dataclass
class LookupCalibration:
    """Lookup tokens accepted per unit of lookup value offered, by domain and matched length (1, 2, 3, 4+),
    learned from every step of every request the policy decodes (its copies share one), starting from
    ``rate`` worth ``pseudo`` units of value."""

    rate: float = 0.7
    pseudo: float = 4.0
    learn: bool = True  # False: the prior rate stays (a policy whose trees do not depend on earlier requests)
    _seen: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict, repr=False)

    def scale(self, domain: str, match: int) -> float:
        accepted, offered = self._seen.get((domain, min(match, 4)), (0.0, 0.0))
        return (accepted + self.rate * self.pseudo) / (offered + self.pseudo)

    def add(self, domain: str, match: int, accepted: float, offered: float) -> None:
        if not self.learn:
            return
        key = (domain, min(match, 4))
        a, o = self._seen.get(key, (0.0, 0.0))
        self._seen[key] = (a + accepted, o + offered)


@dataclass
class Hybrid:
    """``inner``'s trees with lookup candidates merged in (a ``decoder.candidates.merge.Proposer``); ``store``: earlier
    requests' outputs, shared by every copy of this policy (None: each request's own text only).

    The store and the calibration learn from earlier requests, so a request's trees depend on what this policy
    decoded before: greedy output is the target's whatever they hold, and sampled output follows the target's
    distribution, but seeded samples repeat only from the same state (``store=None`` and
    ``LookupCalibration(learn=False)`` make every request's trees its own; the skip rule reads measured step
    times, so ``skip_gain=inf`` as well for trees that do not depend on timing)."""

    inner: TreePolicy
    lookup: LookupConfig = _LOOKUP
    store: SuffixStore | None = None
    latency: LatencyProfile | None = None  # prices each lookup node's verify (None: keep every valued node)
    prior: float = 1.0  # pseudo-occurrences that shrink a lookup node's empirical path probability
    min_value: float = 0.15  # lookup nodes valued below this stay out
    skip_gain: float = 2.0  # kept lookup value (expected tokens) at which a step skips the draft model
    calibration: LookupCalibration = field(default_factory=LookupCalibration)  # shared by this policy's copies
    _source: LookupSource | None = field(default=None, init=False, repr=False)
    _domain: str = field(default="unknown", init=False, repr=False)
    _look: LookupTree = field(default_factory=empty_tree, init=False, repr=False)
    _values: np.ndarray = field(default_factory=lambda: np.zeros(0), init=False, repr=False)  # calibrated
    _scale: float = field(default=1.0, init=False, repr=False)  # this step's calibration factor
    _offered: float = field(default=0.0, init=False, repr=False)  # merged lookup nodes' raw value this step
    _skipped: bool = field(default=False, init=False, repr=False)
    _drafted: tuple[float, float] | None = field(default=None, init=False, repr=False)  # drafting steps' (EMA)
    # accepted tokens and forward ms; and the forward ms of lookup-only steps (EMA)
    _skip_ms: float | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.inner = fresh_policy(self.inner)  # per-request state: each copy of this policy owns its inner one

    @property
    def reads_draft_entropy(self) -> bool:
        return bool(getattr(self.inner, "reads_draft_entropy", True))

    # -- TreePolicy ----------------------------------------------------------------------------------

    def start(self, request: RequestInfo) -> None:
        self.inner.start(request)
        self._domain, self._drafted, self._skip_ms = request.domain, None, None
        key = hashlib.blake2b(request.prompt.encode(), digest_size=8).hexdigest()
        self._source = LookupSource(self.lookup, self.store, request.domain, key, request.prompt_len)

    def plan(self, frontier: Frontier) -> LevelPlan:
        if frontier.depth == 0:
            self._skipped = self._skips(float(self._values.sum()))
            if self._skipped:  # the inner policy sits this step out: it neither plans nor observes it
                return LevelPlan.uniform(1, 0)
        return self.inner.plan(frontier)

    def finalize(self, candidates: Candidates) -> torch.Tensor | None:
        return self.inner.finalize(candidates)

    def observe(self, outcome: StepOutcome) -> None:
        if self._offered > 0:  # what the lookup's nodes delivered, those the draft proposed too included
            self.calibration.add(self._domain, self._look.match, outcome.from_lookup, self._offered)
        ms = outcome.forward_ms  # NaN: not measured
        if self._skipped:
            if ms == ms:
                self._skip_ms = ms if self._skip_ms is None else 0.7 * self._skip_ms + 0.3 * ms
            return
        if outcome.verified > outcome.extra:  # the inner policy drafted
            seen = (float(outcome.accepted), ms)
            old = self._drafted
            self._drafted = seen if old is None else (0.7 * old[0] + 0.3 * seen[0], 0.7 * old[1] + 0.3 * seen[1])
        self.inner.observe(outcome)

    def _skips(self, gain: float) -> bool:
        """Whether the lookup's tree alone (``gain`` expected tokens, at least ``skip_gain``) gives more tokens per
        millisecond of forwards than the request's drafting steps have (before any is timed: more tokens)."""
        if gain < self.skip_gain:
            return False
        if self._drafted is None:
            return True
        tokens, ms = self._drafted
        if not ms > 0:  # steps not timed (NaN): tokens alone
            return gain >= tokens
        if self._skip_ms is None:  # a probe: time one lookup step
            return True
        return (1 + gain) / self._skip_ms >= (1 + tokens) / ms

    # -- Proposer ------------------------------------------------------------------------------------

    def propose(self, seq: np.ndarray, ctx: DraftContext) -> None:
        depth = min(self.lookup.max_depth, ctx.max_depth)
        look = self._source.propose(seq, self.lookup.max_nodes, depth) if depth > 0 and self._source else empty_tree()
        self._scale = self.calibration.scale(self._domain, look.match)
        values = self._scale * look.counts / (look.occurrences + self.prior) if look.size else np.zeros(0)
        keep = values >= self.min_value  # a child never outvalues its parent: kept nodes stay connected
        self._look = _subset(look, keep)
        self._values = values[keep]
        self._offered = 0.0

    def proposals(self, drafted: DraftResult) -> LookupTree:
        kept = self._priced(drafted)
        self._offered = float(self._values[kept].sum()) / self._scale if self._scale > 0 else 0.0
        return _subset(self._look, kept)

    def _priced(self, drafted: DraftResult) -> np.ndarray:
        """[n] bool: the lookup nodes that join ``drafted``'s tree."""
        if self.latency is None or self._look.size == 0:
            return np.ones(self._look.size, dtype=bool)
        # Best value first (parents before children): a node joins while its value, in tokens worth a plain
        # step each, pays for the verify time one more node adds to this tree.
        order = np.lexsort((self._look.depth, -self._values))
        n, token_ms = drafted.tree.size, self.latency.target_time(1)
        keep = np.zeros(self._look.size, dtype=bool)
        for k, j in enumerate(order):
            if self._values[j] * token_ms < self.latency.target_time(n + k + 1) - self.latency.target_time(n + k):
                break
            keep[j] = True
        return keep

    def end(self, seq: np.ndarray) -> None:
        if self._source is not None:
            self._source.end(seq)
            self._source = None


def _subset(look: LookupTree, keep: np.ndarray) -> LookupTree:
    """``look``'s nodes where ``keep`` (a kept node's parent is kept), parents renumbered."""
    if keep.all():
        return look
    new = np.cumsum(keep) - 1
    parents = look.parents[keep]
    return LookupTree(look.tokens[keep], np.where(parents >= 0, new[np.maximum(parents, 0)], -1),
                      look.counts[keep], look.depth[keep], look.match, look.occurrences)
