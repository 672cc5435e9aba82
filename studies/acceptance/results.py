"""The study's per-domain figures, as typed results: what ``study`` computes and ``claims`` judges.

Here, below both, so the two import them one way (they used to import each other).
"""

from __future__ import annotations

from pydantic import BaseModel


class Rate(BaseModel):
    key: str
    nodes: int
    accepted: int
    rate: float


class DomainStats(BaseModel):
    prompts: int
    steps: int
    new_tokens: int
    drafted_nodes: int
    verified_nodes: int
    accepted_tokens: int
    acceptance_rate: float
    tau: float
    mean_accepted_length: float
    accepted_length_dist: list[float]
    per_position_acceptance: list[float]
    node_utilisation: float
    target_call_savings: float
    mean_entropy: float
    tokens_per_s: float
    depth_nodes: list[int]
    depth_acceptance: list[float]
    depth_acceptance_given_parent: list[float]
    depth_on_path: list[float]
    spearman_rho: float
    spearman_ci95: list[float]
    by_sibling_rank: list[Rate]
    by_token_type: list[Rate]
    by_entropy_bin: list[Rate]


class DomainVsDepth(BaseModel):
    method: str
    domains: list[str]
    nodes: int
    prompts: int
    baseline_logloss: float
    domain_reduction: float
    domain_ci95: list[float]
    depth_reduction: float
    depth_ci95: list[float]
    difference: float  # domain_reduction - depth_reduction
    difference_ci95: list[float]
    stronger: str  # "domain", "depth" or "inconclusive" (CI of the difference covers 0)
