"""LearnedTree: best-first tree growth valued by a learned acceptance predictor, within a domain budget.

A candidate's value is the predicted probability that its whole path is accepted: the product of the
predicted conditional acceptances along it. Each level keeps candidates best value first while the value
clears the budget's threshold and, given the latency profile, pays for its verify cost; kept nodes draft
``max_width`` children and the next level keeps however many of them earn their place, so a node whose
children's predictions are spread keeps more of them (widening) and a peaked one keeps one. A level is
drafted only when its expected gain covers one more draft forward; at the root, when the predicted
value of the best root child (a running mean over recent steps) is too low to pay for drafting, the step is
a plain target step (with a probe every ``probe_every`` steps). ``guard`` (``controller.guard``, off by default:
on the bench it stopped drafting on noisy early steps and cost more than it saved; docs/performance.md)
does the same from what the request has *measured*: step times and tokens per step against the plain step.

Online calibration (``online``, on by default): the predictor's outputs pass through a per-request
Platt-style correction (``predictor.online``) updated after every step with what the step revealed: each
tried node (its parent accepted) labelled by whether it is on the accepted path (``StepOutcome.path``), the
labels of ``replay_online(labels="exact")``, shrunk toward the global model; the corrected probabilities
value the next step's tree once the request's evidence against the global model reaches the correction's
gate (``OnlineConfig.gate``; until then the global predictions value it). ``online=None`` uses the global
predictor as it is.

With a predictor that takes encoded rows (``controller.features``) each level's features are written
straight into its input matrix, without a dict of columns per level.
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
from treewise.predictor.online import OnlineCalibrator, OnlineConfig

from .budgets import BudgetsFile, DomainBudget, load_budgets
from .features import FeatureRows
from .fused import FusedLevel, tried_rows
from .guard import PayoffGuard
from .latency import LatencyProfile

PRIOR_ACCEPTANCE = 0.5  # assumed before a request has verified anything


@runtime_checkable
class AcceptanceModel(Protocol):
    """What LearnedTree needs of a predictor: one frontier's features in, acceptance probabilities out."""

    @property
    def feature_names(self) -> list[str]: ...

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray: ...


class DomainResolver(Protocol):
    def resolve(self, domain: str, text: str) -> str: ...


@dataclass
class _Level:
    """One drafted level of the current step: the global predictions, parents (candidate index in the
    step, -1 for the root) and which candidates the policy kept."""

    raw: np.ndarray
    parent: np.ndarray
    keep: np.ndarray


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
    # Plain lists: a step has a dozen or two candidates, where indexing numpy arrays one by one costs more.
    raw = [v for lv in levels for v in lv[0].tolist()]
    parent = [v for lv in levels for v in lv[1].tolist()]
    keep = [v for lv in levels for v in lv[2].tolist()]
    p, y = [0.0] * len(raw), [0.0] * len(raw)
    n = tried_rows(raw, keep, parent, len(raw), outcome.verified, outcome.path, p, y)  # type: ignore[arg-type]
    return TriedNodes(p[:n], y[:n]) if n >= 0 else None


@dataclass
class LearnedTree:
    predictor: AcceptanceModel
    budgets: BudgetsFile = field(default_factory=lambda: BudgetsFile(default=DomainBudget()))
    latency: LatencyProfile | None = None  # None: no cost rule, only thresholds and budgets
    classifier: DomainResolver | None = None  # resolves domain="auto"
    probe_every: int = 8  # a request that stopped drafting still drafts every N steps to notice a change
    online: OnlineConfig | None = field(default_factory=OnlineConfig)  # None: no per-request correction
    guard: PayoffGuard | None = None  # None: no measured never-slower-than-plain rule
    fused: bool = True  # run each level as one native call (controller.fused) where it is available
    domain: str = field(default="unknown", init=False)
    budget: DomainBudget = field(default_factory=DomainBudget, init=False)
    _value: np.ndarray = field(default_factory=lambda: np.zeros(64), init=False, repr=False)  # by candidate index
    # (the Python path's; a native level keeps its own, FusedLevel.value)
    _count: int = field(default=0, init=False, repr=False)  # candidates of this step valued so far
    _gain: float = field(default=1.0, init=False, repr=False)  # expected tokens of this step's tree
    _draft_ms: float = field(default=0.0, init=False, repr=False)
    _root_draft_ms: float = field(default=0.0, init=False, repr=False)  # the root's draft forward, per request
    _root_cost: float = field(default=0.0, init=False, repr=False)  # the root's drafting cost in tokens, per request
    _nodes: int = field(default=0, init=False, repr=False)
    _root_value: float | None = field(default=None, init=False, repr=False)  # running mean of the best child value
    _context: RequestFeatures = field(default_factory=RequestFeatures, init=False, repr=False)
    _calibrator: OnlineCalibrator = field(default_factory=OnlineCalibrator, init=False, repr=False)
    _step: list[_Level] = field(default_factory=list, init=False, repr=False)  # this step's levels so far
    _domain_column: tuple[object, type] = field(default=("unknown", object), init=False, repr=False)  # value, dtype
    _names: list[str] = field(default_factory=list, init=False, repr=False)  # the predictor's features
    _rows: FeatureRows | None = field(default=None, init=False, repr=False)  # None: the dict path
    _target: list[float] = field(default_factory=list, init=False, repr=False)  # target ms by verified nodes
    _draft: list[float] = field(default_factory=list, init=False, repr=False)  # draft ms by fed nodes
    _fused: FusedLevel | None = field(default=None, init=False, repr=False)  # this request's native level
    _roots: tuple[LevelPlan, LevelPlan] = field(  # the root's answers: plain step, draft; set by start
        default_factory=lambda: (LevelPlan.uniform(1, 0),) * 2, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.online is not None:
            self._calibrator = OnlineCalibrator(self.online)

    @classmethod
    def default(cls, latency: LatencyProfile | None = None, online: bool = True, guard: bool = False) -> LearnedTree:
        """The shipped predictor, budgets, domain classifier and latency profile under data/; ``guard=True`` (with
        the latency profile) adds a ``PayoffGuard``."""
        from treewise.predictor import AcceptancePredictor

        from .domains import DomainClassifier

        data = data_dir()
        profile = latency
        if profile is None and (data / "latency.json").exists():
            profile = LatencyProfile.read(data / "latency.json")
        classifier = DomainClassifier.default() if (data / "domain_classifier.npz").exists() else None
        predictor = AcceptancePredictor.load(Path(data / "predictor"))
        return cls(predictor, load_budgets(), profile, classifier, online=OnlineConfig() if online else None,
                   guard=PayoffGuard(profile.target_time(1)) if guard and profile is not None else None)

    @property
    def native_level(self) -> bool:
        """Whether the last started request runs each level as one native call (``controller.fused``): then
        the predictor is called from native code, inside the policy's time, never through ``predict_prefix``."""
        return self._fused is not None

    # -- protocol ----------------------------------------------------------------------------------

    def start(self, request: RequestInfo) -> None:
        domain = request.domain
        if domain == "auto" and self.classifier is not None:
            domain = self.classifier.resolve(domain, request.prompt)
        budget = self.budgets.for_domain(domain)
        # A domain tuned to another family (static, confidence) says nothing about learned sizes: use the default.
        self.domain, self.budget = domain, budget if budget.policy == "learned" else self.budgets.default
        # The domain column of this request's features: the predictor's integer code when it takes codes
        # (an unseen domain is a missing value, as in training), else the name.
        code = getattr(self.predictor, "category_code", None)
        if code is None:
            self._domain_column = (self.domain, object)
        else:
            known = code("domain", domain)
            self._domain_column = (float(known) if known >= 0 else float("nan"), np.float64)
        self._root_value = None
        self._names = list(self.predictor.feature_names)  # a property that builds a list on every call
        self._rows = FeatureRows(self.predictor, self.domain) if FeatureRows.supports(self.predictor) else None
        # The latency profile at every size this request can ask for, as plain lists: looked up dozens of
        # times a step.
        sizes = range(self.budget.node_budget + self.budget.max_width + 2)
        lat = self.latency
        self._target = [lat.target_time(n) for n in sizes] if lat is not None else []
        self._draft = [lat.draft_time(n) for n in sizes] if lat is not None else []
        # The root's two answers, looked up once: a plain step, or max_width children (LevelPlan.uniform's cached
        # read-only plans, shared by every step and request).
        self._roots = (LevelPlan.uniform(1, 0), LevelPlan.uniform(1, self.budget.max_width))
        # The root's rule reads only request constants: the cost of one draft forward and one verified node
        # at a fresh step (gain 1, no nodes), in expected tokens.
        self._gain, self._nodes = 1.0, 0
        self._draft_ms = self._root_draft_ms = self._draft_time(1) if lat is not None else 0.0
        verify_ms = self._target_ms(2) - self._target_ms(1) if lat is not None else 0.0
        self._root_cost = self._cost(self._draft_ms + verify_ms)
        self._fused = (FusedLevel.build(self._rows, self.predictor, self._target, self._draft, self.budget)
                       if self.fused and self._rows is not None else None)
        self._context.start()
        self._calibrator.reset()
        self._step = []
        if self.guard is not None:
            self.guard.start()

    def plan(self, frontier: Frontier) -> LevelPlan:
        if frontier.depth == 0:
            return self._plan_root(frontier)
        fused = self._fused
        if fused is not None:  # the level in one native call, written inline (a call frame costs after a forward);
            cols = frontier.columns  # values, predictions, keep masks and parents stay in fused (observe reads them)
            at = self._count
            end = self._count = at + len(cols["parent"])
            best = fused.run(frontier, cols, at, _child_estimate(frontier))
            if frontier.depth == 1:
                self._note_best(best)
            return LevelPlan.of_arrays(fused.keep[at:end], fused.children[at:end])
        value = self._values_of(frontier)
        keep = self._keep(value)
        kept = np.asarray(keep, dtype=bool)
        self._step[-1].keep = kept
        self._record(np.where(kept, value, 0.0))
        return LevelPlan(keep=kept, children=np.asarray(self._expand(frontier, value, keep), dtype=np.int64))

    def finalize(self, candidates: Candidates) -> torch.Tensor | None:
        return None

    def observe(self, outcome: StepOutcome) -> None:
        self._context.observe(outcome.accepted, outcome.tried)
        if self.guard is not None:
            self.guard.observe(outcome.verified, outcome.accepted)
        if self.online is not None and outcome.verified > 0:
            self._update_correction(outcome)

    def _update_correction(self, outcome: StepOutcome) -> None:
        """Update the request's correction with the step's tried nodes, labelled by the accepted path."""
        if self._fused is not None:
            self._fused.observe(self._count, outcome.verified, outcome.path, self._calibrator)
            return
        tried = tried_nodes([(lv.raw, lv.parent, lv.keep) for lv in self._step], outcome)
        if tried is not None:
            self._calibrator.update(tried.raw, tried.accepted)

    # -- rules -------------------------------------------------------------------------------------

    def _cost(self, ms: float) -> float:
        """Milliseconds expressed in expected tokens at this step's current rate (gain / time)."""
        if self.latency is None:
            return 0.0
        step_ms = self._draft_ms + self._target_ms(self._nodes + 1)
        return self.budget.cost_scale * ms * self._gain / step_ms

    def _target_ms(self, n: int) -> float:
        return self._target[n] if n < len(self._target) else self.latency.target_time(n)  # type: ignore[union-attr]

    def _draft_time(self, n: int) -> float:
        return self._draft[n] if n < len(self._draft) else self.latency.draft_time(n)  # type: ignore[union-attr]

    def _plan_root(self, frontier: Frontier) -> LevelPlan:
        self._count, self._gain, self._nodes, self._draft_ms = 0, 1.0, 0, self._root_draft_ms
        self._step = []
        self._context.begin_step()
        # The predictor's own recent view of the best root child; before any, the request's running acceptance.
        rate = frontier.running_accept_rate
        est = self._root_value if self._root_value is not None else PRIOR_ACCEPTANCE if rate != rate else rate
        allowed = self.guard.allow() if self.guard is not None else True  # always: it times the steps
        draft = (est >= self._root_cost or frontier.step % self.probe_every == 0) and allowed
        if draft and self._fused is not None:  # the kernel keeps the step's running state from here
            cal = self._calibrator
            self._fused.step(frontier, self._context, self._gain, self._nodes, self._draft_ms,
                             (cal.active, cal.offset, cal.slope) if self.online is not None else None)
        return self._roots[1 if draft else 0]

    def _values_room(self, count: int, end: int) -> None:
        """Room for path values up to candidate ``end`` (the first ``count`` kept as they are)."""
        if end > len(self._value):
            self._value = np.concatenate([self._value[:count], np.zeros(end)])

    def _note_best(self, best: float) -> None:
        """Fold a step's best root-child value into the running mean the root decision reads."""
        self._root_value = best if self._root_value is None else 0.5 * (self._root_value + best)

    def _values_of(self, frontier: Frontier) -> np.ndarray:
        """[m] float64 predicted path values: the (corrected) conditional acceptance times the parent's value."""
        parents = frontier.arrays()["parent"]
        if self._rows is not None:  # rows written straight into the predictor's matrix
            raw = self._rows.predict(frontier, self._context, parents)
        else:
            feats = frontier.numeric_features()  # categoricals as integer codes: no object arrays per level
            value, dtype = self._domain_column
            feats["domain"] = np.full(frontier.size, value, dtype=dtype)
            self._context.add(feats, parents)
            raw = np.asarray(self.predictor.predict_batch({n: feats[n] for n in self._names}), dtype=np.float64)
        p = self._calibrator(raw) if self.online is not None else raw
        self._step.append(_Level(raw, parents, np.zeros(len(raw), dtype=bool)))
        if frontier.depth == 1:
            self._note_best(float(np.max(p)) if len(p) else 0.0)
            return np.asarray(p, dtype=np.float64)
        return self._value[parents] * p

    def _record(self, value: np.ndarray) -> None:
        """Append a level's path values (0 where pruned) to the step's values by candidate index."""
        end = self._count + len(value)
        self._values_room(self._count, end)
        self._value[self._count:end] = value
        self._count = end

    def _keep(self, value: np.ndarray) -> list[bool]:
        """Best value first while it clears the threshold, fits the node budget and pays for its verify cost.

        Plain Python over the level's dozen values: cheaper than numpy calls right after a draft forward."""
        values = value.tolist()
        keep = [False] * len(values)
        timed = self.latency is not None
        cap, threshold = self.budget.node_budget, self.budget.threshold
        for i in sorted(range(len(values)), key=values.__getitem__, reverse=True):  # stable: ties by index
            v = values[i]
            if self._nodes >= cap or v < threshold:
                break
            if timed and v < self._cost(self._target_ms(self._nodes + 2) - self._target_ms(self._nodes + 1)):
                break
            keep[i] = True
            self._gain += v
            self._nodes += 1
        return keep

    def _expand(self, frontier: Frontier, value: np.ndarray, keep: list[bool]) -> list[int]:
        """Draft children under kept nodes whose best child may clear the threshold, if the level pays off."""
        children = [0] * len(keep)
        if frontier.depth >= self.budget.max_depth or not any(keep) or self._nodes >= self.budget.node_budget:
            return children
        est = _child_estimate(frontier)
        threshold = self.budget.threshold
        gains = [v * est for v in value.tolist()]
        want = [i for i, (g, k) in enumerate(zip(gains, keep, strict=True)) if k and g >= threshold]
        if not want:
            return children
        level_ms = self._draft_time(len(want)) if self.latency is not None else 0.0
        if sum(gains[i] for i in want) < self._cost(level_ms):
            return children
        self._draft_ms += level_ms
        for i in want:
            children[i] = self.budget.max_width
        return children
