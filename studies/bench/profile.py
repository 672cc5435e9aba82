"""``treewise profile``: where one decode step's time goes, stage by stage, for each tree policy.

Each solo step is timed by the decoder itself (``decoder.StageTimes``: model calls apart from their masks,
drafting bookkeeping, the policy, verification, settling, cache compaction); a policy holding a predictor
gets it wrapped in a timer, so the predictor's share of the policy is known. Policies are interleaved
prompt by prompt after one warm-up prompt each, as in the bench.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

import numpy as np
import torch
from pydantic import BaseModel

from treewise.decoder import GenerationResult, StageTimes, TreeDecoder
from treewise.studies.shared.config import BenchConfig, ProfileConfig
from treewise.studies.shared.measure import load_bench_decoder, select_prompts
from treewise.studies.shared.suites import Prompt
from treewise.studies.shared.treespec import build_tree

# Display order; "predictor" is the part of "policy" spent in the predictor's predict_batch / predict_prefix.
STAGES = ("draft_model", "target_model", "masks", "drafting", "policy", "predictor", "verify", "settle",
          "commit", "other")
MODEL_STAGES = ("draft_model", "target_model")


class StageShare(BaseModel):
    ms_per_step: float
    share: float  # of the whole step


class PolicyProfile(BaseModel):
    spec: str
    steps: int
    new_tokens: int
    tau: float
    verified_per_step: float
    drafted_per_step: float
    ms_per_step: float
    tokens_per_s: float  # tokens over the summed step times (no prompt prefill outside steps)
    stages: dict[str, StageShare]
    outside_forwards_share: float  # everything but the two models' calls
    policy_ms_per_step: float  # policy + predictor
    predictor_backend: str | None = None  # e.g. "numba" or "lightgbm" (AcceptancePredictor.backend)


class ProfileResult(BaseModel):
    config: ProfileConfig
    prompts: int
    policies: dict[str, PolicyProfile]
    environment: dict[str, str]
    wall_s: float


class _TimedPredictor:
    """Forwards to a predictor and adds up the time of its ``predict_batch`` calls (policies with predictors
    take a timer in place of their own: the wrapper must not change which path they choose)."""

    def __init__(self, inner: object) -> None:
        self.inner, self.seconds, self.calls = inner, 0.0, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        return self._timed(self.inner.predict_batch, features)  # type: ignore[attr-defined]

    def _timed(self, call: Callable[..., np.ndarray], *args: object) -> np.ndarray:
        t0 = time.perf_counter()
        out = call(*args)
        self.seconds += time.perf_counter() - t0
        self.calls += 1
        return out


class _TimedMatrixPredictor(_TimedPredictor):
    """The same for a predictor that also scores encoded rows (``controller.features``): that path is timed."""

    def predict_prefix(self, x: np.ndarray, n: int) -> np.ndarray:
        return self._timed(self.inner.predict_prefix, x, n)  # type: ignore[attr-defined]


@dataclass
class _Row:
    spec: str
    run: Callable[[Prompt], GenerationResult]
    timer: _TimedPredictor | None
    results: list[GenerationResult]
    policy: object = None


def _rows(dec: TreeDecoder, cfg: ProfileConfig) -> dict[str, _Row]:
    rows = {}
    for name, spec in cfg.trees.items():
        policy = build_tree(spec, cfg.pair)
        timer = None
        if hasattr(policy, "predictor"):
            timed = _TimedMatrixPredictor if hasattr(policy.predictor, "predict_prefix") else _TimedPredictor
            timer = timed(policy.predictor)
            policy.predictor = timer  # type: ignore[attr-defined]
        run = (lambda pol: lambda p: dec.generate(p.prompt, cfg.max_new_tokens, tree=pol, domain=p.domain,
                                                  prompt_id=p.id))(policy)
        rows[name] = _Row(spec, run, timer, [], policy)
    return rows


def _summary(row: _Row) -> PolicyProfile:
    steps = [s for r in row.results for s in r.stats.steps]
    n = max(len(steps), 1)
    tot: dict[str, float] = {f.name: sum(getattr(s.stages, f.name) for s in steps if s.stages is not None)
                             for f in fields(StageTimes)}
    tot["other"] = sum(s.stages.other for s in steps if s.stages is not None)
    tot["predictor"] = row.timer.seconds if row.timer is not None else 0.0
    tot["policy"] -= tot["predictor"]
    total = tot.pop("total") or 1e-12
    stages = {k: StageShare(ms_per_step=1000 * tot[k] / n, share=tot[k] / total) for k in STAGES}
    tokens = sum(s.emitted for s in steps)
    return PolicyProfile(
        spec=row.spec, steps=len(steps), new_tokens=tokens,
        tau=1 + sum(s.accepted for s in steps) / n, verified_per_step=sum(s.verified for s in steps) / n,
        drafted_per_step=sum(s.drafted for s in steps) / n, ms_per_step=1000 * total / n,
        tokens_per_s=tokens / total, stages=stages,
        outside_forwards_share=1 - sum(tot[k] for k in MODEL_STAGES) / total,
        policy_ms_per_step=1000 * (tot["policy"] + tot["predictor"]) / n,
        predictor_backend=_backend(row),
    )


def _backend(row: _Row) -> str | None:
    """The predictor's backend; "... in the native level" when it ran inside the policy's one native call per
    level (controller.level), whose time the policy stage holds (the predictor stage is then 0)."""
    backend = getattr(row.timer.inner, "backend", None) if row.timer is not None else None
    if backend is not None and getattr(row.policy, "native_level", False):
        return f"{backend} in the native level"
    return backend


def run_profile(cfg: ProfileConfig, dec: TreeDecoder | None = None,
                on_progress: Callable[[], None] | None = None) -> ProfileResult:
    bench_cfg = BenchConfig(suite=cfg.suite, split=cfg.split, domains=cfg.domains, per_domain=cfg.per_domain,
                            pair=cfg.pair, target=cfg.target, draft=cfg.draft)
    prompts = select_prompts(bench_cfg)
    dec = dec or load_bench_decoder(bench_cfg)
    rows = _rows(dec, cfg)
    for row in rows.values():  # warm-up, not counted
        row.run(prompts[0])
        if row.timer is not None:
            row.timer.seconds, row.timer.calls = 0.0, 0
    t0 = time.perf_counter()
    for p in prompts:
        for row in rows.values():
            row.results.append(row.run(p))
        if on_progress is not None:
            on_progress()
    env = {"torch": torch.__version__, "python": platform.python_version(), "threads": str(torch.get_num_threads()),
           "machine": platform.machine()}
    return ProfileResult(config=cfg, prompts=len(prompts), policies={k: _summary(r) for k, r in rows.items()},
                         environment=env, wall_s=time.perf_counter() - t0)
