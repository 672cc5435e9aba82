"""Cross-domain acceptance study: pure statistics over a run's node, step and prompt tables.

Inputs are pyarrow tables (``studies.shared.runs.load_run`` builds them); the output is an
``AcceptanceStudy`` (pydantic, dumps to the ``--json`` contract). Nothing here prints.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from pydantic import BaseModel, ConfigDict

from .claims import SEED, Claim, SeedReference, judge_claims, judged_domains
from .config import StudyConfig
from .results import DomainStats, DomainVsDepth, Rate
from .stats import (
    BootstrapResult,
    Spearman,
    encode,
    fold_of_groups,
    oof_logloss,
    prompt_bootstrap,
    prompt_bootstrap_many,
)

DEFINITIONS: dict[str, str] = {
    "acceptance_rate": "conditional acceptance: share of verified nodes whose token is the target's argmax "
    "at its parent (target_argmax_match), parent accepted or not (the seed's node-level definition)",
    "tau": "mean accepted length, vLLM convention: 1 + accepted draft tokens / steps (bonus token counted)",
    "mean_accepted_length": "E[L]: accepted draft tokens per step without the bonus token (the seed's "
    "figure)",
    "accepted_length_dist": "share of steps accepting 0, 1, 2, ... draft tokens (steps drafting nothing "
    "count as 0)",
    "per_position_acceptance": "vLLM per-position acceptance: share of steps whose accepted path reaches "
    "draft position k = 1..depth (from the step log)",
    "node_utilisation": "accepted draft tokens / verified nodes",
    "target_call_savings": "1 - steps / new tokens: target forward passes saved against one per new token",
    "mean_entropy": "mean draft entropy (nats) of verified nodes",
    "depth_acceptance": "acceptance_rate of the verified nodes at depth d (node level)",
    "depth_acceptance_given_parent": "conditional on the parent being accepted: share of (step, d) where the "
    "accepted node at depth d-1 (the root for d = 1) had verified children and one of them was accepted",
    "depth_on_path": "on-path acceptance: share of steps whose accepted path reaches depth d (from node "
    "rows)",
    "spearman_rho": "Spearman rho(draft entropy, target_argmax_match) over verified nodes, mid-ranks for "
    "ties; 95% CI: percentile bootstrap resampling prompts, not nodes",
    "domain_vs_depth": "out-of-fold log-loss (prompt folds, add-0.5 smoothed rates) of a domain-only and a "
    "depth-only rate model against one global rate; reduction in nats per verified node; CIs resample "
    "prompts",
}


class AcceptanceStudy(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="null")

    run: str
    tree: str
    temperature: float
    definitions: dict[str, str]
    domains: dict[str, DomainStats]
    overall: DomainStats
    domain_vs_depth: DomainVsDepth  # all domains of the run
    domain_vs_depth_seed_domains: DomainVsDepth | None  # the seed's four domains only (claim 1), when they differ
    domain_vs_depth_top1: DomainVsDepth  # rank-0 children only: depth without the 1/width cap of wide levels
    greedy_checked: int
    greedy_mismatches: int
    log_consistency_errors: int  # steps whose on-path node count differs from the step log's accepted
    claims: list[Claim]
    seed: SeedReference
    config: StudyConfig


@dataclass
class Nodes:
    """Node rows as numpy columns; prompt is a code shared with the step table."""

    prompt: np.ndarray
    domain: np.ndarray
    step: np.ndarray
    node_id: np.ndarray
    parent_id: np.ndarray
    depth: np.ndarray
    sibling_rank: np.ndarray
    token_type: np.ndarray
    entropy: np.ndarray
    verified: np.ndarray
    match: np.ndarray
    on_path: np.ndarray
    parent_on_path: np.ndarray

    def subset(self, mask: np.ndarray) -> Nodes:
        return Nodes(**{k: v[mask] for k, v in self.__dict__.items()})


@dataclass
class Steps:
    prompt: np.ndarray
    domain: np.ndarray
    step: np.ndarray
    drafted: np.ndarray
    accepted: np.ndarray
    emitted: np.ndarray

    def subset(self, mask: np.ndarray) -> Steps:
        return Steps(**{k: v[mask] for k, v in self.__dict__.items()})


@dataclass
class Prompts:
    domain: np.ndarray
    total_s: np.ndarray
    new_tokens: np.ndarray
    greedy_checked: np.ndarray
    greedy_match: np.ndarray


def _col(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy(zero_copy_only=False)


def _step_keys(prompt: np.ndarray, step: np.ndarray, n_steps: int) -> np.ndarray:
    return prompt.astype(np.int64) * n_steps + step.astype(np.int64)


@dataclass
class RunArrays:
    nodes: Nodes
    steps: Steps
    prompts: Prompts


def _parent_on_path(keys: np.ndarray, parent_keys: np.ndarray, parent_id: np.ndarray,
                    on_path: np.ndarray) -> np.ndarray:
    """Whether each node's parent is on the accepted path (the root always is)."""
    result = parent_id < 0
    if len(keys):
        order = np.argsort(keys)
        at = np.clip(np.searchsorted(keys[order], parent_keys), 0, len(keys) - 1)
        result |= (keys[order][at] == parent_keys) & on_path[order][at]
    return result


def build_arrays(nodes: pa.Table, steps: pa.Table, prompts: pa.Table) -> RunArrays:
    """Numpy views of the three tables with shared prompt codes and each node's parent state."""
    node_pid, step_pid = _col(nodes, "prompt_id").astype(str), _col(steps, "prompt_id").astype(str)
    book = np.unique(np.concatenate([node_pid, step_pid]))
    node_step, step_step = _col(nodes, "step").astype(np.int64), _col(steps, "step").astype(np.int64)
    n_steps = int(max(node_step.max(initial=0), step_step.max(initial=0))) + 1
    node_id, parent_id = _col(nodes, "node_id").astype(np.int64), _col(nodes, "parent_id").astype(np.int64)
    width = int(node_id.max(initial=0)) + 2
    base = _step_keys(np.searchsorted(book, node_pid), node_step, n_steps) * width
    on_path = _col(nodes, "on_accepted_path").astype(bool)
    node_arrays = Nodes(
        prompt=np.searchsorted(book, node_pid), domain=_col(nodes, "domain").astype(str), step=node_step,
        node_id=node_id, parent_id=parent_id, depth=_col(nodes, "depth").astype(np.int64),
        sibling_rank=_col(nodes, "sibling_rank").astype(np.int64),
        token_type=_col(nodes, "token_type").astype(str),
        entropy=_col(nodes, "draft_entropy").astype(np.float64),
        verified=_col(nodes, "verified").astype(bool),
        match=_col(nodes, "target_argmax_match").astype(bool), on_path=on_path,
        parent_on_path=_parent_on_path(base + node_id + 1, base + parent_id + 1, parent_id, on_path),
    )
    step_arrays = Steps(
        prompt=np.searchsorted(book, step_pid), domain=_col(steps, "domain").astype(str), step=step_step,
        drafted=_col(steps, "drafted").astype(np.int64), accepted=_col(steps, "accepted").astype(np.int64),
        emitted=_col(steps, "emitted").astype(np.int64),
    )
    checked = _col(prompts, "greedy_checked").astype(bool)
    matched = [bool(m) if c else True for m, c in zip(_col(prompts, "greedy_match"), checked, strict=True)]
    prompt_arrays = Prompts(
        domain=_col(prompts, "domain").astype(str), total_s=_col(prompts, "total_s").astype(np.float64),
        new_tokens=_col(prompts, "new_tokens").astype(np.int64), greedy_checked=checked,
        greedy_match=np.array(matched, dtype=bool),
    )
    return RunArrays(node_arrays, step_arrays, prompt_arrays)


def _ratio(num: float, den: float) -> float:
    return float(num / den) if den else float("nan")


def _rates(keys: np.ndarray, match: np.ndarray) -> list[Rate]:
    out = []
    for key in np.unique(keys):
        sel = keys == key
        n, k = int(sel.sum()), int(match[sel].sum())
        out.append(Rate(key=str(key), nodes=n, accepted=k, rate=_ratio(k, n)))
    return out


def _depth_curves(nodes: Nodes, n_steps: int, max_depth: int) -> dict[str, list]:
    """Node-level, given-parent and on-path acceptance for depths 1..max_depth."""
    v = nodes.subset(nodes.verified)
    tried = v.subset(v.parent_on_path)
    width = int(nodes.node_id.max(initial=0)) + 2
    n_steps_max = int(tried.step.max(initial=0)) + 1
    trial = _step_keys(tried.prompt, tried.step, n_steps_max) * width + tried.parent_id + 1
    uniq, inv = np.unique(trial, return_inverse=True)
    success = np.bincount(inv.reshape(-1), tried.on_path, len(uniq)) > 0
    trial_depth = np.zeros(len(uniq), np.int64)
    trial_depth[inv.reshape(-1)] = tried.depth
    curves: dict[str, list] = {"n": [], "node": [], "given": [], "path": []}
    for d in range(1, max_depth + 1):
        at = v.depth == d
        curves["n"].append(int(at.sum()))
        curves["node"].append(_ratio(v.match[at].sum(), at.sum()))
        curves["given"].append(_ratio(success[trial_depth == d].sum(), (trial_depth == d).sum()))
        curves["path"].append(_ratio((v.on_path & at).sum(), n_steps))
    return curves


def _spearman_ci(v: Nodes, config: StudyConfig) -> BootstrapResult:
    ok = np.isfinite(v.entropy)
    if ok.sum() < 2:
        return BootstrapResult(float("nan"), float("nan"), float("nan"), 0, 0)
    rho = Spearman(v.entropy[ok], v.match[ok].astype(np.float64))
    return prompt_bootstrap(encode(v.prompt[ok]).codes, rho, config.bootstrap_reps, config.seed)


def domain_stats(
    nodes: Nodes, steps: Steps, prompts: Prompts, max_depth: int, edges: np.ndarray, config: StudyConfig
) -> DomainStats:
    v = nodes.subset(nodes.verified)
    n_steps, accepted, new_tokens = len(steps.step), int(steps.accepted.sum()), int(steps.emitted.sum())
    lengths = np.bincount(steps.accepted, minlength=max_depth + 1)
    reach = [_ratio((steps.accepted >= k).sum(), n_steps) for k in range(1, max_depth + 1)]
    curves = _depth_curves(nodes, n_steps, max_depth)
    rho = _spearman_ci(v, config)
    bins = np.clip(np.searchsorted(edges, v.entropy, side="right") - 1, 0, max(len(edges) - 2, 0))
    bin_names = np.array([f"{i:02d}:{edges[i]:.3f}-{edges[i + 1]:.3f}" for i in range(len(edges) - 1)])
    return DomainStats(
        prompts=len(np.unique(steps.prompt)), steps=n_steps, new_tokens=new_tokens,
        drafted_nodes=len(nodes.step), verified_nodes=len(v.step), accepted_tokens=accepted,
        acceptance_rate=_ratio(v.match.sum(), len(v.match)),
        tau=1.0 + _ratio(accepted, n_steps), mean_accepted_length=_ratio(accepted, n_steps),
        accepted_length_dist=[_ratio(c, n_steps) for c in lengths],
        per_position_acceptance=reach, node_utilisation=_ratio(accepted, len(v.step)),
        target_call_savings=1.0 - _ratio(n_steps, new_tokens),
        mean_entropy=float(np.nanmean(v.entropy)) if len(v.entropy) else float("nan"),
        tokens_per_s=_ratio(prompts.new_tokens.sum(), prompts.total_s.sum()),
        depth_nodes=curves["n"], depth_acceptance=curves["node"],
        depth_acceptance_given_parent=curves["given"], depth_on_path=curves["path"],
        spearman_rho=rho.estimate, spearman_ci95=[rho.ci_low, rho.ci_high],
        by_sibling_rank=_rates(v.sibling_rank, v.match), by_token_type=_rates(v.token_type, v.match),
        by_entropy_bin=_rates(bin_names[bins], v.match) if len(bin_names) else [],
    )


def domain_vs_depth(nodes: Nodes, config: StudyConfig) -> DomainVsDepth:
    """Which factor explains acceptance more: out-of-fold log-loss reduction, prompt bootstrap."""
    v = nodes.subset(nodes.verified)
    y = v.match.astype(np.float64)
    prompts = encode(v.prompt).codes
    n_prompts = int(prompts.max(initial=-1)) + 1
    fold = fold_of_groups(n_prompts, config.folds, config.seed)[prompts] if n_prompts else prompts
    zero, dom, dep = np.zeros(len(y), np.int64), encode(v.domain).codes, encode(v.depth).codes

    def stat(w: np.ndarray) -> np.ndarray:
        base = oof_logloss(y, zero, fold, w)
        d_dom, d_dep = base - oof_logloss(y, dom, fold, w), base - oof_logloss(y, dep, fold, w)
        return np.array([base, d_dom, d_dep, d_dom - d_dep])

    if len(y) == 0:
        nan = float("nan")
        return DomainVsDepth(method=DEFINITIONS["domain_vs_depth"], domains=[], nodes=0, prompts=0,
                             baseline_logloss=nan,
                             domain_reduction=nan, domain_ci95=[nan, nan], depth_reduction=nan,
                             depth_ci95=[nan, nan], difference=nan, difference_ci95=[nan, nan],
                             stronger="inconclusive")
    base, d_dom, d_dep, diff = prompt_bootstrap_many(prompts, stat, config.bootstrap_reps, config.seed)
    stronger = "domain" if diff.ci_low > 0 else "depth" if diff.ci_high < 0 else "inconclusive"
    return DomainVsDepth(
        method=DEFINITIONS["domain_vs_depth"], domains=sorted(set(v.domain.tolist())), nodes=len(y),
        prompts=n_prompts,
        baseline_logloss=base.estimate,
        domain_reduction=d_dom.estimate, domain_ci95=[d_dom.ci_low, d_dom.ci_high],
        depth_reduction=d_dep.estimate, depth_ci95=[d_dep.ci_low, d_dep.ci_high],
        difference=diff.estimate, difference_ci95=[diff.ci_low, diff.ci_high], stronger=stronger,
    )


def _log_consistency_errors(nodes: Nodes, steps: Steps) -> int:
    n = int(max(nodes.step.max(initial=0), steps.step.max(initial=0))) + 1
    node_keys = _step_keys(nodes.prompt[nodes.on_path], nodes.step[nodes.on_path], n)
    uniq, counts = np.unique(node_keys, return_counts=True)
    step_keys = _step_keys(steps.prompt, steps.step, n)
    at = np.clip(np.searchsorted(uniq, step_keys), 0, max(len(uniq) - 1, 0))
    on_path = np.where(uniq[at] == step_keys, counts[at], 0) if len(uniq) else np.zeros(len(step_keys), int)
    orphan = len(uniq) - int(np.isin(uniq, step_keys).sum())
    return int((on_path != steps.accepted).sum()) + orphan


def analyze(
    nodes: pa.Table, steps: pa.Table, prompts: pa.Table, config: StudyConfig | None = None,
    run: str = "", tree: str = "", temperature: float = 0.0,
) -> AcceptanceStudy:
    """The whole study of one run (all shards concatenated)."""
    config = config or StudyConfig()
    arrays = build_arrays(nodes, steps, prompts)
    n, s, p = arrays.nodes, arrays.steps, arrays.prompts
    max_depth = int(max(n.depth.max(initial=0), s.accepted.max(initial=0)))
    ent = n.entropy[n.verified & np.isfinite(n.entropy)]
    quantiles = np.linspace(0, 1, config.entropy_bins + 1)
    edges = np.unique(np.quantile(ent, quantiles)) if len(ent) else np.zeros(0)
    domains = {
        d: domain_stats(
            n.subset(n.domain == d), s.subset(s.domain == d),
            Prompts(**{k: a[p.domain == d] for k, a in p.__dict__.items()}), max_depth, edges, config,
        )
        for d in np.unique(s.domain).tolist()
    }
    overall = domain_stats(n, s, p, max_depth, edges, config)
    dvd = domain_vs_depth(n, config)
    seed_domains = judged_domains(domains, SEED)
    dvd_seed = None
    if set(seed_domains) != set(domains):
        dvd_seed = domain_vs_depth(n.subset(np.isin(n.domain, seed_domains)), config)
    return AcceptanceStudy(
        run=run, tree=tree, temperature=temperature, definitions=DEFINITIONS, domains=domains,
        overall=overall, domain_vs_depth=dvd, domain_vs_depth_seed_domains=dvd_seed,
        domain_vs_depth_top1=domain_vs_depth(n.subset(n.sibling_rank == 0), config),
        greedy_checked=int(p.greedy_checked.sum()),
        greedy_mismatches=int((p.greedy_checked & ~p.greedy_match).sum()),
        log_consistency_errors=_log_consistency_errors(n, s),
        claims=judge_claims(domains, dvd_seed or dvd, SEED), seed=SEED, config=config,
    )
