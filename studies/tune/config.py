"""Defaults of `treewise tune` and the search space: light at import (no optuna, no torch), so the CLI reads
them fast; the controller is imported only where a budget is validated or built."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from treewise.studies.shared.paths import data_dir

if TYPE_CHECKING:
    from optuna.trial import Trial

    from treewise.controller import DomainBudget

Family = Literal["static", "confidence", "learned"]


def default_budgets_path(pair: str | None = None) -> Path:
    """The model pair's own budgets file (data/budgets.json for micro, data/smollm2/budgets.json for smollm2):
    the one ``BudgetedTree.default(pair=)`` reads (``controller.pairs``; imports torch, so only when a run starts)."""
    from treewise.controller.pairs import BUDGETS, pair_spec

    return pair_spec(pair).own(BUDGETS)


class IntRange(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    low: int
    high: int
    log: bool = False


class FloatRange(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    low: float
    high: float
    log: bool = False


class SearchSpace(BaseModel):
    """The budget parameters Optuna searches; names match :class:`DomainBudget` fields (the only bounds)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    families: tuple[Family, ...] = ("static", "confidence", "learned")
    node_budget: IntRange = IntRange(low=2, high=64, log=True)
    max_depth: IntRange = IntRange(low=1, high=8)
    max_width: IntRange = IntRange(low=1, high=6)
    threshold: FloatRange = FloatRange(low=1e-3, high=0.3, log=True)  # learned only
    cost_scale: FloatRange = FloatRange(low=0.0, high=3.0)  # learned only

    @model_validator(mode="after")
    def _check(self) -> SearchSpace:
        if not self.families or len(set(self.families)) != len(self.families):
            raise ValueError(f"families must be a non-empty list without repeats, got {list(self.families)}")
        from treewise.controller import (
            DomainBudget,  # the bounds live with the budget; imported here to keep the CLI light
        )

        for name in ("node_budget", "max_depth", "max_width", "threshold", "cost_scale"):
            rng = getattr(self, name)
            field = DomainBudget.model_fields[name]
            lo = next(m.ge for m in field.metadata if hasattr(m, "ge"))
            hi = next(m.le for m in field.metadata if hasattr(m, "le"))
            if not lo <= rng.low <= rng.high <= hi:
                raise ValueError(f"{name} range {rng.low}..{rng.high} must satisfy {lo} <= low <= high <= {hi}")
            if rng.log and rng.low <= 0:
                raise ValueError(f"{name}: a log range needs low > 0, got {rng.low}")
        return self

    def sample(self, trial: Trial) -> DomainBudget:
        """One budget; threshold and cost_scale exist only for the learned family (conditional parameters)."""
        family = trial.suggest_categorical("policy", list(self.families))
        names = ["node_budget", "max_depth", "max_width"] + (["threshold", "cost_scale"] if family == "learned" else [])
        values: dict[str, int | float] = {}
        for name in names:
            rng = getattr(self, name)
            suggest = trial.suggest_int if isinstance(rng, IntRange) else trial.suggest_float
            values[name] = suggest(name, rng.low, rng.high, log=rng.log)
        from treewise.controller import DomainBudget

        return DomainBudget(policy=family, **values)

    def params_of(self, budget: DomainBudget) -> dict[str, str | int | float] | None:
        """``budget`` as this space's trial parameters (for ``enqueue_trial``); None when it lies outside."""
        names = ["node_budget", "max_depth", "max_width"] + (
            ["threshold", "cost_scale"] if budget.policy == "learned" else [])
        if budget.policy not in self.families:
            return None
        params: dict[str, str | int | float] = {"policy": budget.policy}
        for name in names:
            rng, value = getattr(self, name), getattr(budget, name)
            if not rng.low <= value <= rng.high:
                return None
            params[name] = value
        return params


class TuneConfig(BaseModel):
    """Every default of ``treewise tune``; the CLI reads its defaults from here."""

    model_config = ConfigDict(extra="forbid")

    domains: list[str] | None = None  # None: every domain of the suite's tune split
    trials: int = Field(20, ge=0, description="more trials per domain in this call; 0 only finalises")
    timeout_s: float | None = Field(None, gt=0, description="stop a domain's trials after this many seconds")
    storage: str = "sqlite:///runs/tune.db"
    study_name: str = "treewise"
    suite: Path = Field(default_factory=lambda: data_dir() / "prompts")
    split: str = "tune"
    heldout_split: str = "test"
    per_domain: int = Field(3, ge=1, description="tune prompts per domain")
    heldout_per_domain: int = Field(3, ge=0, description="held-out prompts per domain; 0 skips the evaluation")
    max_new_tokens: int = Field(48, ge=1)
    repeats: int = Field(2, ge=1, description="interleaved plain/policy repeats per prompt")
    seed: int | None = 0
    pruner: Literal["median", "none"] = "median"
    pruner_startup_trials: int = Field(3, ge=0)
    pruner_warmup_steps: int = Field(1, ge=0, description="prompts measured before a trial may be pruned")
    heartbeat_s: int = Field(10, ge=1, description="RDB storages: a trial whose worker is silent 3x this long "
                             "is failed and re-queued for another worker")
    space: SearchSpace = Field(default_factory=SearchSpace)  # validated against the controller's bounds
    warm_start: bool = True  # a new study's first trial measures budgets_out's present entry for its domain
    predictor: Path | None = None  # None: the pair's predictor when present (controller.pairs.pair_files)
    latency_cache: Path = Path("runs/latency")
    budgets_out: Path  # absent or None: the pair's own budgets file (``_pair_budgets``)
    finalize: bool = True  # False: a worker that only runs trials (no budgets file, no held-out run)
    pair: str | None = None  # a controller.pairs name; None: $TREEWISE_PAIR, else the real pair (smollm2)
    target: str | None = None  # default: the pair's target
    draft: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _pair_budgets(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("budgets_out") is None:
            data = {**data, "budgets_out": default_budgets_path(data.get("pair"))}
        return data
