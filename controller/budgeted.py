"""The controller's default policy: per request, the domain's budget picks the policy family and its size."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from treewise.decoder import Candidates, Frontier, LevelPlan, RequestInfo, StaticTree, StepOutcome, TreePolicy

from .budgets import BudgetsFile, DomainBudget
from .latency import LatencyProfile
from .learned import AcceptanceModel, DomainResolver, LearnedTree, PairData
from .policies import ConfidenceTree


def static_from_budget(budget: DomainBudget) -> StaticTree:
    """The widest static shape within the node budget: ``max_width`` branches while they fit, then chains."""
    branching: list[int] = []
    nodes, count = 0, 1
    for _ in range(budget.max_depth):
        width = budget.max_width if nodes + count * budget.max_width <= budget.node_budget else 1
        if nodes + count * width > budget.node_budget:
            break
        branching.append(width)
        count *= width
        nodes += count
    return StaticTree(branching=tuple(branching or [1]))


def policy_from_budget(budget: DomainBudget, predictor: AcceptanceModel | None = None,
                       latency: LatencyProfile | None = None) -> TreePolicy:
    """One domain's policy: the family and size its budget names."""
    if budget.policy == "static":
        return static_from_budget(budget)
    if budget.policy == "confidence":
        return ConfidenceTree(budget=budget.node_budget, max_depth=budget.max_depth, top_k=budget.max_width)
    if predictor is None:
        raise ValueError("a 'learned' budget needs an acceptance predictor: pass predictor= or train one with "
                         "`treewise train`")
    return LearnedTree(predictor, BudgetsFile(default=budget), latency)


@dataclass
class BudgetedTree:
    """Dispatches each request to the policy its (possibly auto-detected) domain's budget names."""

    budgets: BudgetsFile
    predictor: AcceptanceModel | None = None
    latency: LatencyProfile | None = None
    classifier: DomainResolver | None = None
    domain: str = field(default="unknown", init=False)
    _active: TreePolicy = field(default_factory=lambda: StaticTree(), init=False, repr=False)

    @classmethod
    def default(cls, pair: str | None = None) -> BudgetedTree:
        """The budgets, latency profile and domain classifier of the model ``pair`` (``PairData``), and its predictor
        when a budget names the learned policy."""
        shipped = PairData.load(pair)
        budgets = shipped.budgets
        predictor = None  # loaded only when a budget names the learned policy: a pair may ship none yet
        if any(b.policy == "learned" for b in (budgets.default, *budgets.domains.values())):
            from treewise.predictor import AcceptancePredictor

            predictor = AcceptancePredictor.load(shipped.predictor)
        return cls(budgets, predictor, shipped.latency, shipped.classifier)

    def start(self, request: RequestInfo) -> None:
        domain = request.domain
        if domain == "auto" and self.classifier is not None:
            domain = self.classifier.resolve(domain, request.prompt)
        self.domain = domain
        self._active = policy_from_budget(self.budgets.for_domain(domain), self.predictor, self.latency)
        self._active.start(request)

    def plan(self, frontier: Frontier) -> LevelPlan:
        return self._active.plan(frontier)

    def finalize(self, candidates: Candidates) -> torch.Tensor | None:
        return self._active.finalize(candidates)

    def observe(self, outcome: StepOutcome) -> None:
        self._active.observe(outcome)
