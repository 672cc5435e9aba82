"""Drafting: grow the step's tree level by level, one draft forward per level over all expanded nodes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import torch
from transformers import DynamicCache, PreTrainedModel

from .policy import Frontier, LevelPlan, TreePolicy
from .tree import DraftTree, tree_attention_mask
from .verify import DraftMode, Sampling


@dataclass(frozen=True)
class Candidates:
    """Every candidate drafted in one step (all tensors [m], CPU), in level order."""

    tokens: torch.Tensor
    parent: torch.Tensor  # candidate index, -1 for the root
    depth: torch.Tensor
    sibling_rank: torch.Tensor
    draft_logprob: torch.Tensor
    draft_entropy: torch.Tensor
    draft_margin: torch.Tensor
    path_logprob: torch.Tensor
    parent_draft_prob: torch.Tensor
    tree_index: torch.Tensor  # index in the DraftTree, -1 when the policy pruned it

    @property
    def size(self) -> int:
        return int(self.tokens.numel())


@dataclass(frozen=True)
class DraftResult:
    tree: DraftTree
    candidates: Candidates
    draft_probs: dict[int, torch.Tensor]  # tree index -> draft distribution at that node (expanded only)
    fed_slot: torch.Tensor  # [n] draft-cache slot (after the committed prefix) of each tree node, -1 if unfed
    forward_s: float
    forwards: int


@dataclass(frozen=True)
class DraftContext:
    """Per-step facts the drafter passes to the policy."""

    step: int
    position: int
    prompt_len: int
    domain: str
    max_depth: int
    running_accept_rate: float = float("nan")
    prev_accepted: int = -1


@dataclass
class _Level:
    """Candidates of the current depth while drafting (tensors on CPU)."""

    tokens: torch.Tensor
    parent: torch.Tensor
    rank: torch.Tensor
    logprob: torch.Tensor
    entropy: torch.Tensor
    margin: torch.Tensor
    path_lp: torch.Tensor
    parent_prob: torch.Tensor
    extra: dict[str, torch.Tensor] = field(default_factory=dict)


def _expand(probs: torch.Tensor, counts: torch.Tensor, parents: torch.Tensor, parent_path_lp: torch.Tensor,
            parent_prob: torch.Tensor, mode: DraftMode, gen: torch.Generator | None) -> _Level:
    """Children of each row of ``probs`` [e, V]: top-k (or i.i.d. samples), ``counts[i]`` for row i."""
    kmax = int(counts.max())
    if mode == "sampled":
        tok = torch.multinomial(probs, kmax, replacement=True, generator=gen)  # [e, kmax]
    else:
        tok = torch.topk(probs, kmax, dim=-1).indices
    p = torch.gather(probs, 1, tok)  # [e, kmax]
    top2 = torch.topk(probs, min(2, probs.shape[-1]), dim=-1).values
    margin = top2[:, 0] - (top2[:, 1] if top2.shape[1] > 1 else 0)
    entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(-1)
    valid = torch.arange(kmax)[None, :] < counts[:, None]  # [e, kmax]
    rows = torch.arange(probs.shape[0])[:, None].expand(-1, kmax)[valid]
    ranks = torch.arange(kmax)[None, :].expand(probs.shape[0], -1)[valid]
    lp = torch.log(p[valid].clamp_min(1e-30))
    return _Level(
        tokens=tok[valid], parent=parents[rows], rank=ranks, logprob=lp, entropy=entropy[rows],
        margin=margin[rows], path_lp=parent_path_lp[rows] + lp, parent_prob=parent_prob[rows],
    )


def draft_tree(
    model: PreTrainedModel, cache: DynamicCache, seq: torch.Tensor, policy: TreePolicy, ctx: DraftContext,
    sampling: Sampling, mode: DraftMode, vocab: int, gen: torch.Generator | None = None,
) -> DraftResult:
    """Catch the draft cache up with ``seq`` (root = seq[-1]) and draft one tree under ``policy``."""
    device = seq.device
    cached = cache.get_seq_length()
    root_pos = seq.numel() - 1
    frontier_kw = dict(step=ctx.step, position=ctx.position, prompt_len=ctx.prompt_len, domain=ctx.domain,
                       temperature=sampling.temperature, max_depth=ctx.max_depth,
                       running_accept_rate=ctx.running_accept_rate, prev_accepted=ctx.prev_accepted)
    levels: list[_Level] = []
    kept_parts: list[torch.Tensor] = []
    draft_probs: dict[int, torch.Tensor] = {}
    fed_tree_idx: list[torch.Tensor] = []
    forward_s, forwards = 0.0, 0
    root_only = DraftTree.from_parents([-1], seq[-1:])
    if ctx.max_depth < 1:
        return DraftResult(root_only, _concat([], []), {}, torch.full((1,), -1), 0.0, 0)
    one = torch.ones(1)
    root = Frontier(depth=0, tree_size=0, tokens=seq[-1:].cpu(), parent=torch.full((1,), -1),
                    sibling_rank=torch.zeros(1, dtype=torch.long), draft_logprob=torch.zeros(1),
                    draft_entropy=torch.zeros(1), draft_margin=one, path_logprob=torch.zeros(1),
                    parent_draft_prob=one, **frontier_kw)
    # Forward 0: the committed tokens the draft has not seen; the last one is the root.
    chain = seq[cached:]
    t0 = time.perf_counter()
    logits = model(input_ids=chain[None], position_ids=torch.arange(cached, seq.numel(), device=device)[None],
                   cache=cache, use_cache=True, logits_to_keep=1).logits[0, -1:, :]
    forward_s += time.perf_counter() - t0
    forwards += 1
    probs = sampling.probs(_fit_vocab(logits, vocab)).cpu()  # [1, V]
    plan = policy.plan(root)
    counts = plan.children[:1].clamp(min=0)
    draft_probs[0] = probs[0]
    fed_parent_slot = torch.full((1,), -1)  # the root is committed, not a tree slot
    fed_anc = torch.zeros(0, 0, dtype=torch.bool)
    tree_parents, tree_tokens = [torch.full((1,), -1)], [seq[-1:].cpu()]
    n_tree, offset = 1, 0
    exp_tree_idx = torch.zeros(1, dtype=torch.long)
    exp_cand_idx = torch.full((1,), -1)
    exp_path_lp, exp_prob = torch.zeros(1), one
    depth = 0
    while int(counts.sum()) > 0:
        depth += 1
        level = _expand(probs, counts, exp_cand_idx, exp_path_lp, exp_prob, mode, gen)
        level_tree_parent = exp_tree_idx[_rows_of(level.parent, exp_cand_idx)]
        m = level.tokens.numel()
        frontier = Frontier(depth=depth, tree_size=n_tree - 1, tokens=level.tokens, parent=level.parent,
                            sibling_rank=level.rank, draft_logprob=level.logprob, draft_entropy=level.entropy,
                            draft_margin=level.margin, path_logprob=level.path_lp,
                            parent_draft_prob=level.parent_prob, **frontier_kw)
        plan = policy.plan(frontier) if depth < ctx.max_depth else _leaves(policy.plan(frontier))
        keep = plan.keep.bool()
        tree_idx = torch.full((m,), -1)
        tree_idx[keep] = torch.arange(n_tree, n_tree + int(keep.sum()))
        n_tree += int(keep.sum())
        levels.append(level)
        kept_parts.append(tree_idx)
        tree_parents.append(level_tree_parent[keep])
        tree_tokens.append(level.tokens[keep])
        counts_all = torch.where(keep, plan.children.clamp(min=0), 0)
        expand = counts_all > 0
        if not bool(expand.any()):
            break
        # One draft forward over every node to expand at this depth.
        e_rows = torch.nonzero(expand).flatten()
        parent_slot = fed_parent_slot[_rows_of(level.parent[e_rows], exp_cand_idx)]
        f_prev, e = fed_anc.shape[0], e_rows.numel()
        anc = torch.zeros(e, f_prev + e, dtype=torch.bool)
        has_parent = parent_slot >= 0
        anc[has_parent, :f_prev] = fed_anc[parent_slot[has_parent]]
        anc[:, f_prev:] = torch.eye(e, dtype=torch.bool)
        fed_anc = torch.cat([torch.cat([fed_anc, torch.zeros(f_prev, e, dtype=torch.bool)], 1), anc], 0)
        mask = tree_attention_mask(anc.to(device), cached + chain.numel(), _mask_dtype(model))
        pos = torch.full((1, e), root_pos + depth, device=device)
        t0 = time.perf_counter()
        logits = model(input_ids=level.tokens[e_rows].to(device)[None], position_ids=pos, attention_mask=mask,
                       cache=cache, use_cache=True).logits[0]
        forward_s += time.perf_counter() - t0
        forwards += 1
        probs = sampling.probs(_fit_vocab(logits, vocab)).cpu()  # [e, V]
        exp_tree_idx = tree_idx[e_rows]
        fed_tree_idx.append(exp_tree_idx)
        for i, t in enumerate(exp_tree_idx.tolist()):
            draft_probs[t] = probs[i]
        exp_cand_idx = e_rows + offset
        fed_parent_slot = torch.arange(f_prev, f_prev + e)
        exp_path_lp, exp_prob = level.path_lp[e_rows], level.logprob[e_rows].exp()
        counts = counts_all[e_rows]
        offset += m
    tree = DraftTree.from_parents(torch.cat(tree_parents), torch.cat(tree_tokens))
    fed_slot = torch.full((n_tree,), -1)
    if fed_tree_idx:
        idx = torch.cat(fed_tree_idx)
        fed_slot[idx] = torch.arange(idx.numel())
    return DraftResult(tree, _concat(levels, kept_parts), draft_probs, fed_slot, forward_s, forwards)


def _rows_of(cand_idx: torch.Tensor, expanded_cand_idx: torch.Tensor) -> torch.Tensor:
    """Position of each candidate's parent within the expanded set of the previous level."""
    return torch.searchsorted(expanded_cand_idx, cand_idx)


def _leaves(plan: LevelPlan) -> LevelPlan:
    return replace(plan, children=torch.zeros_like(plan.children))


def _fit_vocab(logits: torch.Tensor, vocab: int) -> torch.Tensor:
    """Pad (with -inf) or cut draft logits to the target's vocabulary size."""
    v = logits.shape[-1]
    if v == vocab:
        return logits
    if v > vocab:
        return logits[..., :vocab]
    pad = torch.full((*logits.shape[:-1], vocab - v), float("-inf"), dtype=logits.dtype, device=logits.device)
    return torch.cat([logits, pad], dim=-1)


def _mask_dtype(model: PreTrainedModel) -> torch.dtype:
    return next(model.parameters()).dtype


def _concat(levels: list[_Level], kept: list[torch.Tensor]) -> Candidates:
    def cat(name: str, dtype: torch.dtype) -> torch.Tensor:
        return torch.cat([getattr(lv, name) for lv in levels]) if levels else torch.zeros(0, dtype=dtype)

    depth = [torch.full((lv.tokens.numel(),), d + 1) for d, lv in enumerate(levels)]
    return Candidates(
        tokens=cat("tokens", torch.long), parent=cat("parent", torch.long),
        depth=torch.cat(depth) if depth else torch.zeros(0, dtype=torch.long),
        sibling_rank=cat("rank", torch.long), draft_logprob=cat("logprob", torch.float32),
        draft_entropy=cat("entropy", torch.float32), draft_margin=cat("margin", torch.float32),
        path_logprob=cat("path_lp", torch.float32), parent_draft_prob=cat("parent_prob", torch.float32),
        tree_index=torch.cat(kept) if kept else torch.zeros(0, dtype=torch.long),
    )
