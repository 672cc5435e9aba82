"""The stages of one decoding step, as functions with explicit inputs: the solo loop (``engine``) and the batched
loop (``batch``) both call them, in the order draft context -> proposals -> drafting -> merge -> target forward
-> verification -> settle -> commit.

Each takes the pair (``core``, a ``StepCore``) where it needs the models or what is known about them, and the
request (``Request``) and its settings (``Run``) it works on.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from treewise.decoder.cache.kvcache import Feed, SoloCache
from treewise.decoder.candidates.merge import merge_lookup
from treewise.decoder.draft import DraftContext, DraftResult
from treewise.decoder.policy import StepOutcome
from treewise.decoder.tree import DraftTree, chain_then_tree
from treewise.decoder.verify import Acceptance

from .logrows import RowMeta, step_rows
from .step import Request, Run, StepCore, TargetForward, draft_keep, looked_up, target_keep


def context(core: StepCore, req: Request, step: int, run: Run, batch: int = 1) -> DraftContext:
    """What the drafter and the policy know of this step."""
    room = core.context - req.seq.numel() - 1  # positions left after the bonus token
    max_depth = max(0, min(req.max_new_tokens - len(req.generated) - 1, room))
    # Draft entropies cost a pass over the vocabulary: only for node logs and policies that read them.
    entropy = run.log is not None or getattr(run.policy, "reads_draft_entropy", True)
    return DraftContext(step, len(req.generated), req.prompt_len, run.domain, max_depth,
                        req.running_accept_rate, req.prev_accepted, core.token_types, entropy, batch)


def propose(req: Request, run: Run, ctx: DraftContext) -> None:
    """Before drafting: a proposing policy looks up the step's free candidates."""
    if run.proposer is not None:
        run.proposer.propose(req.seq.numpy() if req.seq.is_cpu else req.seq.cpu().numpy(), ctx)


def merged(run: Run, ctx: DraftContext, dr: DraftResult) -> DraftResult:
    """After drafting: the proposing policy's free candidates merged into the drafted tree."""
    if run.proposer is None:
        return dr
    return merge_lookup(dr, run.proposer.proposals(dr), run.draft_mode, ctx.max_depth)


def ended(req: Request, run: Run) -> None:
    """A request's last step: a proposing policy keeps its output for later lookups."""
    if run.proposer is not None:
        run.proposer.end(req.seq.cpu().numpy())


def tree_feed(core: StepCore, req: Request, tree: DraftTree, cached: int) -> Feed:
    """The committed tokens not yet in the target cache (a causal chain), then the tree under its mask."""
    root_pos = req.seq.numel() - 1
    if cached == root_pos:  # every step but the first: only the tree is new
        tokens, pos = tree.tokens, tree.position_ids(root_pos)
        if core.device.type != "cpu":  # a no-op move still costs a dispatch on the CPU
            tokens, pos = tokens.to(core.device), pos.to(core.device)
        return Feed(tokens, pos, tree.ancestor_mask, keep=tree.size, causal=tree.size == 1)
    chain = req.seq[cached:-1]  # committed tokens before the root not yet in the cache
    c = chain.numel()
    pos = torch.cat([torch.arange(cached, cached + c, device=core.device),
                     tree.position_ids(root_pos).to(core.device)])  # [c + n]
    vis = chain_then_tree(c, tree.ancestor_mask)
    return Feed(torch.cat([chain, tree.tokens.to(core.device)]), pos, vis, commit=c, keep=tree.size,
                causal=tree.size == 1)


def target_forward(core: StepCore, req: Request, tree: DraftTree) -> TargetForward:
    """One stock forward over the uncached committed tokens plus the tree; logits [n, V] at tree nodes."""
    t0 = time.perf_counter()
    feed = tree_feed(core, req, tree, req.target_cache.get_seq_length())
    cache = _target_cache(core, req)
    out = cache.run(core.target, feed, hidden=core.reads_features)
    tree_feats = chain_features(req, out.features, feed.commit)
    return TargetForward(out.logits.float(), time.perf_counter() - t0, cache.model_s, tree_feats)


def prefill_features(core: StepCore, req: Request) -> None:
    """For a feature draft: the target reads the prompt but its last token first, so the first step drafts."""
    n = req.seq.numel() - 1
    if req.features is None or n < 1 or req.target_cache.get_seq_length() > 0:
        return
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    chain = Feed(req.seq[:n], torch.arange(n, device=core.device), mask, commit=n, keep=1, causal=True)
    req.features.add(_target_cache(core, req).run(core.target, chain, hidden=True).features)  # type: ignore[arg-type]


def chain_features(req: Request, features: torch.Tensor | None, chain: int) -> torch.Tensor | None:
    """A target forward's features: the committed chain's join the request's, the tree's [n, H] come back."""
    if features is None or req.features is None:
        return None
    req.features.add(features[:chain])
    return features[chain:]


def kept_features(req: Request, tree_features: torch.Tensor | None, kept: list[int]) -> None:
    """The features of the tree nodes the target cache keeps (``target_keep``) join the request's."""
    if tree_features is not None and req.features is not None and kept:
        req.features.add(tree_features[torch.tensor(kept)] if len(kept) > 1 else tree_features[kept[0]][None])


def draft_slots_kept(core: StepCore, dr: DraftResult, acc: Acceptance, emitted: list[int]) -> list[int]:
    """Pending draft slots to keep: none for a feature draft (its tree slots read guessed features)."""
    return [] if core.reads_features else draft_keep(dr, acc, emitted)


def settle(core: StepCore, req: Request, run: Run, ctx: DraftContext, dr: DraftResult, logits: torch.Tensor,
           acc: Acceptance, forward_ms: float = float("nan")) -> tuple[list[int], dict[str, np.ndarray] | None]:
    """After verification: emit tokens, stream them, tell the policy; the step's node-log rows if logging."""
    emitted = emit(core, req, dr.tree, acc)
    rows = None
    if run.log is not None:
        meta = RowMeta(run.run_id, run.prompt_id, run.domain, ctx.step, ctx.position, req.prompt_len,
                       ctx.running_accept_rate, ctx.prev_accepted, run.sampling.temperature)
        rows = step_rows(dr.candidates, acc, logits, core.token_types, meta)
    if run.stream is not None:
        run.stream(emitted)
    on_path = set(acc.path)
    tried = sum(1 for parent in dr.tree.parents.tolist()[1:] if parent in on_path)  # no torch slice op
    run.policy.observe(StepOutcome(ctx.step, dr.tree.size - 1, acc.accepted, tried, tuple(acc.path[1:]),
                                   forward_ms, dr.extra, looked_up(dr, acc) if run.proposer else 0))
    req.tried, req.accepted, req.prev_accepted = req.tried + tried, req.accepted + acc.accepted, acc.accepted
    return emitted, rows


def emit(core: StepCore, req: Request, tree: DraftTree, acc: Acceptance) -> list[int]:
    """Accepted tokens plus the bonus, cut at EOS, max_new_tokens and the context length."""
    tokens = tree.tokens.tolist()  # a list lookup per accepted node: cheaper than a torch index op
    proposed = [tokens[i] for i in acc.path[1:]] + [acc.bonus]
    emitted: list[int] = []
    for token in proposed:
        emitted.append(token)
        req.generated.append(token)
        if token in core.eos_ids:
            req.finish = "eos"
        elif len(req.generated) >= req.max_new_tokens:
            req.finish = "length"
        elif req.seq.numel() + len(emitted) >= core.context:
            req.finish = "context"
        if req.finish is not None:
            break
    return emitted


def commit(core: StepCore, req: Request, dr: DraftResult, fwd: TargetForward, acc: Acceptance,
           emitted: list[int]) -> None:
    """Keep only the emitted part of the accepted path in both caches; extend the sequence.

    Invariant after each step: the target cache holds every token of ``seq`` but the last (pending) one
    (and ``req.features`` the target's feature at each of them).
    """
    committed = req.seq.numel()  # the root is the last committed token; the tree's nodes are pending
    kept = target_keep(acc, emitted)
    SoloCache(req.target_cache, core.target_layout, core.target_dtype, committed - 1).compact(kept)
    kept_features(req, fwd.features, kept)
    drafted = committed - core.draft_lag
    if req.draft_cache.get_seq_length() >= drafted:  # the draft caught up this step
        SoloCache(req.draft_cache, core.draft_layout, core.draft_dtype, drafted).compact(
            draft_slots_kept(core, dr, acc, emitted))
    req.extend(emitted)


def _target_cache(core: StepCore, req: Request) -> SoloCache:
    return SoloCache(req.target_cache, core.target_layout, core.target_dtype)
