"""The seed study's figures and claims (arXiv 2604.14682), judged against a measured run."""

from __future__ import annotations

import math

from pydantic import BaseModel

from .results import DomainStats, DomainVsDepth


class SeedReference(BaseModel):
    source: str
    pair: str
    tree: str
    nodes: int
    prompts: int
    acceptance: dict[str, float]  # seed domain -> conditional acceptance
    domain_map: dict[str, str]  # seed domain -> treewise suite domain
    rho_range: list[float]
    claims: list[str]


class Claim(BaseModel):
    id: int
    claim: str
    holds: bool
    evidence: str
    domains: list[str]  # the treewise domains the claim was judged on


SEED = SeedReference(
    source="arXiv 2604.14682",
    pair="TinyLlama-1.1B -> Llama-2-7B-Chat-GPTQ",
    tree="static depth 3 x width 2, greedy",
    nodes=99_768,
    prompts=200,
    acceptance={"chat": 0.565, "code": 0.538, "reasoning": 0.532, "math": 0.518},
    domain_map={"chat": "dialogue", "code": "code", "reasoning": "logic", "math": "math"},
    rho_range=[-0.20, -0.15],
    claims=[
        "task type predicts acceptance better than tree depth",
        "chat is the only domain whose expected accepted length exceeds 1.0 per step",
        "chat has the highest draft entropy yet the highest acceptance",
        "Spearman rho(entropy, acceptance) lies in [-0.20, -0.15] in every domain",
    ],
)


def _fmt(x: float | None) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{x:.3f}"


def judged_domains(domains: dict[str, DomainStats], seed: SeedReference) -> list[str]:
    """The seed's domains present in this run; all domains when fewer than two of them are."""
    mapped = [d for d in seed.domain_map.values() if d in domains]
    return mapped if len(mapped) >= 2 else sorted(domains)


def _claim_domain_vs_depth(dvd: DomainVsDepth, seed: SeedReference) -> Claim:
    lo, hi = dvd.difference_ci95
    holds = dvd.stronger == "domain"
    evidence = (
        f"out-of-fold log-loss reduction over a global rate, nats per verified node: domain-only "
        f"{dvd.domain_reduction:.5f} [{_fmt(dvd.domain_ci95[0])}, {_fmt(dvd.domain_ci95[1])}], depth-only "
        f"{dvd.depth_reduction:.5f} [{_fmt(dvd.depth_ci95[0])}, {_fmt(dvd.depth_ci95[1])}]; "
        f"difference {dvd.difference:.5f}, prompt-bootstrap 95% CI [{lo:.5f}, {hi:.5f}] -> {dvd.stronger}"
    )
    return Claim(id=1, claim=seed.claims[0], holds=holds, evidence=evidence, domains=dvd.domains)


def _chat(seed: SeedReference) -> str:
    return seed.domain_map["chat"]


def _claim_only_chat_above_one(
    domains: dict[str, DomainStats], names: list[str], seed: SeedReference
) -> Claim:
    chat = _chat(seed)
    above = [d for d in names if domains[d].mean_accepted_length > 1.0]
    holds = chat in domains and above == [chat]
    listing = ", ".join(f"{d} {domains[d].mean_accepted_length:.3f}" for d in names)
    evidence = f"E[L] (accepted draft tokens per step, no bonus): {listing}; above 1.0: {above or 'none'}"
    if chat not in domains:
        evidence += f"; no {chat!r} domain (the seed's chat) in this run"
    return Claim(id=2, claim=seed.claims[1], holds=holds, evidence=evidence, domains=names)


def _claim_chat_entropy_and_acceptance(
    domains: dict[str, DomainStats], names: list[str], seed: SeedReference
) -> Claim:
    chat = _chat(seed)
    top_entropy = max(names, key=lambda d: domains[d].mean_entropy)
    top_accept = max(names, key=lambda d: domains[d].acceptance_rate)
    holds = chat in domains and top_entropy == chat and top_accept == chat
    listing = "; ".join(
        f"{d}: entropy {_fmt(domains[d].mean_entropy)}, acceptance {_fmt(domains[d].acceptance_rate)}"
        for d in names
    )
    evidence = f"{listing}; highest entropy {top_entropy}, highest acceptance {top_accept}"
    return Claim(id=3, claim=seed.claims[2], holds=holds, evidence=evidence, domains=names)


def _claim_rho_range(domains: dict[str, DomainStats], names: list[str], seed: SeedReference) -> Claim:
    lo, hi = seed.rho_range
    inside = [d for d in names if lo <= domains[d].spearman_rho <= hi]
    holds = len(inside) == len(names) and bool(names)
    listing = "; ".join(
        f"{d}: {_fmt(domains[d].spearman_rho)} [{_fmt(domains[d].spearman_ci95[0])}, "
        f"{_fmt(domains[d].spearman_ci95[1])}]" for d in names
    )
    evidence = f"rho [95% CI]: {listing}; point estimate in [{lo}, {hi}]: {inside or 'none'}"
    return Claim(id=4, claim=seed.claims[3], holds=holds, evidence=evidence, domains=names)


def judge_claims(domains: dict[str, DomainStats], dvd: DomainVsDepth, seed: SeedReference) -> list[Claim]:
    """One verdict per seed claim, with the numbers it rests on; ``dvd`` is fit on the judged domains."""
    if not domains:
        return [Claim(id=i + 1, claim=c, holds=False, evidence="no data", domains=[])
                for i, c in enumerate(seed.claims)]
    names = judged_domains(domains, seed)
    return [
        _claim_domain_vs_depth(dvd, seed),
        _claim_only_chat_above_one(domains, names, seed),
        _claim_chat_entropy_and_acceptance(domains, names, seed),
        _claim_rho_range(domains, names, seed),
    ]
