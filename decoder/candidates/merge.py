"""Merge free candidates (``decoder.candidates.lookup``) into the step's drafted tree: one tree, shared prefixes once.

Lookup nodes are appended after the draft's own nodes, parents before children, so the draft's tree indices,
its distributions (``DraftResult.draft_probs``) and its cache slots stay as they are, and the target verifies
the merged tree in its one forward. A lookup node whose (parent, token) the tree already holds is that node
(source ``both``), except under the ``sampled`` draft mode: there the draft's children are i.i.d. samples whose
acceptance rule counts every one of them, so a lookup node is always a node of its own, tried first by the
deterministic rule (``VerifyInput.fixed_from``). Which candidate came from where changes nothing else in
verification: greedy accepts the target's argmax path, and the ``topk`` rule is exact for any fixed set of
distinct children.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol, runtime_checkable

import numpy as np
import torch

from treewise.decoder.draft import DraftContext, DraftResult
from treewise.decoder.policy import Candidates
from treewise.decoder.tree import DraftTree
from treewise.decoder.verify import DraftMode

from .lookup import LookupTree

DRAFT, LOOKUP, BOTH = range(3)  # codes into nodelog.SOURCES
# The lookup columns of a candidate only the draft model proposed.
_NO_LOOKUP = {"source": (np.int8, DRAFT), "lookup_prob": (np.float32, np.nan), "lookup_count": (np.int32, 0),
              "match_len": (np.int16, 0)}


@runtime_checkable
class Proposer(Protocol):
    """A tree policy that also proposes free candidates for each step (``controller.Hybrid``)."""

    def propose(self, seq: np.ndarray, ctx: DraftContext) -> None:
        """Before drafting: look up the step's candidates (the policy's root decision may read them)."""

    def proposals(self, drafted: DraftResult) -> LookupTree:
        """After drafting: the lookup nodes to merge into ``drafted``'s tree."""

    def end(self, seq: np.ndarray) -> None:
        """The request finished with ``seq`` (prompt and output)."""


def lookup_columns(m: int) -> dict[str, np.ndarray]:
    """The lookup columns of ``m`` candidates the draft model alone proposed."""
    return {name: np.full(m, value, dtype=dtype) for name, (dtype, value) in _NO_LOOKUP.items()}


def merge_lookup(dr: DraftResult, look: LookupTree, mode: DraftMode, max_depth: int) -> DraftResult:
    """``dr`` with ``look``'s nodes merged into its tree and candidates (nodes deeper than ``max_depth``, and
    their subtrees, left out); ``dr`` itself when nothing is added or shared."""
    if look.size == 0 or max_depth < 1:
        return dr
    tree, cols = dr.tree, dr.candidates.columns
    n, m = tree.size, len(cols["tokens"])
    parents, tokens, depth = tree.parents.tolist(), tree.tokens.tolist(), tree.depth.tolist()
    at = {(parents[i], tokens[i]): i for i in range(1, n)} if mode != "sampled" else {}
    cand_of = [-1] * n  # tree index -> candidate index
    for c, t in enumerate(cols["tree_index"].tolist()):
        if t >= 0:
            cand_of[t] = c
    extra = lookup_columns(m)
    rows: list[dict[str, float]] = []  # the appended candidates' columns
    where = [-1] * look.size  # lookup node -> tree index (-1: left out)
    probs, counts = look.prob, look.counts
    for j, (up, token) in enumerate(zip(look.parents.tolist(), look.tokens.tolist(), strict=True)):
        p = 0 if up < 0 else where[up]
        if p < 0 or depth[p] + 1 > max_depth:
            continue
        found = (p, token) in at
        i = at[(p, token)] if found else len(tokens)
        c = cand_of[i] if found else m + len(rows)
        where[j] = i
        if found:
            extra["source"][c] = BOTH
        else:
            at[(p, token)] = i
            parents.append(p)
            tokens.append(token)
            depth.append(depth[p] + 1)
            cand_of.append(c)
            rows.append(_draft_view(dr, cols, rows, p, cand_of[p], token) | {"source": LOOKUP, "tree_index": i,
                                                                             "depth": depth[p] + 1})
        row = rows[c - m] if c >= m else None
        for name, value in (("lookup_prob", probs[j]), ("lookup_count", counts[j]), ("match_len", look.match)):
            if row is not None:
                row[name] = value
            else:
                extra[name][c] = value
    if not rows and not (extra["source"] == BOTH).any():
        return dr
    merged = {name: np.concatenate([np.asarray(v), np.asarray([r[name] for r in rows], dtype=np.asarray(v).dtype)])
              for name, v in {**cols, **extra}.items()}
    return replace(dr, tree=_grown(tree, parents, tokens, depth), candidates=Candidates(merged),
                   fed_slot=torch.cat([dr.fed_slot, torch.full((len(rows),), -1, dtype=dr.fed_slot.dtype)]),
                   extra=dr.extra + len(rows))


def _draft_view(dr: DraftResult, cols: dict, rows: list[dict[str, float]], p: int, parent_cand: int,
                token: int) -> dict[str, float]:
    """A lookup-only candidate's draft columns: what the draft's distribution at its parent (tree node ``p``)
    says of its token when the draft expanded the parent, NaN (rank -1) where it did not."""
    m = len(cols["tokens"])

    def parent_value(name: str) -> float:  # the parent candidate's column: the draft's, or an appended row's
        return float(cols[name][parent_cand]) if parent_cand < m else float(rows[parent_cand - m][name])

    q = dr.draft_probs.get(p)
    above = cols["parent"] == parent_cand  # the draft's own children of the same parent share its distribution
    sib = int(np.argmax(above)) if above.any() else -1
    lp = float(np.log(max(float(q[token]), 1e-30))) if q is not None else np.nan
    return {
        "tokens": token, "parent": parent_cand,
        "sibling_rank": int((q > q[token]).sum()) if q is not None else -1,
        "draft_logprob": lp,
        "draft_entropy": float(cols["draft_entropy"][sib]) if sib >= 0 and q is not None else np.nan,
        "draft_margin": float(cols["draft_margin"][sib]) if sib >= 0 and q is not None else np.nan,
        "path_logprob": (0.0 if parent_cand < 0 else parent_value("path_logprob")) + lp,
        "parent_draft_prob": 1.0 if parent_cand < 0 else float(np.exp(parent_value("draft_logprob"))),
    }


def _grown(tree: DraftTree, parents: list[int], tokens: list[int], depth: list[int]) -> DraftTree:
    """``tree`` with the nodes appended past its size (each after its parent)."""
    n, total = tree.size, len(parents)
    anc = np.zeros((total, total), dtype=bool)
    anc[:n, :n] = tree.ancestor_mask.numpy()
    for i in range(n, total):
        anc[i] = anc[parents[i]]
        anc[i, i] = True
    return DraftTree(tokens=torch.tensor(tokens, dtype=torch.long), parents=torch.tensor(parents, dtype=torch.long),
                     depth=torch.tensor(depth, dtype=torch.long), ancestor_mask=torch.from_numpy(anc))
