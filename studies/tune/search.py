"""Optuna tunes each domain's tree budget against speedup measured over plain target decoding.

One study per domain, named ``<study>-<domain>``: each domain has its own optimum and TPE models one
objective, so separate studies give per-domain history, pruning baselines and importances without a domain
parameter diluting them. Each study's user attrs name its prefix, domain and search space (a resumed
study must keep its space) and, once finalised, its held-out evaluation, so ``treewise report`` rebuilds
everything from storage alone (:mod:`studies.tune.results`).

Storage is any Optuna URL: ``sqlite:///runs/tune.db`` (default; heartbeats mark trials of a killed worker
failed), ``postgresql://...`` or ``mysql+pymysql://...`` for several machines, or ``journal:///PATH`` (a
journal file, the safest choice for several processes on one machine). Studies are opened with
``load_if_exists``, so after Ctrl-C or kill -9 the same command continues where it stopped and several
workers may run it at once. ``optuna-dashboard sqlite:///runs/tune.db`` (or ``optuna-dashboard PATH`` for a
journal file) browses the same studies live.
"""

from __future__ import annotations

import shlex
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial, Trial
from pydantic import BaseModel

from treewise.controller import (
    AcceptanceModel,
    BudgetsFile,
    DomainBudget,
    LatencyProfile,
    Provenance,
    load_budgets,
    load_or_measure,
    policy_from_budget,
    save_budgets,
)
from treewise.controller.pairs import pair_files
from treewise.decoder import GenerationResult, TreeDecoder, TreePolicy, TreewiseError
from treewise.studies.shared.measure import BenchConfig, load_bench_decoder, select_prompts
from treewise.studies.shared.suites import Prompt, load_suite

from .config import SearchSpace, TuneConfig
from .results import (
    HeldoutResult,
    StudyStart,
    TuneError,
    TuneReport,
    best_trial,
    build_report,
    evaluate_heldout,
    fail_stale_trials,
    open_storage,
    study_name_for,
)
from .storage import safe_url, storage_lock

PolicyFactory = Callable[[DomainBudget], TreePolicy]
TrialCallback = Callable[[str, FrozenTrial, FrozenTrial | None], None]  # domain, trial, best in storage
StartCallback = Callable[[dict[str, StudyStart]], None]


class GreedyMismatchError(TreewiseError):
    """A policy's greedy output differs from plain decoding: the decoder lost losslessness."""


class TuneResult(BaseModel):
    report: TuneReport
    budgets_path: Path | None
    wall_s: float
    notes: list[str]


@dataclass(frozen=True)
class _Setup:
    """What every trial of one tune call shares."""

    dec: TreeDecoder
    space: SearchSpace
    factory: PolicyFactory
    predictor: AcceptanceModel | None
    latency: LatencyProfile | None
    notes: list[str]


def tune(cfg: TuneConfig, *, dec: TreeDecoder | None = None, predictor: AcceptanceModel | None = None,
         policy_factory: PolicyFactory | None = None, on_trial: TrialCallback | None = None,
         on_start: StartCallback | None = None, command: str | None = None) -> TuneResult:
    """Run ``cfg.trials`` more trials per domain, then (``cfg.finalize``) write budgets and evaluate held out.

    ``on_start`` is called once setup (suite, storage, models, predictor) has passed, before the first trial,
    with what each study already holds (a rerun resumes); ``on_trial`` after each trial with the best trial in
    storage (other workers' included); ``predictor`` and ``policy_factory`` replace the ones on disk (tests).
    """
    t0 = time.perf_counter()
    domains = resolve_domains(cfg)
    prompts = {d: select_prompts(_bench_cfg(cfg, cfg.split, [d], cfg.per_domain)) for d in domains}
    storage = open_storage(cfg.storage, cfg.heartbeat_s)
    setup = _setup(cfg, dec or load_bench_decoder(_bench_cfg(cfg, cfg.split, None, 1)), predictor, policy_factory)
    with storage_lock(cfg.storage):  # workers started at once: one creates each study and queues its warm start
        studies = {d: _open_study(storage, cfg, d, setup.space) for d in domains}
    if on_start is not None:
        on_start({d: StudyStart.of(study) for d, study in studies.items()})
    for domain, study in studies.items():
        if cfg.trials == 0:
            continue
        callbacks = [lambda s, t, d=domain: on_trial(d, t, best_trial(s))] if on_trial is not None else []
        study.optimize(lambda trial, d=domain: _objective(trial, setup, cfg, prompts[d]), n_trials=cfg.trials,
                       timeout=cfg.timeout_s, catch=(Exception,), callbacks=callbacks)
    budgets_path = None
    if cfg.finalize:
        budgets_path = _finalize(storage, cfg, domains, setup, time.perf_counter() - t0, command)
    report = build_report(storage, cfg.study_name, domains, storage_url=safe_url(cfg.storage))
    return TuneResult(report=report, budgets_path=budgets_path, wall_s=time.perf_counter() - t0, notes=setup.notes)


def resolve_domains(cfg: TuneConfig) -> list[str]:
    """The requested domains, each checked against the suite's tune split; None means all of them."""
    available = sorted({p.domain for p in load_suite(cfg.suite, cfg.split)})
    if not available:
        raise TuneError(f"{cfg.suite} has no prompts in split {cfg.split!r}: rebuild the suite with tune prompts")
    if cfg.domains is None:
        return available
    unknown = [d for d in cfg.domains if d not in available]
    if unknown:
        raise TuneError(f"domain(s) {unknown} have no {cfg.split!r} prompts in {cfg.suite}: use one of "
                        f"{available} or all")
    return list(dict.fromkeys(cfg.domains))


def _bench_cfg(cfg: TuneConfig, split: str, domains: list[str] | None, per_domain: int) -> BenchConfig:
    return BenchConfig(suite=cfg.suite, split=split, domains=domains, per_domain=per_domain,
                       max_new_tokens=cfg.max_new_tokens, repeats=cfg.repeats, trees={}, hf_assisted=False,
                       pair=cfg.pair, target=cfg.target, draft=cfg.draft)


def _setup(cfg: TuneConfig, dec: TreeDecoder, predictor: AcceptanceModel | None,
           factory: PolicyFactory | None) -> _Setup:
    """Load the predictor when the learned family (or the defaults row) can use one; else drop that family."""
    notes: list[str] = []
    space = cfg.space
    if predictor is None:
        path = cfg.predictor or pair_files(cfg.pair).predictor
        if cfg.predictor is not None and not path.is_dir():
            raise TuneError(f"--predictor {path}: no such folder; train one with `treewise train` or omit it")
        if path.is_dir():
            from treewise.predictor import AcceptancePredictor

            predictor = AcceptancePredictor.load(path)
    if predictor is None and "learned" in space.families and factory is None:
        if space.families == ("learned",):
            raise TuneError("the learned family needs an acceptance predictor: train one into data/predictor/ "
                            "(`treewise train`), pass --predictor DIR, or add --family static/confidence")
        space = space.model_copy(update={"families": tuple(f for f in space.families if f != "learned")})
        notes.append(f"no predictor (no {pair_files(cfg.pair).predictor}, no --predictor): the learned family is "
                     f"left out; searching {list(space.families)}")
    latency = load_or_measure(dec, cfg.latency_cache) if predictor is not None else None
    if factory is None:
        def factory(budget: DomainBudget) -> TreePolicy:
            return policy_from_budget(budget, predictor, latency)
    return _Setup(dec, space, factory, predictor, latency, notes)


def _open_study(storage: optuna.storages.BaseStorage, cfg: TuneConfig, domain: str,
                space: SearchSpace) -> optuna.Study:
    """Create or resume ``<study>-<domain>``; a resumed study must keep its search space."""
    name = study_name_for(cfg.study_name, domain)
    trials_so_far = 0
    try:
        existing = optuna.load_study(study_name=name, storage=storage)
        fail_stale_trials(existing)  # a killed worker's trial: FAIL, and re-queued for this run to take over
        trials_so_far = len(existing.get_trials(deepcopy=False))
    except KeyError:
        pass
    # A resumed seeded sampler would replay its first random points; offsetting by the trial count avoids it.
    # The domain's own offset keeps the domains' studies from all sampling one sequence of points.
    seed = None if cfg.seed is None else cfg.seed + trials_so_far + zlib.crc32(domain.encode()) % 100_000
    pruner: optuna.pruners.BasePruner = (
        optuna.pruners.MedianPruner(n_startup_trials=cfg.pruner_startup_trials, n_warmup_steps=cfg.pruner_warmup_steps)
        if cfg.pruner == "median" else optuna.pruners.NopPruner()
    )
    study = optuna.create_study(storage=storage, study_name=name, direction="maximize", load_if_exists=True,
                                sampler=optuna.samplers.TPESampler(seed=seed), pruner=pruner)
    stored = study.user_attrs.get("space")
    if stored is None:
        study.set_user_attr("treewise_prefix", cfg.study_name)
        study.set_user_attr("domain", domain)
        study.set_user_attr("space", space.model_dump(mode="json"))
        _warm_start(study, cfg, domain, space)
    elif SearchSpace.model_validate(stored) != space:
        raise TuneError(f"study {name!r} in {safe_url(cfg.storage)} was created with search space {stored}; this call "
                        f"searches {space.model_dump(mode='json')}: pass the same --family options (and "
                        "predictor availability) or use a new --study-name")
    return study


def _warm_start(study: optuna.Study, cfg: TuneConfig, domain: str, space: SearchSpace) -> None:
    """Queue the budgets file's present entry for ``domain`` as the study's first trial: the sampler then knows
    the incumbent, and a tuned budget that wins on the tune prompts has beaten it there."""
    if not cfg.warm_start or not cfg.budgets_out.exists():
        return
    params = space.params_of(load_budgets(cfg.budgets_out).for_domain(domain))
    if params is not None:
        study.enqueue_trial(params, user_attrs={"warm_start": str(cfg.budgets_out)})


def _objective(trial: Trial, setup: _Setup, cfg: TuneConfig, prompts: list[Prompt]) -> float:
    try:
        budget = setup.space.sample(trial)
        trial.set_user_attr("budget", budget.model_dump(mode="json"))
        return _measure_trial(trial, setup.dec, setup.factory(budget), cfg, prompts)
    except optuna.TrialPruned:
        raise
    except KeyboardInterrupt:
        trial.set_user_attr("fail_reason", "interrupted (Ctrl-C)")
        raise
    except Exception as err:  # recorded with the trial so the report can say why it failed
        trial.set_user_attr("fail_reason", f"{type(err).__name__}: {err}")
        raise


def _measure_trial(trial: Trial, dec: TreeDecoder, policy: TreePolicy, cfg: TuneConfig,
                   prompts: list[Prompt]) -> float:
    """Plain vs policy per prompt, warm, interleaved with alternating order; speedup = sum plain / sum policy."""
    def run_policy(p: Prompt) -> GenerationResult:
        return dec.generate(p.prompt, cfg.max_new_tokens, tree=policy, domain=p.domain, prompt_id=p.id)

    def run_plain(p: Prompt) -> GenerationResult:
        return dec.generate_plain(p.prompt, cfg.max_new_tokens)

    run_plain(prompts[0])  # warm-up: allocator and kernel caches, the policy's first-call costs
    run_policy(prompts[0])
    rows: list[dict[str, object]] = []
    plain_total = policy_total = 0.0
    for i, p in enumerate(prompts):
        plain: list[GenerationResult] = []
        pol: list[GenerationResult] = []
        for r in range(cfg.repeats):
            pairs = [(run_plain, plain), (run_policy, pol)]
            for runner, out in pairs if (i + r) % 2 == 0 else pairs[::-1]:
                out.append(runner(p))
        _check_greedy(p, plain, pol, trial.params)
        plain_s, pol_s = [x.stats.total_s for x in plain], [x.stats.total_s for x in pol]
        plain_total, policy_total = plain_total + sum(plain_s), policy_total + sum(pol_s)
        rows.append({"id": p.id, "plain_s": plain_s, "policy_s": pol_s, "tau": pol[0].stats.tau,
                     "new_tokens": len(pol[0].token_ids)})
        running = plain_total / policy_total
        trial.report(running, i)
        _record(trial, rows, running, policy_total, plain_total)
        if trial.should_prune():
            raise optuna.TrialPruned(f"speedup {running:.3f} after {i + 1} prompts is below the median")
    return plain_total / policy_total


def _check_greedy(p: Prompt, plain: list[GenerationResult], pol: list[GenerationResult],
                  params: dict[str, object]) -> None:
    ref = plain[0].token_ids
    for res in plain[1:] + pol:
        if res.token_ids != ref:
            at = next((k for k, (a, b) in enumerate(zip(ref, res.token_ids, strict=False)) if a != b),
                      min(len(ref), len(res.token_ids)))
            raise GreedyMismatchError(
                f"prompt {p.id}: greedy output differs from plain decoding at new token {at} "
                f"(budget {params}); tree decoding must be lossless, so this is a decoder bug: report it")


def _record(trial: Trial, rows: list[dict[str, object]], speedup: float, policy_s: float, plain_s: float) -> None:
    """Measured figures with the trial (also for pruned trials, up to where they stopped)."""
    steps_tau = [float(r["tau"]) for r in rows]  # type: ignore[arg-type]
    tokens = sum(int(r["new_tokens"]) for r in rows)  # type: ignore[call-overload]
    repeats = len(rows[0]["policy_s"])  # type: ignore[arg-type]
    trial.set_user_attr("speedup", speedup)
    trial.set_user_attr("tau", sum(steps_tau) / len(steps_tau))
    trial.set_user_attr("tokens_per_s", tokens * repeats / policy_s)
    trial.set_user_attr("plain_tokens_per_s", tokens * repeats / plain_s)
    trial.set_user_attr("prompts", rows)


def _finalize(storage: optuna.storages.BaseStorage, cfg: TuneConfig, domains: list[str], setup: _Setup,
              wall_s: float, command: str | None) -> Path | None:
    """Best budget per domain -> budgets file; held-out comparison stored with each domain's study."""
    tuned: dict[str, DomainBudget] = {}
    static: dict[str, DomainBudget] = {}
    trials = 0
    for domain in domains:
        study = optuna.load_study(study_name=study_name_for(cfg.study_name, domain), storage=storage)
        fail_stale_trials(study)
        trials += len(study.get_trials(deepcopy=False))
        best = best_trial(study)
        if best is not None:
            tuned[domain] = DomainBudget.model_validate(best.user_attrs["budget"])
        best_static = best_trial(study, family="static")
        static[domain] = (DomainBudget.model_validate(best_static.user_attrs["budget"]) if best_static
                          else DomainBudget(policy="static"))
    if not tuned:
        return None
    path = _write_budgets(cfg, tuned, trials, wall_s, command)
    if cfg.heldout_per_domain > 0:
        bench = _bench_cfg(cfg, cfg.heldout_split, sorted(tuned), cfg.heldout_per_domain)
        results: dict[str, HeldoutResult] = evaluate_heldout(setup.dec, bench, tuned, static, setup.predictor,
                                                             setup.latency)
        for domain, res in results.items():
            study = optuna.load_study(study_name=study_name_for(cfg.study_name, domain), storage=storage)
            study.set_user_attr("heldout", res.model_dump(mode="json"))
    return path


def _write_budgets(cfg: TuneConfig, tuned: dict[str, DomainBudget], trials: int, wall_s: float,
                   command: str | None) -> Path:
    """Merge into an existing file (other domains and its default kept) and record provenance."""
    previous = load_budgets(cfg.budgets_out) if cfg.budgets_out.exists() else None
    kept = sorted(set(previous.domains) - set(tuned)) if previous else []
    notes = f"tuned domains: {', '.join(sorted(tuned))}; split {cfg.split}, {cfg.per_domain} prompts/domain, " \
            f"{cfg.max_new_tokens} new tokens, {cfg.repeats} repeats"
    if kept:
        notes += f"; kept from the previous file: {', '.join(kept)}"
    provenance = Provenance(
        command=command or shlex.join(sys.argv), trials=trials, wall_s=round(wall_s, 1),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"), study_name=cfg.study_name,
        storage=safe_url(cfg.storage), notes=notes,
    )
    budgets = BudgetsFile(default=previous.default if previous else DomainBudget(),
                          domains={**(previous.domains if previous else {}), **tuned}, provenance=provenance)
    return save_budgets(budgets, cfg.budgets_out)

