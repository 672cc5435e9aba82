"""LearnedTree: best-first tree growth valued by a learned acceptance predictor, within a domain budget.

A candidate's value is the predicted probability that its whole path is accepted: the product of the
predicted conditional acceptances along it. Each level keeps candidates best value first while the value
clears the budget's threshold and, given the latency profile, pays for its verify cost; kept nodes draft
``max_width`` children and the next level keeps however many of them earn their place, so a node whose
children's predictions are spread keeps more of them (widening) and a peaked one keeps one. A level is
drafted only when its expected gain covers one more draft forward; at the root, when the predicted
value of the best root child (a running mean over recent steps) is too low to pay for drafting, the step is
a plain target step (with a probe after ``probe_every`` plain steps, backing off while probes do not pay).

The costs are the goodput of the step, solo or batched: in a batch of B rows (``Frontier.batch``), every node
is priced by the batched forward of B rows (``LatencyProfile.for_batch``, the grid ``treewise latency``
measures), so trees shrink, or drafting stops, as the batch makes verification dear (``batch_aware``). The
step time outside the forwards and the forwards' speed, per kind of step, are measured (``controller.stepcost``,
``measured``): the overhead counts in every node's share of the step, and the root's rule weighs a tree
step, forwards and overhead as measured, against a plain step's, so a machine on which tree steps cost more
than the profile says (a busy one, or one with faster memory than the profile's) stops drafting by itself;
a drafting request takes an occasional plain step to measure one.

Online calibration (``online``, on by default): the predictor's outputs pass through a per-request
Platt-style correction (``predictor.online``) updated after every step with what the step revealed: each
tried node (its parent accepted) labelled by whether it is on the accepted path (``StepOutcome.path``), the
labels of ``replay_online(labels="exact")``, shrunk toward the global model; the corrected probabilities
value the next step's tree once the request's evidence against the global model reaches the correction's
gate (``OnlineConfig.gate``; until then the global predictions value it). ``online=None`` uses the global
predictor as it is.

Each level runs ``controller.level``: features, predictions, calibration, keep and expand written once, one
native call where numba imports and the predictor's forest is available as arrays, plain Python otherwise
(same plans). The request's arrays live in a ``LevelState`` made in ``start``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from treewise.decoder import Candidates, Frontier, LevelPlan, RequestInfo, StepOutcome
from treewise.decoder.paths import data_dir
from treewise.predictor.derived import RequestFeatures
from treewise.predictor.forest import ForestArrays
from treewise.predictor.online import OnlineCalibrator, OnlineConfig, Posterior

from .budgets import BudgetsFile, DomainBudget, load_budgets
from .features import FeatureLayout, dict_scorer, raw_step_scalars
from .latency import LatencyProfile
from .level import DEFAULT_TYPES, DRAFT_MS, GAIN, Kernels, LevelState, kernels, python_kernels, tried_rows
from .pairs import pair_files
from .stepcost import MeasuredCosts

PRIOR_ACCEPTANCE = 0.5  # assumed before a request has verified anything


@dataclass(frozen=True)
class PairData:
    """A model pair's shipped budgets, latency profile (when measured) and domain classifier, and where its
    predictor lives (loaded only by the policies that call it)."""

    budgets: BudgetsFile
    latency: LatencyProfile | None
    classifier: DomainResolver | None
    predictor: Path

    @classmethod
    def load(cls, pair: str | None = None, latency: LatencyProfile | None = None) -> PairData:
        from .domains import DomainClassifier

        files = pair_files(pair)
        if latency is None and files.latency.exists():
            latency = LatencyProfile.read(files.latency)
        budgets = load_budgets(files.budgets) if files.budgets.exists() else BudgetsFile(default=DomainBudget())
        classifier = DomainClassifier.default() if (data_dir() / "domain_classifier.npz").exists() else None
        return cls(budgets, latency, classifier, Path(files.predictor))


@runtime_checkable
class AcceptanceModel(Protocol):
    """What LearnedTree needs of a predictor: one frontier's features in, acceptance probabilities out."""

    @property
    def feature_names(self) -> list[str]: ...

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray: ...


class DomainResolver(Protocol):
    def resolve(self, domain: str, text: str) -> str: ...


def _child_estimate(frontier: Frontier) -> float:
    """The chance a kept node's best child is accepted, for the expand rule: the request's running rate."""
    rate = frontier.running_accept_rate
    return PRIOR_ACCEPTANCE if rate != rate else max(rate, 1e-3)


@dataclass(frozen=True)
class TriedNodes:
    """One step's tried nodes (verified, their parent accepted): the global prediction of each and whether
    the target accepted it."""

    raw: list[float]
    accepted: list[float]  # 1.0 on the accepted path, else 0.0


def tried_nodes(levels: list[tuple[np.ndarray, np.ndarray, np.ndarray]], outcome: StepOutcome) -> TriedNodes | None:
    """The step's tried nodes from ``outcome.path``. ``levels``: per drafted level, the candidates' raw
    predictions, parents (candidate index in the step, -1 for the root) and keep mask. None when the
    decoder verified another tree than the one kept (a cut): nothing to learn from it."""
    raw, parent, keep = (np.concatenate([lv[k] for lv in levels]) if levels else np.zeros(0) for k in range(3))
    p, y = np.zeros(len(raw)), np.zeros(len(raw))
    n = tried_rows(raw, keep, parent.astype(np.int64), len(raw), outcome.verified,
                   np.asarray(outcome.path, dtype=np.int64), p, y)
    return TriedNodes(p[:n].tolist(), y[:n].tolist()) if n >= 0 else None


@dataclass(frozen=True)
class Costs:
    """The cost model one row sees at one batch size, at every tree size this request can ask for (looked up
    dozens of times a step): whole-step ms of the target's verify and of one draft level by node count."""

    batch: int
    target: list[float]
    draft: list[float]
    root_draft_ms: float  # the root's draft forward
    cost_scale: float

    def tree_pays(self, gain: float, tree_ms: float, plain_ms: float = 0.0, ratio: float = 1.0) -> bool:
        """Whether a tree step expected to deliver ``gain`` tokens (1 + its kept nodes' path values) in
        ``tree_ms`` (its draft forwards, its verify and the measured time outside them, in the profile's ms)
        beats a plain step (``plain_ms``: its measured time outside the forward) in tokens per millisecond:
        the extra tokens against ``cost_scale`` times the extra time in plain steps. ``ratio``: a tree step's
        forwards against a plain step's, measured over predicted (stepcost). No profile: always."""
        if not self.target:
            return True
        return gain - 1.0 >= self.cost_scale * (tree_ms * ratio / (self.target[1] + plain_ms) - 1.0)


def _costs(latency: LatencyProfile | None, budget: DomainBudget, batch: int) -> Costs:
    """``latency`` seen by one row of ``batch`` (``LatencyProfile.for_batch``): every row of a batch feeding n
    nodes costs the batched forward of n, so a node is worth adding when its value beats the batch's relative
    marginal cost (goodput: the batch's expected tokens per second of its step), which grows with the batch."""
    if latency is None:  # no cost rule: only thresholds and budgets
        return Costs(batch, [], [], 0.0, budget.cost_scale)
    lat = latency.for_batch(batch)
    sizes = range(budget.node_budget + budget.max_width + 2)
    target, draft = [lat.target_time(n) for n in sizes], [lat.draft_time(n) for n in sizes]
    return Costs(batch, target, draft, draft[1], budget.cost_scale)


@dataclass(eq=False)
class Request:
    """What LearnedTree keeps for the request in flight, made by ``start``."""

    domain: str
    budget: DomainBudget
    state: LevelState  # the level's arrays
    kernels: Kernels  # the level and the step update, compiled or plain Python
    args: tuple  # ``state.args()``, refreshed when the state grows
    roots: tuple[LevelPlan, LevelPlan]  # the root's answers: a plain step, or max_width children
    costs: Costs  # the cost model at the step's batch size
    context: RequestFeatures
    count: int = 0  # candidates of this step so far
    drafted: bool = False  # whether this step's root drafted
    overhead_ms: float = 0.0  # the measured time outside forwards this step's tree was priced with
    root_value: float | None = None  # running mean of the best root child's value
    tree_gain: float | None = None  # running means over the request's drafted steps: planned expected tokens ...
    tree_ms: float = 0.0  # ... and planned forwards' ms (draft levels and verify, the profile's units)
    plain_run: int = 0  # plain steps since this request last drafted
    catch_up: int = 0  # this step's root draft forward also feeds the tokens of this many plain steps
    probe_gap: int = 8  # plain steps before the next probe: doubles after each probe the rule does not follow


@dataclass
class LearnedTree:
    predictor: AcceptanceModel
    budgets: BudgetsFile = field(default_factory=lambda: BudgetsFile(default=DomainBudget()))
    latency: LatencyProfile | None = None  # None: no cost rule, only thresholds and budgets
    classifier: DomainResolver | None = None  # resolves domain="auto"
    probe_every: int = 8  # a request that stopped drafting still drafts after N plain steps to notice a change,
    probe_max: int = 64  # ... then after twice as many while its probes do not pay, up to this many
    online: OnlineConfig | None = field(default_factory=OnlineConfig)  # None: no per-request correction
    batch_aware: bool = True  # in a batch, size trees by the batch's cost model (False: as if decoding alone)
    tree_weight: float = 0.25  # of a drafted step's planned tree in the running means the root's rule reads
    measured: bool = True  # correct the cost model by the step times the request gets (controller.stepcost)
    native: bool = True  # each level as one compiled call where numba and the predictor's forest arrays allow
    _calibrator: OnlineCalibrator = field(default_factory=OnlineCalibrator, init=False, repr=False)
    _request: Request | None = field(default=None, init=False, repr=False)
    _steps: MeasuredCosts = field(default_factory=MeasuredCosts, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.online is not None:
            self._calibrator = OnlineCalibrator(self.online)

    @classmethod
    def default(cls, latency: LatencyProfile | None = None, online: bool = True,
                pair: str | None = None) -> LearnedTree:
        """The shipped predictor, budgets and latency profile of the model ``pair`` (None: ``$TREEWISE_PAIR``,
        else the real pair; ``controller.pairs.pair_files`` says which files a pair borrows) and the domain
        classifier."""
        from treewise.predictor import AcceptancePredictor

        shipped = PairData.load(pair, latency)
        predictor = AcceptancePredictor.load(Path(shipped.predictor))
        profile = shipped.latency
        return cls(predictor, shipped.budgets, profile, shipped.classifier, online=OnlineConfig() if online else None)

    @property
    def domain(self) -> str:
        return self._request.domain if self._request is not None else "unknown"

    @property
    def budget(self) -> DomainBudget:
        return self._request.budget if self._request is not None else self.budgets.default

    @property
    def native_level(self) -> bool:
        """Whether the last started request runs each level as one native call: then the predictor is called
        from native code, inside the policy's time, never through its own entry point."""
        return self._request is not None and self._request.kernels.native

    # -- protocol ----------------------------------------------------------------------------------

    def start(self, request: RequestInfo) -> None:
        domain = request.domain
        if domain == "auto" and self.classifier is not None:
            domain = self.classifier.resolve(domain, request.prompt)
        budget = self.budgets.for_domain(domain)
        # A domain tuned to another family (static, confidence) says nothing about learned sizes: use the default.
        budget = budget if budget.policy == "learned" else self.budgets.default
        layout = FeatureLayout.of(self.predictor, domain)
        costs = _costs(self.latency, budget, 1)
        forest = getattr(self.predictor, "forest", None)
        compiled = kernels() if self.native and layout.coded and isinstance(forest, ForestArrays) else None
        target, draft = (costs.target, costs.draft) if self.latency is not None else ([], [])
        if compiled is not None:
            state = LevelState.build(layout, budget, target, draft, forest.arrays, self.predictor.isotonic)  # type: ignore[union-attr, attr-defined]
        else:  # the predictor's own entry point returns calibrated probabilities: no isotonic map here
            state = LevelState.build(layout, budget, target, draft, None, (np.zeros(0), np.zeros(0)))
        k = compiled or python_kernels(dict_scorer(self.predictor, layout))
        self._request = Request(domain, budget, state, k, state.args(),
                                (LevelPlan.uniform(1, 0), LevelPlan.uniform(1, budget.max_width)), costs,
                                RequestFeatures(), probe_gap=self.probe_every)
        self._request.context.start()
        self._calibrator.reset()
        self._steps.start()

    def plan(self, frontier: Frontier) -> LevelPlan:
        r = self._request
        if frontier.depth == 0:
            return self._plan_root(frontier)
        cols = frontier.columns
        at = r.count
        end = r.count = at + len(cols["parent"])
        state = r.state
        if end > state.capacity:  # a step of more candidates: earlier answers keep the old arrays
            state.grow(at, 2 * end)
            r.args = state.args()
        table = frontier.token_type_table
        best = r.kernels.level(*r.args, end - at, at, frontier.depth, _child_estimate(frontier),
                               DEFAULT_TYPES if table is None else table, cols["tokens"], cols["sibling_rank"],
                               cols["draft_logprob"], cols["draft_entropy"], cols["draft_margin"],
                               cols["path_logprob"], cols["parent_draft_prob"], cols["parent"])
        if frontier.depth == 1:  # the root rule's estimate before the request has planned a tree at this batch
            r.root_value = best if r.root_value is None else 0.5 * (r.root_value + best)
        return LevelPlan.of_arrays(state.keep[at:end], state.children[at:end])

    def finalize(self, candidates: Candidates) -> torch.Tensor | None:
        return None

    def observe(self, outcome: StepOutcome) -> None:
        r = self._request
        r.context.observe(outcome.accepted, outcome.tried)
        if r.drafted and r.costs.target:  # what the planned tree was worth, for the next root decision
            w = self.tree_weight if r.tree_gain is not None else 1.0
            r.tree_gain = (1 - w) * (r.tree_gain or 0.0) + w * r.state.scalars[GAIN]
            r.tree_ms = (1 - w) * r.tree_ms + w * self._forwards_ms(outcome, catch_up=False)
        if self.measured and r.costs.target:
            drafted = r.drafted
            self._steps.end(self._forwards_ms(outcome, catch_up=True), outcome.forward_ms, drafted, outcome.step > 0,
                            probe=drafted and r.catch_up >= 2)
        if self.online is not None and outcome.verified > outcome.extra:
            # The step's tried nodes, labelled by the accepted path, update the request's correction.
            state, cal = r.state, self._calibrator
            state.cal[:] = (*cal.posterior, cal.config.iterations, cal.config.slope_floor)
            # Nodes merged in from other sources come after the draft's own: the draft's tried nodes are the
            # accepted path's prefix inside its own tree.
            own = outcome.verified - outcome.extra
            path = [t for t in outcome.path if t <= own]
            n = r.kernels.observe(state.raw, state.keep, state.parent, state.cal, r.count, own,
                                  np.asarray(path, dtype=np.int64))
            if n > 0:
                cal.absorb(Posterior(*state.cal[:5].tolist()), n)

    def _forwards_ms(self, outcome: StepOutcome, catch_up: bool) -> float:
        """The forwards the profile predicts for this step's shape: its draft levels and the verified tree;
        ``catch_up``: with the tokens of the plain steps before it in its root's draft forward."""
        r = self._request
        target = r.costs.target
        ms = target[min(outcome.verified + 1, len(target) - 1)]
        if r.drafted:
            ms += r.state.scalars[DRAFT_MS] - r.overhead_ms
            if catch_up and r.catch_up and self.latency is not None:
                ms += self.latency.for_batch(r.costs.batch).draft_time(r.catch_up + 1) - r.costs.root_draft_ms
        return ms

    def _plan_root(self, frontier: Frontier) -> LevelPlan:
        r = self._request
        r.count = 0
        r.context.begin_step()
        if self.batch_aware and frontier.batch != r.costs.batch and self.latency is not None:
            self._rebatch(frontier.batch)
        tree_ms = plain_ms = 0.0
        ratio, solo = 1.0, frontier.batch == 1  # a batch's step is one kind for all rows: rows measure no ratio
        if self.measured:
            self._steps.begin()
            tree_ms, plain_ms = self._steps.tree_ms, self._steps.plain_ms
            ratio = self._steps.ratio if solo else 1.0
        # The request's recent trees as planned, their overhead as it is measured now, against a plain step;
        # before one is planned at this batch size, a tree of the best root child alone.
        if r.tree_gain is not None:
            gain, forwards = r.tree_gain, r.tree_ms
        else:
            rate = frontier.running_accept_rate
            gain = 1.0 + (r.root_value if r.root_value is not None else PRIOR_ACCEPTANCE if rate != rate else rate)
            forwards = r.costs.root_draft_ms + r.costs.target[2] if r.costs.target else 0.0
        pays = r.costs.tree_pays(gain, forwards + tree_ms, plain_ms, ratio)
        probe = frontier.step == 0 or r.plain_run >= r.probe_gap
        measure = self.measured and solo and self._steps.plain_due(
            not r.costs.tree_pays(gain, forwards + tree_ms, plain_ms, ratio * self._steps.doubt))
        draft = (pays or probe) and not measure
        # A probe costs a tree step that the rule judged not to pay: back off while they keep not paying.
        if pays:
            r.probe_gap = self.probe_every
        elif draft and frontier.step > 0:
            r.probe_gap = min(2 * r.probe_gap, self.probe_max)
        r.catch_up = r.plain_run if draft and not r.drafted else 0  # tokens the draft has not seen, but one
        r.plain_run = 0 if draft else r.plain_run + 1
        r.drafted, r.overhead_ms = draft, tree_ms
        if draft:  # the level keeps the step's running state from here; a step's time outside its forwards
            # counts in each node's share of the step (it is paid whatever the tree's size)
            cal = self._calibrator
            r.state.begin_step(1.0, 0, r.costs.root_draft_ms + tree_ms, frontier.position,
                               (cal.active, cal.offset, cal.slope) if self.online is not None else None,
                               raw_step_scalars(frontier, r.context))
        return r.roots[1 if draft else 0]

    # -- batch sizing (decoder.BatchSizing) --------------------------------------------------------

    def node_values(self) -> np.ndarray:
        r = self._request
        if r is None or not r.drafted:
            return np.zeros(0)
        return np.where(r.state.keep[:r.count], r.state.value[:r.count], 0.0)

    def batch_cap(self, values: list[np.ndarray]) -> int:
        """The nodes per row that maximise the batch's expected accepted tokens per millisecond of its step,
        every row's tree padded to the cap: sum over rows of (1 + its best n values) over the step's draft time
        and the batched verify of n + 1 tokens a row (this request's costs, at this batch size)."""
        r = self._request
        best = [np.sort(v[v > 0])[::-1] for v in values]
        largest = max(len(b) for b in best)
        target = r.costs.target if r is not None else []
        if not target or largest == 0 or not self.batch_aware:
            return largest
        draft_ms = r.state.scalars[DRAFT_MS] if r.drafted else r.costs.root_draft_ms
        gains = np.zeros(largest + 1)
        for b in best:  # the batch's expected tokens with every tree cut to n nodes, n = 0..largest
            cum = np.concatenate([[0.0], np.cumsum(b)])
            gains += 1.0 + cum[np.minimum(np.arange(largest + 1), len(b))]
        ms = draft_ms + np.asarray([target[min(n + 1, len(target) - 1)] for n in range(largest + 1)])
        return int(np.argmax(gains / ms))

    def _rebatch(self, batch: int) -> None:
        """The step's batch size changed (rows joined or finished): the level reads the costs at the new one."""
        r = self._request
        r.costs = _costs(self.latency, r.budget, batch)
        r.tree_gain, r.tree_ms = None, 0.0  # trees planned at another batch size say little about this one
        r.state.target[:] = r.costs.target  # in place: the level's argument tuple holds these arrays
        r.state.draft[:] = r.costs.draft
