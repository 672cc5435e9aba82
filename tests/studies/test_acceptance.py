"""Acceptance statistics on small synthetic logs whose answers are known."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from treewise.decoder.records.nodelog import SCHEMA
from treewise.studies.acceptance.claims import SEED, judge_claims
from treewise.studies.acceptance.results import DomainStats, DomainVsDepth
from treewise.studies.acceptance.stats import (
    RankPlan,
    encode,
    fold_of_groups,
    oof_logloss,
    prompt_bootstrap,
    spearman,
)
from treewise.studies.acceptance.study import StudyConfig, analyze

FAST = StudyConfig(bootstrap_reps=200, seed=0)


def node_table(rows: list[dict]) -> pa.Table:
    """Full-schema node rows; columns a test does not set get neutral values."""
    defaults = {
        "run_id": "r", "token_id": 5, "token_type": "word_start", "draft_logprob": -1.0, "draft_entropy": 1.0,
        "draft_margin": 0.1, "path_logprob": -1.0, "parent_draft_prob": 1.0, "position": 0, "prompt_len": 4,
        "running_accept_rate": float("nan"), "prev_accepted": -1, "temperature": 0.0, "target_prob": 0.5,
        "accept_prob": float("nan"), "sibling_rank": 0, "verified": True, "on_accepted_path": False,
    }
    full = [defaults | r for r in rows]
    return pa.Table.from_pylist(full, schema=SCHEMA)


def step_table(rows: list[tuple[str, str, int, int, int, int]]) -> pa.Table:
    names = ("prompt_id", "domain", "step", "drafted", "accepted", "emitted")
    return pa.Table.from_pylist([dict(zip(names, r, strict=True)) for r in rows])


def prompt_table(rows: list[tuple[str, str, int, bool, bool | None]]) -> pa.Table:
    names = ("prompt_id", "domain", "new_tokens", "greedy_checked", "greedy_match")
    return pa.Table.from_pylist([dict(zip(names, r, strict=True)) | {"total_s": 1.0} for r in rows])


def node(pid: str, dom: str, step: int, nid: int, parent: int, depth: int, match: bool, path: bool = False,
         rank: int = 0, verified: bool = True, entropy: float = 1.0) -> dict:
    return {"prompt_id": pid, "domain": dom, "step": step, "node_id": nid, "parent_id": parent, "depth": depth,
            "target_argmax_match": match, "on_accepted_path": path, "sibling_rank": rank, "verified": verified,
            "draft_entropy": entropy}


def hand_run() -> tuple[pa.Table, pa.Table, pa.Table]:
    """Domain A: width-2 depth-2 trees over 3 steps (the last drafts nothing); domain B: a chain."""
    a = [
        node("a1", "A", 0, 0, -1, 1, True, True, 0), node("a1", "A", 0, 1, -1, 1, False, rank=1),
        node("a1", "A", 0, 2, 0, 2, True, True, 0), node("a1", "A", 0, 3, 0, 2, False, rank=1),
        node("a1", "A", 0, 4, 1, 2, True, verified=False),  # drafted, never verified: ignored
        node("a1", "A", 1, 0, -1, 1, False, rank=0), node("a1", "A", 1, 1, -1, 1, False, rank=1),
        node("a1", "A", 1, 2, 0, 2, True, rank=0), node("a1", "A", 1, 3, 1, 2, False, rank=0),
    ]
    b = [node("b1", "B", 0, 0, -1, 1, True, True), node("b1", "B", 1, 0, -1, 1, True, True),
         node("b1", "B", 1, 1, 0, 2, True, True)]
    steps = step_table([("a1", "A", 0, 5, 2, 3), ("a1", "A", 1, 4, 0, 1), ("a1", "A", 2, 0, 0, 1),
                        ("b1", "B", 0, 1, 1, 2), ("b1", "B", 1, 2, 2, 3)])
    prompts = prompt_table([("a1", "A", 5, True, True), ("b1", "B", 5, True, False)])
    return node_table(a + b), steps, prompts


def test_hand_built_run_known_answers():
    study = analyze(*hand_run(), config=FAST)
    a, b = study.domains["A"], study.domains["B"]
    assert (a.prompts, a.steps, a.drafted_nodes, a.verified_nodes, a.accepted_tokens) == (1, 3, 9, 8, 2)
    assert a.acceptance_rate == pytest.approx(3 / 8)
    assert a.tau == pytest.approx(1 + 2 / 3) and a.mean_accepted_length == pytest.approx(2 / 3)
    assert a.accepted_length_dist == pytest.approx([2 / 3, 0, 1 / 3])
    assert a.per_position_acceptance == pytest.approx([1 / 3, 1 / 3])
    assert a.node_utilisation == pytest.approx(2 / 8)
    assert a.target_call_savings == pytest.approx(1 - 3 / 5)
    assert a.depth_acceptance == pytest.approx([1 / 4, 2 / 4])
    # depth 1: two steps had root children, one accepted; depth 2: only step 0 had an accepted parent.
    assert a.depth_acceptance_given_parent == pytest.approx([1 / 2, 1.0])
    assert a.depth_on_path == pytest.approx([1 / 3, 1 / 3])
    ranks = {r.key: (r.nodes, r.accepted) for r in a.by_sibling_rank}
    assert ranks == {"0": (5, 3), "1": (3, 0)}
    assert b.acceptance_rate == 1.0 and b.tau == pytest.approx(2.5)
    assert study.overall.steps == 5 and study.overall.acceptance_rate == pytest.approx(6 / 11)
    assert study.greedy_checked == 2 and study.greedy_mismatches == 1
    assert study.log_consistency_errors == 0


def test_log_consistency_flags_a_step_log_that_disagrees_with_nodes():
    nodes, steps, prompts = hand_run()
    bad = steps.set_column(4, "accepted", pa.array([2, 1, 0, 1, 2]))
    assert analyze(nodes, bad, prompts, config=FAST).log_consistency_errors == 1


def test_spearman_known_values_and_ties():
    assert spearman(np.array([1, 2, 3, 4, 5]), np.array([5, 6, 7, 8, 7])) == pytest.approx(0.8207826816681233)
    assert spearman(np.arange(6.0), np.arange(6.0) ** 3) == pytest.approx(1.0)
    assert spearman(np.arange(6.0), -np.arange(6.0)) == pytest.approx(-1.0)
    # Ties: x ranks (1, 2.5, 2.5, 4), y ranks (1.5, 1.5, 3.5, 3.5): cov 3 / sqrt(4.5 * 4) = 1/sqrt(2).
    assert spearman(np.array([1, 2, 2, 3]), np.array([0, 0, 1, 1])) == pytest.approx(1 / np.sqrt(2))
    assert np.isnan(spearman(np.arange(4.0), np.ones(4)))


def test_weights_equal_duplicated_rows():
    rng = np.random.default_rng(3)
    x, y = rng.integers(0, 5, 40).astype(float), rng.integers(0, 2, 40).astype(float)
    w = rng.integers(0, 4, 40)
    dup = np.repeat(np.arange(40), w)
    assert spearman(x, y, w) == pytest.approx(spearman(x[dup], y[dup]))
    assert RankPlan(x).ranks(np.ones(40)).sum() == pytest.approx(40 * 41 / 2)


def clustered_sample(rng: np.random.Generator, prompts: int, per_prompt: int) -> dict[str, np.ndarray]:
    """Entropy and acceptance with prompt-level effects, so nodes within a prompt are correlated."""
    group = np.repeat(np.arange(prompts), per_prompt)
    u, v = rng.normal(0, 0.8, prompts), rng.normal(0, 1.0, prompts)
    entropy = u[group] + rng.normal(0, 1, len(group))
    p = 1 / (1 + np.exp(-(0.3 - 0.5 * entropy + v[group])))
    return {"group": group, "entropy": entropy, "match": (rng.random(len(group)) < p).astype(float)}


def test_prompt_bootstrap_ci_covers_the_true_rho():
    truth_sample = clustered_sample(np.random.default_rng(99), 20000, 20)
    truth = spearman(truth_sample["entropy"], truth_sample["match"])
    covered, node_level_covered = 0, 0
    trials = 40
    for t in range(trials):
        s = clustered_sample(np.random.default_rng(t), 60, 30)
        stat = lambda w, s=s: spearman(s["entropy"], s["match"], w)  # noqa: E731
        ci = prompt_bootstrap(s["group"], stat, reps=200, seed=t)
        naive = prompt_bootstrap(np.arange(len(s["group"])), stat, reps=200, seed=t)
        assert ci.ci_low < ci.estimate < ci.ci_high
        covered += ci.ci_low <= truth <= ci.ci_high
        node_level_covered += naive.ci_low <= truth <= naive.ci_high
    assert covered / trials >= 0.85
    # Resampling nodes ignores the prompt clustering and covers the truth less often.
    assert node_level_covered < covered


def test_oof_logloss_is_the_entropy_of_a_constant_rate():
    y = np.array([1, 0, 1, 0, 1, 0, 1, 0.0])
    fold = np.array([0, 0, 1, 1, 0, 0, 1, 1])
    loss = oof_logloss(y, np.zeros(8, np.int64), fold, np.ones(8), prior=0.0)
    assert loss == pytest.approx(np.log(2))
    # A level never seen in the other folds is predicted at their overall rate, as the one-rate model does.
    rng = np.random.default_rng(0)
    y, fold = (rng.random(600) < 0.3).astype(float), rng.integers(0, 5, 600)
    base = oof_logloss(y, np.zeros(600, np.int64), fold, np.ones(600))
    assert oof_logloss(y, fold, fold, np.ones(600)) == pytest.approx(base, rel=1e-3)
    assert len(set(fold_of_groups(10, 5).tolist())) == 5
    assert encode(np.array(["b", "a", "b"])).codes.tolist() == [1, 0, 1]


def factor_run(by: str, seed: int = 0, extra: bool = False) -> tuple[pa.Table, pa.Table, pa.Table]:
    """Flat logs where acceptance depends only on the domain, or only on the depth."""
    rng = np.random.default_rng(seed)
    rows, steps, prompts = [], [], []
    names = ("dialogue", "code", "math", "logic") + (("creative",) if extra else ())
    for i in range(20 * len(names)):
        dom = names[i % len(names)]
        for k in range(40):
            depth = 1 + k % 6
            by_domain = {"dialogue": 0.75, "code": 0.55, "math": 0.35, "logic": 0.5, "creative": 0.6}[dom]
            p = by_domain if by == "domain" else 0.85 - 0.1 * depth
            match = bool(rng.random() < p)
            rows.append(node(f"p{i}", dom, k, 0, -1, depth, match, entropy=float(rng.random())))
            steps.append((f"p{i}", dom, k, 1, 0, 1))
        prompts.append((f"p{i}", dom, 40, False, None))
    return node_table(rows), step_table(steps), prompt_table(prompts)


@pytest.mark.parametrize("factor", ["domain", "depth"])
def test_domain_vs_depth_picks_the_factor_that_drives_acceptance(factor):
    study = analyze(*factor_run(factor), config=FAST)
    dvd = study.domain_vs_depth
    assert dvd.stronger == factor
    assert dvd.difference_ci95[0] <= dvd.difference <= dvd.difference_ci95[1]
    assert study.claims[0].holds == (factor == "domain")
    assert study.domain_vs_depth_seed_domains is None  # the run holds the seed's four domains only
    assert study.domain_vs_depth_top1.stronger == factor  # every flat node is a rank-0 child


def test_claim_one_is_judged_on_the_seed_domains_when_the_run_has_more():
    study = analyze(*factor_run("domain", extra=True), config=FAST)
    assert "creative" in study.domain_vs_depth.domains
    assert study.domain_vs_depth_seed_domains.domains == ["code", "dialogue", "logic", "math"]
    assert study.claims[0].domains == ["code", "dialogue", "logic", "math"]
    assert "creative" not in study.claims[2].evidence


def stats(el: float, ent: float, acc: float, rho: float) -> DomainStats:
    return DomainStats.model_construct(mean_accepted_length=el, mean_entropy=ent, acceptance_rate=acc,
                                       spearman_rho=rho, spearman_ci95=[rho - 0.05, rho + 0.05])


def test_claims_judged_on_the_seed_domains():
    dvd = DomainVsDepth.model_construct(domain_reduction=0.01, domain_ci95=[0.0, 0.02], depth_reduction=0.0,
                                        depth_ci95=[0.0, 0.0], difference=0.01, difference_ci95=[-0.001, 0.02],
                                        stronger="inconclusive", domains=["code", "dialogue", "logic", "math"])
    seed_like = {"dialogue": stats(1.2, 2.0, 0.56, -0.17), "code": stats(0.9, 1.5, 0.53, -0.16),
                 "math": stats(0.8, 1.0, 0.51, -0.19), "logic": stats(0.95, 1.2, 0.52, -0.18)}
    claims = judge_claims(seed_like, dvd, SEED)
    assert [c.holds for c in claims] == [False, True, True, True]
    other = seed_like | {"code": stats(1.1, 2.5, 0.6, -0.30)}
    claims = judge_claims(other, dvd, SEED)
    assert [c.holds for c in claims] == [False, False, False, False]
    assert "code" in claims[1].evidence and "-0.300" in claims[3].evidence
