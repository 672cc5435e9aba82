"""Batched tree decoding: many sequences share each draft forward and each target forward.

Every row keeps its own policy, tree, sampler and output; a step drafts all rows' levels in lockstep
(one draft forward per level over every row that still drafts), verifies all rows' trees in one target
forward (trees padded to the largest, padding masked out), accepts per row and compacts each row's cache
to its own accepted path. Rows that finish leave the batch, so they stop costing compute, and waiting requests
take their places (continuous batching).
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from treewise.decoder.cache.kvcache import BatchCache, Feed, ModelOut
from treewise.decoder.draft import Drafter, DraftFeeds, DraftResult
from treewise.decoder.policy import BatchSizing, RequestInfo, TreePolicy
from treewise.decoder.records.results import GenerationStats, StepStats
from treewise.decoder.verify import VerifyInput

from . import stages
from .step import Request, Run, StepCore, target_keep


def fresh_policy(policy: TreePolicy) -> TreePolicy:
    """A new instance of ``policy`` for another row: a dataclass is re-made from its init fields (shared
    read-only parts such as a predictor stay shared, per-request state starts fresh); others are deep-copied."""
    if dataclasses.is_dataclass(policy) and not isinstance(policy, type):
        return dataclasses.replace(policy)
    return copy.deepcopy(policy)


@dataclass
class _Row:
    index: int  # in the input order
    req: Request
    run: Run
    stats: GenerationStats = field(default_factory=GenerationStats)
    log_rows: list[dict[str, np.ndarray]] = field(default_factory=list)  # written when the row ends, in order
    t0: float = 0.0  # when the row joined the batch


@dataclass
class _Timing:
    draft_s: float = 0.0
    verify_s: float = 0.0


def decode_batch(dec: StepCore, requests: list[Request], runs: list[Run], max_rows: int | None = None,
                 on_finish: Callable[[int, GenerationStats], None] | None = None) -> list[GenerationStats]:
    """Decode every request to its own stop condition; each row's stats in the input order.

    Continuous batching: at most ``max_rows`` rows decode together (None: all); when rows finish, waiting
    requests join in input order (a joined row's first feed is its prompt, a committed chain), so a long row
    does not hold a shrinking batch. ``on_finish(i, stats)`` is called as row i ends (its log written first).
    """
    waiting = deque(_Row(i, req, run) for i, (req, run) in enumerate(zip(requests, runs, strict=True)))
    out: list[GenerationStats] = [GenerationStats() for _ in requests]
    target = BatchCache(0, dec.target_layout, dec.target_dtype, dec.device)
    draft = BatchCache(0, dec.draft_layout, dec.draft_dtype, dec.device)
    active: list[_Row] = []
    limit = len(requests) if max_rows is None else max(1, max_rows)
    while waiting or active:
        joining = [waiting.popleft() for _ in range(min(limit - len(active), len(waiting)))]
        target.add(len(joining))
        draft.add(len(joining))
        for i, row in enumerate(joining, start=len(active)):
            _join(dec, row, i, target, draft)
        active += joining
        _step(dec, active, target, draft)
        done = [row for row in active if row.req.finish is not None]
        for row in done:
            _close(dec, row)
            out[row.index] = row.stats
            if on_finish is not None:
                on_finish(row.index, row.stats)
        if done:
            keep = [i for i, row in enumerate(active) if row.req.finish is None]
            target.select(keep)
            draft.select(keep)
            active = [active[i] for i in keep]
    return out


def _join(dec: StepCore, row: _Row, i: int, target: BatchCache, draft: BatchCache) -> None:
    """Row ``row`` takes batch row ``i`` (empty, just added): its policy starts; once the batch runs, both caches
    take its prompt but the root token by a forward of its own (a prefill), the root as every step's first node."""
    row.t0 = time.perf_counter()
    text = dec.tokenizer.decode(row.req.seq.tolist(), skip_special_tokens=True)
    row.run.policy.start(RequestInfo(row.run.domain, row.req.prompt_len, row.req.max_new_tokens,
                                     row.run.sampling.temperature, text))
    prefix = row.req.seq[:-1]
    out = target.prefill(dec.target, i, prefix, hidden=dec.reads_features)
    stages.chain_features(row.req, None if out is None else out.features, prefix.numel())
    if not dec.reads_features:  # a feature draft reads the prompt once the target has: on a later step
        draft.prefill(dec.draft, i, prefix)


def _step(dec: StepCore, active: list[_Row], target: BatchCache, draft: BatchCache) -> None:
    t0 = time.perf_counter()
    timing = _Timing()
    ctxs = [stages.context(dec, row.req, len(row.stats.steps), row.run, len(active)) for row in active]
    for row, ctx in zip(active, ctxs, strict=True):
        stages.propose(row.req, row.run, ctx)
    drafters, drafts = _draft_all(dec, active, ctxs, draft, timing)
    capped = _common_cap(active, drafters, drafts)
    drafts = [stages.merged(row.run, ctx, dr) for row, ctx, dr in zip(active, ctxs, capped, strict=True)]
    feeds: list[Feed | None] = [stages.tree_feed(dec, row.req, dr.tree, target.committed_len(i))
                                for i, (row, dr) in enumerate(zip(active, drafts, strict=True))]
    t1 = time.perf_counter()
    outs = target.run(dec.target, feeds, hidden=dec.reads_features)  # type: ignore[arg-type]
    timing.verify_s = time.perf_counter() - t1
    logits = [o.logits.float() for o in outs]  # type: ignore[union-attr]
    tree_feats = [stages.chain_features(row.req, o.features, f.commit)  # type: ignore[union-attr]
                  for row, o, f in zip(active, outs, feeds, strict=True)]
    accs, emitted = [], []
    for row, ctx, dr, lg in zip(active, ctxs, drafts, logits, strict=True):
        acc = dec.verifier(VerifyInput(dr.tree, lg, row.run.sampling, row.run.draft_mode, dr.draft_probs,
                                       row.run.generator, dr.fixed_from if dr.extra else None))
        out, log_rows = stages.settle(dec, row.req, row.run, ctx, dr, lg, acc, 1e3 * (timing.draft_s + timing.verify_s))
        if log_rows is not None:
            row.log_rows.append(log_rows)
        accs.append(acc)
        emitted.append(out)
    kept = [target_keep(acc, out) for acc, out in zip(accs, emitted, strict=True)]
    target.compact(kept)
    for row, feats, keep in zip(active, tree_feats, kept, strict=True):
        stages.kept_features(row.req, feats, keep)
    lag = dec.draft_lag
    draft.compact([stages.draft_slots_kept(dec, dr, acc, out) if draft.committed_len(i) >= row.req.seq.numel() - lag
                   else [] for i, (row, dr, acc, out) in enumerate(zip(active, drafts, accs, emitted, strict=True))])
    n = len(active)
    other = (time.perf_counter() - t0 - timing.draft_s - timing.verify_s) / n
    for row, dr, acc, out in zip(active, drafts, accs, emitted, strict=True):
        row.req.extend(out)
        # Shared forwards are split evenly between the rows that took part.
        row.stats.steps.append(StepStats(drafted=dr.candidates.size, verified=dr.tree.size - 1,
                                         accepted=acc.accepted, emitted=len(out), draft_forwards=dr.forwards,
                                         draft_s=timing.draft_s / n, verify_s=timing.verify_s / n, other_s=other,
                                         policy_s=dr.policy_s, rows=n))


def _draft_all(dec: StepCore, active: list[_Row], ctxs: list, cache: BatchCache,
               timing: _Timing) -> tuple[list[Drafter], list[DraftResult]]:
    """Drive every row's drafter in lockstep: one batched draft forward per round of feeds."""
    drafters = [Drafter(row.req.seq, cache.committed_len(i), row.run.policy, ctx, row.run.sampling, row.run.draft_mode,
                        dec.vocab, row.run.generator, None if row.req.features is None else row.req.features.view())
                for i, (row, ctx) in enumerate(zip(active, ctxs, strict=True))]
    gens: list[DraftFeeds] = [d.feeds() for d in drafters]
    results: list[DraftResult | None] = [None] * len(gens)
    feeds: list[Feed | None] = [_advance(g, None, results, i) for i, g in enumerate(gens)]
    while any(f is not None for f in feeds):
        t0 = time.perf_counter()
        outs = cache.run(dec.draft, feeds)
        timing.draft_s += time.perf_counter() - t0
        feeds = [_advance(g, out, results, i) if out is not None else None
                 for i, (g, out) in enumerate(zip(gens, outs, strict=True))]
    return drafters, [r for r in results if r is not None]


def _common_cap(active: list[_Row], drafters: list[Drafter], drafts: list[DraftResult]) -> list[DraftResult]:
    """Where every row's policy sizes batches (``BatchSizing``), cut each row's tree to its best ``batch_cap``
    nodes: the target forward pads every tree to the largest, so the batch pays the largest tree in every row."""
    policies = [row.run.policy for row in active]
    if len(active) < 2 or not all(isinstance(p, BatchSizing) for p in policies):
        return drafts
    values = [p.node_values() for p in policies]  # type: ignore[union-attr]
    cap = policies[0].batch_cap(values)  # type: ignore[union-attr]
    out = []
    for drafter, dr, value in zip(drafters, drafts, values, strict=True):
        if dr.tree.size - 1 <= cap:
            out.append(dr)
            continue
        kept = np.flatnonzero(dr.candidates.columns["tree_index"] >= 0)
        # Best first, parents before children on ties (a child's value never exceeds its parent's).
        order = kept[np.lexsort((dr.candidates.columns["depth"][kept], -value[kept]))][:cap]
        select = np.zeros(value.shape[0], dtype=bool)
        select[order] = True
        out.append(drafter.cut(select))
    return out


def _advance(gen: DraftFeeds, out: ModelOut | None, results: list[DraftResult | None], i: int) -> Feed | None:
    try:
        return gen.send(out)  # type: ignore[arg-type]
    except StopIteration as done:
        results[i] = done.value
        return None


def _close(dec: StepCore, row: _Row) -> None:
    row.stats.total_s = time.perf_counter() - row.t0
    stages.ended(row.req, row.run)
    if row.run.log is not None:
        for rows in row.log_rows:
            row.run.log.add_step(rows)
        row.run.log.end_request()
