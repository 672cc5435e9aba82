"""Schema-valid synthetic node logs with a known acceptance signal, for tests and demos only.

Conditional acceptance follows a logistic model of domain, draft probability, depth, token type and a
per-request ease that the running acceptance rate reveals. Never train a shipped predictor on these.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from treewise.decoder.records.nodelog import SCHEMA, TOKEN_TYPES


@dataclass(frozen=True)
class SyntheticSpec:
    domains: dict[str, float] = field(default_factory=lambda: {"code": 1.0, "math": 0.0, "chat": -1.0})
    prompts_per_domain: int = 30
    steps: int = 10
    width: int = 2  # children per node
    depth: int = 4
    temperature: float = 0.0
    draft_weight: float = 8.0  # logit slope in the draft probability: the strength of the signal
    run_id: str = "synthetic"
    seed: int = 0


@dataclass(frozen=True)
class _Tree:
    depth: np.ndarray
    parent: np.ndarray  # -1 for the root's children
    rank: np.ndarray


def _full_tree(width: int, depth: int) -> _Tree:
    depths, parents, ranks = [], [], []
    level = [-1]
    for d in range(1, depth + 1):
        nxt = []
        for p in level:
            for r in range(width):
                nxt.append(len(depths))
                depths.append(d)
                parents.append(p)
                ranks.append(r)
        level = nxt
    return _Tree(np.array(depths), np.array(parents), np.array(ranks))


def _step_rows(rng: np.random.Generator, tree: _Tree, spec: SyntheticSpec, bias: float, ease: float,
               conf: float) -> dict[str, np.ndarray]:
    """One step's drafted nodes and their verification outcome."""
    n = len(tree.depth)
    # Each node's draft distribution (shared by its children): top prob q, second p2, the rest spread.
    q = rng.beta(2 + 3 * conf, 2, size=n + 1)  # index n is the root
    p2 = (1 - q) * rng.uniform(0.3, 0.9, size=n + 1)
    rest = np.clip(1 - q - p2, 1e-6, None)
    entropy = -(q * np.log(q) + p2 * np.log(p2) + rest * np.log(rest / 20))
    par = np.where(tree.parent < 0, n, tree.parent)
    prob = np.where(tree.rank == 0, q[par], p2[par] * 0.8 ** np.maximum(tree.rank - 1, 0))
    logp = np.log(prob)
    path = logp.copy()
    for i in range(n):  # parents precede children
        if tree.parent[i] >= 0:
            path[i] += path[tree.parent[i]]
    ttype = rng.integers(0, len(TOKEN_TYPES), size=n)
    logit = (bias + ease + spec.draft_weight * (prob - 0.45) - 0.3 * (tree.depth - 1)
             + 0.6 * (ttype == TOKEN_TYPES.index("punct")) - 0.4 * (ttype == TOKEN_TYPES.index("digit")))
    p_true = 1 / (1 + np.exp(-logit))
    match = rng.random(n) < p_true
    verified = np.ones(n, dtype=bool)
    on_path = np.zeros(n, dtype=bool)
    taken = set()
    for i in range(n):
        pi = tree.parent[i]
        if pi >= 0 and not verified[pi]:
            verified[i] = False
        elif tree.depth[i] > 2:
            verified[i] = rng.random() < 0.8
        # The target has one argmax per parent: only the first matching sibling can match.
        if match[i] and pi in taken:
            match[i] = False
        if match[i]:
            taken.add(pi)
        on_path[i] = verified[i] and match[i] and (pi < 0 or on_path[pi])
    match &= verified
    target_prob = np.where(verified, np.clip(p_true + rng.normal(0, 0.05, n), 0, 1), np.nan)
    tried = verified & (spec.temperature > 0)
    accept_prob = np.where(tried, np.minimum(1.0, target_prob / prob), np.nan)
    return {
        "depth": tree.depth, "sibling_rank": tree.rank, "parent_id": tree.parent, "token_type": ttype,
        "draft_logprob": logp, "draft_entropy": entropy[par], "draft_margin": (q - p2)[par],
        "path_logprob": path, "parent_draft_prob": np.where(tree.parent < 0, 1.0, prob[tree.parent]),
        "verified": verified, "target_prob": target_prob, "target_argmax_match": match,
        "on_accepted_path": on_path, "accept_prob": accept_prob,
    }


def _request(rng: np.random.Generator, tree: _Tree, spec: SyntheticSpec, domain: str, pid: str) -> list[dict]:
    bias = spec.domains[domain]
    ease = rng.normal(0, 0.7)
    conf = max(0.0, bias + 1) / 2
    prompt_len = int(rng.integers(16, 256))
    emitted, accepted_sum, attempts_sum, prev = 0, 0, 0, -1
    steps = []
    for step in range(spec.steps):
        cols = _step_rows(rng, tree, spec, bias, ease, conf)
        n = len(tree.depth)
        parent_on = np.where(tree.parent < 0, True, cols["on_accepted_path"][np.maximum(tree.parent, 0)])
        accepted = int(cols["on_accepted_path"].sum())
        cols.update(
            run_id=np.full(n, spec.run_id, dtype=object), prompt_id=np.full(n, pid, dtype=object),
            domain=np.full(n, domain, dtype=object), step=np.full(n, step), node_id=np.arange(n),
            token_id=rng.integers(4, 4000, size=n), position=emitted + tree.depth - 1,
            prompt_len=np.full(n, prompt_len), temperature=np.full(n, spec.temperature),
            running_accept_rate=np.full(n, accepted_sum / attempts_sum if attempts_sum else math.nan),
            prev_accepted=np.full(n, prev),
            token_type=np.asarray([TOKEN_TYPES[t] for t in cols["token_type"]], dtype=object),
            source=np.full(n, "draft", dtype=object), lookup_prob=np.full(n, math.nan), lookup_count=np.zeros(n),
            match_len=np.zeros(n),  # a draft model's nodes only
        )
        steps.append(cols)
        accepted_sum += accepted
        attempts_sum += int((cols["verified"] & parent_on).sum())
        emitted += accepted + 1
        prev = accepted
    return steps


def make_synthetic_logs(spec: SyntheticSpec | None = None) -> pa.Table:
    """A node-log table (decoder SCHEMA) for ``prompts_per_domain`` prompts of each domain."""
    spec = spec or SyntheticSpec()
    rng = np.random.default_rng(spec.seed)
    tree = _full_tree(spec.width, spec.depth)
    steps: list[dict] = []
    for domain in spec.domains:
        for k in range(spec.prompts_per_domain):
            steps += _request(rng, tree, spec, domain, f"{domain}-{k:04d}")
    columns = {}
    for fld in SCHEMA:
        values = np.concatenate([s[fld.name] for s in steps])
        columns[fld.name] = pa.array(values.tolist() if values.dtype == object else values, type=fld.type)
    return pa.Table.from_pydict(columns, schema=SCHEMA)
