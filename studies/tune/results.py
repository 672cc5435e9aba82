"""What a tuning run leaves in Optuna storage, read back as typed data: best trials, the
held-out comparison (measured once when a run finalises, stored as a study user attr) and the report that
``treewise report`` rebuilds from storage alone, without decoding anything."""

from __future__ import annotations

import time
import warnings

import optuna
from optuna.importance import PedAnovaImportanceEvaluator
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState
from pydantic import BaseModel, Field

from treewise.controller import AcceptanceModel, BudgetedTree, BudgetsFile, DomainBudget, LatencyProfile
from treewise.decoder import TreeDecoder
from treewise.studies.shared.measure import PLAIN, BenchConfig, Runner, measure, select_prompts, summarize
from treewise.studies.shared.suites import load_suite

from .storage import TuneError, dashboard_command, fail_stale_trials, open_storage  # noqa: F401 (re-exported)

TUNED, DEFAULTS, BEST_STATIC = "tuned", "defaults", "best_static"
DEAD_WORKER = "its worker died (killed, or its machine was lost): its heartbeat stopped"


def study_name_for(prefix: str, domain: str) -> str:
    return f"{prefix}-{domain}"


def best_trial(study: optuna.Study, family: str | None = None) -> FrozenTrial | None:
    """The fastest completed trial, optionally of one policy family."""
    done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value is not None and (family is None or t.params.get("policy") == family)]
    return max(done, key=lambda t: t.value) if done else None  # type: ignore[arg-type, return-value]


# -- held-out evaluation ----------------------------------------------------------------------------


class HeldoutRow(BaseModel):
    speedup: float  # median over repeats of plain time / row time
    speedup_range: tuple[float, float]
    tau: float | None
    tokens_per_s: float
    mismatches: int
    budget: DomainBudget | None = None


class HeldoutResult(BaseModel):
    domain: str
    split: str
    prompts: int
    repeats: int
    max_new_tokens: int
    rows: dict[str, HeldoutRow]
    note: str = ""


def evaluate_heldout(dec: TreeDecoder, bench: BenchConfig, tuned: dict[str, DomainBudget],
                     static: dict[str, DomainBudget], predictor: AcceptanceModel | None,
                     latency: LatencyProfile | None) -> dict[str, HeldoutResult]:
    """Tuned budgets vs ``DomainBudget()`` vs the best static trial, interleaved with plain decoding (bench)."""
    if not load_suite(bench.suite, bench.split, bench.domains):
        return {}

    def budgeted(budgets: dict[str, DomainBudget]) -> Runner:
        policy = BudgetedTree(BudgetsFile(default=DomainBudget(policy="static"), domains=budgets), predictor, latency)
        return lambda p: dec.generate(p.prompt, bench.max_new_tokens, tree=policy, domain=p.domain, prompt_id=p.id)

    prompts = select_prompts(bench)
    runners: dict[str, Runner] = {PLAIN: lambda p: dec.generate_plain(p.prompt, bench.max_new_tokens),
                                  TUNED: budgeted(tuned), BEST_STATIC: budgeted(static)}
    defaults = {d: DomainBudget() for d in tuned}
    note = ""
    if DomainBudget().policy != "learned" or predictor is not None:
        runners[DEFAULTS] = budgeted(defaults)
    else:
        note = "defaults row skipped: DomainBudget() names the learned family, which needs a predictor"
    t0 = time.perf_counter()
    result = summarize(measure(runners, prompts, bench.repeats), {}, prompts, bench, time.perf_counter() - t0)
    budgets = {TUNED: tuned, BEST_STATIC: static, DEFAULTS: defaults}
    out: dict[str, HeldoutResult] = {}
    for domain in sorted({p.domain for p in prompts}):
        rows = {}
        for name, row in result.policies.items():
            m = row.per_domain[domain]
            rows[name] = HeldoutRow(speedup=m.speedup, speedup_range=m.speedup_range, tau=m.tau,
                                    tokens_per_s=m.tokens_per_s, mismatches=m.mismatches,
                                    budget=budgets.get(name, {}).get(domain))
        n = sum(p.domain == domain for p in prompts)
        out[domain] = HeldoutResult(domain=domain, split=bench.split, prompts=n, repeats=bench.repeats,
                                    max_new_tokens=bench.max_new_tokens, rows=rows, note=note)
    return out


# -- report from storage ----------------------------------------------------------------------------


class TrialSummary(BaseModel):
    number: int
    state: str
    value: float | None
    budget: DomainBudget | None
    duration_s: float | None
    tau: float | None = None
    tokens_per_s: float | None = None
    fail_reason: str | None = None
    retry_of: int | None = None  # the trial of a dead worker this one re-runs (same parameters)

    @classmethod
    def of(cls, t: FrozenTrial) -> TrialSummary:
        raw = t.user_attrs.get("budget")
        reason = t.user_attrs.get("fail_reason") or t.system_attrs.get("fail_reason")
        if t.state == TrialState.FAIL and not reason:  # failed from outside: its heartbeat stopped
            reason = DEAD_WORKER
        return cls(number=t.number, state=t.state.name, value=t.value,
                   budget=DomainBudget.model_validate(raw) if raw else None,
                   duration_s=t.duration.total_seconds() if t.duration else None, tau=t.user_attrs.get("tau"),
                   tokens_per_s=t.user_attrs.get("tokens_per_s"), fail_reason=reason,
                   retry_of=t.system_attrs.get("failed_trial"))


class StudyStart(BaseModel):
    """What a study holds when a tune call opens it: a rerun after Ctrl-C or kill -9 resumes from here."""

    study: str
    states: dict[str, int]  # every TrialState name; trials of dead workers already FAIL (heartbeats)
    best: TrialSummary | None
    retried: int = 0  # trials of dead workers re-queued (WAITING) for this run to take over

    @property
    def trials(self) -> int:
        return sum(self.states.values())

    @classmethod
    def of(cls, study: optuna.Study) -> StudyStart:
        trials = study.get_trials(deepcopy=False)
        best = best_trial(study)
        return cls(study=study.study_name, states=state_counts(trials), best=TrialSummary.of(best) if best else None,
                   retried=sum(t.state == TrialState.WAITING and "failed_trial" in t.system_attrs for t in trials))


def state_counts(trials: list[FrozenTrial]) -> dict[str, int]:
    states = {s.name: 0 for s in TrialState}
    for t in trials:
        states[t.state.name] += 1
    return states


class Importances(BaseModel):
    values: dict[str, float] = Field(default_factory=dict)  # PED-ANOVA, normalised to sum 1
    note: str = ""


class DomainReport(BaseModel):
    domain: str
    study: str
    states: dict[str, int]  # COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    trial_s: float  # summed duration of finished trials
    best: TrialSummary | None
    best_static: TrialSummary | None
    failures: list[TrialSummary]  # the last few, with their reasons
    importances: Importances
    heldout: HeldoutResult | None

    @property
    def trials(self) -> int:
        return sum(self.states.values())


class TuneReport(BaseModel):
    study_name: str
    storage: str
    domains: dict[str, DomainReport]

    @property
    def trials(self) -> int:
        return sum(d.trials for d in self.domains.values())


def param_importances(study: optuna.Study) -> Importances:
    """PED-ANOVA importances (deterministic, so a reprint gives the same numbers; fANOVA would need
    scikit-learn, which treewise does not depend on), or why there are none."""
    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if len(done) < 2:
        return Importances(note=f"needs 2 or more completed trials, has {len(done)}")
    shared = set.intersection(*(set(t.params) for t in done))
    left_out = sorted(set().union(*(t.params for t in done)) - shared)
    note = (f"{', '.join(left_out)} left out: they exist only for some families and importances use parameters "
            "of every completed trial") if left_out else ""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            values = optuna.importance.get_param_importances(study, evaluator=PedAnovaImportanceEvaluator())
    except Exception as err:  # e.g. every completed trial has the same parameters
        return Importances(note=f"not computable: {err}")
    return Importances(values={k: float(v) for k, v in values.items()}, note=note)


def find_studies(storage: BaseStorage, prefix: str) -> dict[str, str]:
    """Domain -> study name for the studies a ``tune`` run with ``--study-name prefix`` created."""
    found = {}
    for s in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if s.user_attrs.get("treewise_prefix") == prefix and "domain" in s.user_attrs:
            found[str(s.user_attrs["domain"])] = s.study_name
    return found


def build_report(storage: BaseStorage, prefix: str, domains: list[str] | None = None,
                 storage_url: str = "") -> TuneReport:
    found = find_studies(storage, prefix)
    if domains is not None:
        found = {d: n for d, n in found.items() if d in domains}
    if not found:
        names = optuna.study.get_all_study_names(storage)
        raise TuneError(f"no treewise study {prefix!r} in {storage_url or 'this storage'} (studies there: "
                        f"{names or 'none'}): pass the --study-name and --storage that `treewise tune` used")
    reports = {}
    for domain, name in sorted(found.items()):
        study = optuna.load_study(study_name=name, storage=storage)
        fail_stale_trials(study)  # with heartbeats: a dead worker's trial is FAIL, not RUNNING forever
        trials = study.get_trials(deepcopy=False)
        states = state_counts(trials)
        best, static = best_trial(study), best_trial(study, family="static")
        heldout = study.user_attrs.get("heldout")
        reports[domain] = DomainReport(
            domain=domain, study=name, states=states,
            trial_s=sum(t.duration.total_seconds() for t in trials if t.duration is not None),
            best=TrialSummary.of(best) if best else None, best_static=TrialSummary.of(static) if static else None,
            failures=[TrialSummary.of(t) for t in trials if t.state == TrialState.FAIL][-5:],
            importances=param_importances(study),
            heldout=HeldoutResult.model_validate(heldout) if heldout else None,
        )
    return TuneReport(study_name=prefix, storage=storage_url, domains=reports)
