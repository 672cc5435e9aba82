"""Tau per verified node at equal budgets: every sweep policy capped at each budget, against plain decoding.

The rows run through the bench's timed machinery (``studies.shared.measure``): the same prompts, interleaved
prompt by prompt in a row order shuffled per prompt and repeat, every greedy output checked against plain decoding.
Per (policy, budget) the result holds tau, verified and drafted nodes per step, tokens/s and mismatches,
and, per learned policy and budget, its tau gain over the baseline (the confidence tree) against the target.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from treewise.controller import (
    AcceptanceModel,
    BudgetsFile,
    ConfidenceTree,
    DomainBudget,
    LatencyProfile,
    LearnedRerank,
    LearnedTree,
)
from treewise.controller.pairs import pair_files
from treewise.decoder import TreeDecoder, TreePolicy
from treewise.predictor.online import OnlineConfig
from treewise.studies.shared.config import BenchConfig
from treewise.studies.shared.measure import (
    PLAIN,
    Metrics,
    RowResult,
    load_bench_decoder,
    measure,
    select_prompts,
    summarize,
)

from .sweep_config import SweepConfig

TOLERANCE = 1e-9  # a gain equal to the target meets it


class SweepRow(RowResult):
    """One policy at one budget (``spec`` says how it was built)."""

    policy: str
    budget: int


class TargetCheck(BaseModel):
    """A learned policy's tau against the baseline's at one budget: ``gain`` = tau / baseline tau - 1."""

    policy: str
    budget: int
    baseline_tau: float
    tau: float
    gain: float
    required_gain: float
    met: bool


class PredictorInfo(BaseModel):
    path: str
    model_sha256: str | None  # of the LightGBM model file; None for an in-process predictor


class SweepResult(BaseModel):
    config: SweepConfig
    plain: Metrics
    rows: list[SweepRow]
    checks: list[TargetCheck]
    predictor: PredictorInfo | None  # None when no learned policy ran
    environment: dict[str, str]
    wall_s: float

    def row(self, policy: str, budget: int) -> SweepRow:
        return next(r for r in self.rows if r.policy == policy and r.budget == budget)

    @property
    def targets_met(self) -> bool:
        """Every check of the configured learned selection met."""
        return all(c.met for c in self.checks if c.policy == self.config.learned_selection)


def bench_config(cfg: SweepConfig) -> BenchConfig:
    """The bench settings the sweep's rows share (prompts, tokens, repeats, pair); no tree rows, no HF row."""
    return BenchConfig(suite=cfg.suite, split=cfg.split, domains=cfg.domains, per_domain=cfg.per_domain,
                       max_new_tokens=cfg.max_new_tokens, repeats=cfg.repeats, trees={}, hf_assisted=False,
                       pair=cfg.pair, target=cfg.target, draft=cfg.draft)


def predictor_dir(cfg: SweepConfig) -> Path:
    return cfg.predictor if cfg.predictor is not None else pair_files(cfg.pair).predictor


def load_predictor(cfg: SweepConfig) -> tuple[AcceptanceModel, PredictorInfo]:
    from treewise.predictor import AcceptancePredictor
    from treewise.predictor.model import MODEL_FILE

    folder = predictor_dir(cfg)
    model = AcceptancePredictor.load(folder)
    digest = hashlib.sha256((folder / MODEL_FILE).read_bytes()).hexdigest()
    return model, PredictorInfo(path=str(folder), model_sha256=digest)


def build_policy(cfg: SweepConfig, policy: str, budget: int, predictor: AcceptanceModel | None,
                 latency: LatencyProfile | None) -> tuple[TreePolicy, str]:
    """One sweep policy capped at ``budget`` verified nodes, and a spec string saying how it was built."""
    online = OnlineConfig() if cfg.online else None
    size = f"budget={budget},max_depth={cfg.max_depth},top_k={cfg.top_k}"
    if policy == "confidence":
        return ConfidenceTree(budget, cfg.max_depth, cfg.top_k), f"confidence:{size}"
    if predictor is None:
        raise ValueError(f"sweep policy {policy!r} needs a predictor")
    if policy == "rerank":
        return LearnedRerank(predictor, budget, cfg.max_depth, cfg.top_k, online), f"rerank:{size},online={cfg.online}"
    fill = policy == "learned_fill"
    extra = {"threshold": 0.0, "cost_scale": 0.0} if fill else {}
    cap = DomainBudget(policy="learned", node_budget=budget, max_depth=cfg.max_depth, max_width=cfg.top_k, **extra)
    tree = LearnedTree(predictor, BudgetsFile(default=cap), None if fill else latency, None, online=online)
    fields = ",".join(f"{k}={v}" for k, v in cap.model_dump().items() if k != "policy")
    lat = "off" if tree.latency is None else "data/latency.json"
    return tree, f"learned:{fields},latency={lat},online={cfg.online}"


def _checks(cfg: SweepConfig, rows: list[SweepRow]) -> list[TargetCheck]:
    base = {r.budget: r.tau for r in rows if r.policy == cfg.baseline and r.tau}
    out = []
    for r in rows:
        if r.policy == cfg.baseline or r.budget not in base or r.tau is None:
            continue
        gain = r.tau / base[r.budget] - 1
        need = cfg.target_gain.get(r.budget, 0.0)
        out.append(TargetCheck(policy=r.policy, budget=r.budget, baseline_tau=base[r.budget], tau=r.tau, gain=gain,
                               required_gain=need, met=gain >= need - TOLERANCE))
    return out


def run_sweep(cfg: SweepConfig, dec: TreeDecoder | None = None, predictor: AcceptanceModel | None = None,
              on_progress: Callable[[], None] | None = None) -> SweepResult:
    """Measure every (policy, budget) row of ``cfg`` and plain decoding on the same prompts.

    ``predictor``: an acceptance model to use instead of loading ``cfg.predictor`` (tests); ``dec``: a loaded
    pair instead of ``cfg.target``/``cfg.draft``.
    """
    bench = bench_config(cfg)
    prompts = select_prompts(bench)
    dec = dec or load_bench_decoder(bench)
    info: PredictorInfo | None = None
    if predictor is None and set(cfg.policies) != {"confidence"}:
        predictor, info = load_predictor(cfg)
    elif predictor is not None:
        info = PredictorInfo(path=type(predictor).__name__, model_sha256=None)
    lat_file = pair_files(cfg.pair).latency
    latency = LatencyProfile.read(lat_file) if lat_file.exists() else None
    runners = {PLAIN: lambda p: dec.generate_plain(p.prompt, cfg.max_new_tokens)}
    specs: dict[str, str] = {}
    for budget in cfg.budgets:
        for policy in cfg.policies:
            tree, spec = build_policy(cfg, policy, budget, predictor, latency)
            key = f"{policy}/{budget}"
            runners[key] = (lambda pol: lambda p: dec.generate(p.prompt, cfg.max_new_tokens, tree=pol,
                                                               domain=p.domain, prompt_id=p.id))(tree)
            specs[key] = spec
    t0 = time.perf_counter()
    runs = measure(runners, prompts, cfg.repeats, on_progress)
    bench_result = summarize(runs, specs, prompts, bench, time.perf_counter() - t0)
    rows = []
    for key, row in bench_result.policies.items():
        if key != PLAIN:
            policy, budget = key.rsplit("/", 1)
            rows.append(SweepRow(**row.model_dump(), policy=policy, budget=int(budget)))
    plain = Metrics(**bench_result.policies[PLAIN].model_dump(exclude={"spec", "per_domain"}))
    return SweepResult(config=cfg, plain=plain, rows=rows, checks=_checks(cfg, rows), predictor=info,
                       environment=bench_result.environment, wall_s=bench_result.wall_s)
