"""KV caches of a step: feeding tokens under a tree mask, then keeping only the accepted path.

``SoloCache`` serves one sequence, ``BatchCache`` many sequences in one batched cache; both take ``Feed``s.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from treewise.decoder.capability import AttentionLayout
from treewise.decoder.errors import TreewiseError

from .arena import ArenaCache, rows_in_place


def keep_rows(cache: DynamicCache | ArenaCache, committed: int, rows: torch.Tensor | list[int]) -> None:
    """Keep the first ``committed`` positions plus the slots ``rows`` (absolute, increasing), drop the rest.

    The kept rows are copied down to sit right after the committed prefix, then the tail is cropped,
    so the cache reads as if only the accepted tokens had ever been fed. Slot i must hold position i, so
    only plain per-token layers qualify: a sliding-window layer evicts old rows and shifts every index.
    """
    wanted = rows.tolist() if isinstance(rows, torch.Tensor) else list(rows)
    if isinstance(cache, ArenaCache):
        cache.keep(committed, wanted)
        return
    new_len = committed + len(wanted)
    lead = rows_in_place(committed, wanted)
    move = wanted[lead:]
    crop = cache.get_seq_length() != new_len  # a plain step keeps exactly what it fed: nothing to do
    # One consecutive run of source rows that does not overlap its destination (one accepted node past the
    # in-place ones, or a chain of them) is copied through slices: no index tensor, cheaper per layer.
    run = bool(move) and move[-1] - move[0] == len(move) - 1 and move[0] - (committed + lead) >= len(move)
    idx: torch.Tensor | None = None
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise TreewiseError(f"cannot compact a {type(layer).__name__} cache layer by row index: "
                                "decode with a plain DynamicCache() (treewise masks sliding windows instead)")
        if not layer.is_initialized:
            continue
        if run:
            layer.keys[..., committed + lead:new_len, :] = layer.keys[..., move[0]:move[-1] + 1, :]
            layer.values[..., committed + lead:new_len, :] = layer.values[..., move[0]:move[-1] + 1, :]
        elif move:
            if idx is None:  # one index tensor for every layer (they share a device in a solo decode)
                idx = torch.tensor(move, dtype=torch.long, device=layer.keys.device)
            elif idx.device != layer.keys.device:
                idx = idx.to(layer.keys.device)
            # Advanced indexing on the right makes a copy first, so overlapping moves are safe.
            layer.keys[..., committed + lead:new_len, :] = layer.keys[..., idx, :]
            layer.values[..., committed + lead:new_len, :] = layer.values[..., idx, :]
        if crop:
            layer.keys = layer.keys[..., :new_len, :]
            layer.values = layer.values[..., :new_len, :]


@dataclass(frozen=True)
class Feed:
    """One forward's new tokens for one sequence, in that sequence's own slots.

    A sequence's cache holds its committed prefix (always visible; slot i at position i) and, during a
    step, ``p`` pending slots fed earlier in the step (draft levels). ``visible`` [t, p + t] says which
    pending and new slots each new token sees. The first ``commit`` new tokens join the committed prefix
    (a causal chain; only when nothing is pending).
    """

    tokens: torch.Tensor  # [t] long
    positions: torch.Tensor  # [t] long
    visible: torch.Tensor  # [t, p + t] bool
    commit: int = 0
    keep: int = 0  # logits of the last ``keep`` tokens only (0: all)
    causal: bool = False  # ``visible`` is a causal chain (each new token sees the earlier ones and itself)
    features: torch.Tensor | None = None  # [t, H] the feature each token reads (a feature draft's feeds only)

    @property
    def size(self) -> int:
        return int(self.tokens.numel())


@dataclass(frozen=True)
class ModelOut:
    """One forward's logits over the target's vocabulary and, where asked for, a feature per new token: a
    target's last hidden state (after its final norm: what its head reads), a feature draft's guess of it."""

    logits: torch.Tensor  # [b, t_keep, V]
    features: torch.Tensor | None = None  # [b, t, H]


def call_model(model: PreTrainedModel, tokens: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
               cache: DynamicCache | ArenaCache, keep: int = 0, features: torch.Tensor | None = None,
               hidden: bool = False) -> ModelOut:
    """The one call of a model in a step: a stock causal LM (``hidden``: with its last hidden states), or a feature
    draft (``decoder.feature_draft``) when the feed carries ``features`` [b, t, H]."""
    if features is not None:
        step = model(tokens, features, position_ids=positions, attention_mask=mask, cache=cache, logits_to_keep=keep)
        return ModelOut(model.target_logits(step.logits), step.features)
    out = model(input_ids=tokens, position_ids=positions, attention_mask=mask, cache=cache, use_cache=True,
                logits_to_keep=keep, output_hidden_states=hidden)
    # Language models tie hidden_states[-1] to the output after the final norm (transformers' capture_outputs).
    return ModelOut(out.logits, out.hidden_states[-1] if hidden else None)


class SoloCache:
    """One sequence's cache for one step: committed prefix, then pending slots in feeding order."""

    def __init__(self, cache: DynamicCache | ArenaCache, layout: AttentionLayout, dtype: torch.dtype,
                 committed: int | None = None) -> None:
        self.cache, self.layout, self.dtype = cache, layout, dtype
        self.committed = cache.get_seq_length() if committed is None else committed  # the rest is pending
        self.pending = 0  # slots fed this step and not committed
        self.pending_pos: torch.Tensor | None = None  # [p] their positions (tracked only for a sliding window)
        self.model_s = 0.0  # time inside the stock model calls (masks excluded)

    def forward(self, model: PreTrainedModel, feed: Feed) -> torch.Tensor:
        """Logits [t, V] of the new tokens (the last ``keep`` of them); the tokens join the cache."""
        return self.run(model, feed).logits

    def run(self, model: PreTrainedModel, feed: Feed, hidden: bool = False) -> ModelOut:
        """``forward``'s logits [t_keep, V] and, for a feature draft or with ``hidden``, a feature per new token."""
        device = feed.tokens.device
        window = self.layout.window is not None
        if window and self.pending_pos is None:  # only a sliding window reads the slots' positions
            self.pending_pos = feed.positions[:0]
        if feed.causal and self.pending == 0 and not window:
            # A causal chain after the committed prefix is the mask a full-attention model builds itself (slot
            # i holds position i): leave it to the model, as generate() does.
            mask = None
        else:
            positions = torch.cat([self.pending_pos, feed.positions]) if self.pending_pos is not None else None
            mask = self.layout.mask(feed.visible.to(device), self.committed, positions, self.dtype)
        t0 = time.perf_counter()
        feats = None if feed.features is None else feed.features[None]
        out = call_model(model, feed.tokens[None], feed.positions[None], mask, self.cache, feed.keep, feats, hidden)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.model_s += time.perf_counter() - t0
        self.committed += feed.commit
        self.pending += feed.size - feed.commit
        if self.pending_pos is not None:
            self.pending_pos = torch.cat([self.pending_pos, feed.positions[feed.commit:]])
        return ModelOut(out.logits[0], None if out.features is None else out.features[0])

    def compact(self, keep: list[int]) -> None:
        """Keep the committed prefix plus the pending slots ``keep`` (increasing); they become committed."""
        keep_rows(self.cache, self.committed, [self.committed + k for k in keep])
        self.committed += len(keep)
        self.pending, self.pending_pos = 0, None


class BatchCache:
    """Many sequences in one batched cache, each with its own committed prefix and pending slots.

    Every forward appends the same number of physical slots to every row (rows with fewer tokens are
    padded, padding sees only itself), so each row tracks which physical slots are its own: committed
    ones in order (positions 0..n-1), then pending ones. Compaction moves each row's kept slots to the
    front; other rows' slots beyond a row's length are never visible to it.
    """

    def __init__(self, rows: int, layout: AttentionLayout, dtype: torch.dtype, device: torch.device) -> None:
        self.cache, self.layout, self.dtype, self.device = DynamicCache(), layout, dtype, device
        empty = torch.zeros(0, dtype=torch.long, device=device)
        self.committed = [empty] * rows  # physical slot of each committed token
        self.pending = [empty] * rows  # physical slot of each pending token
        self.pending_pos = [empty] * rows

    def committed_len(self, row: int) -> int:
        return int(self.committed[row].numel())

    def forward(self, model: PreTrainedModel, feeds: list[Feed | None]) -> list[torch.Tensor | None]:
        """One batched forward; per row, the logits [t, V] of its feed (None where a row has none)."""
        return [None if out is None else out.logits for out in self.run(model, feeds)]

    def run(self, model: PreTrainedModel, feeds: list[Feed | None], hidden: bool = False) -> list[ModelOut | None]:
        """``forward``'s logits per row and, for a feature draft or with ``hidden``, a feature per fed token."""
        t = max((f.size for f in feeds if f is not None), default=0)
        start = self.cache.get_seq_length()
        width = start + t
        b = len(feeds)
        tokens = torch.zeros(b, t, dtype=torch.long, device=self.device)
        q_pos = torch.zeros(b, t, dtype=torch.long, device=self.device)
        k_pos = torch.zeros(b, width, dtype=torch.long, device=self.device)
        visible = torch.zeros(b, t, width, dtype=torch.bool, device=self.device)
        visible[:, torch.arange(t), start + torch.arange(t)] = True  # padding sees itself (no empty rows)
        shaped = next((f.features for f in feeds if f is not None and f.features is not None), None)
        feats = None if shaped is None else shaped.new_zeros(b, t, shaped.shape[-1])
        for r, feed in enumerate(feeds):
            committed, n = self.committed[r], self.committed[r].numel()
            k_pos[r, committed] = torch.arange(n, device=self.device)
            if feed is None:
                continue
            new = start + torch.arange(feed.size, device=self.device)
            ours = torch.cat([self.pending[r], new])  # [p + t_r] physical slots of the feed's visibility
            tokens[r, : feed.size], q_pos[r, : feed.size] = feed.tokens, feed.positions
            if feats is not None:
                feats[r, : feed.size] = feed.features
            k_pos[r, ours] = torch.cat([self.pending_pos[r], feed.positions])
            visible[r, : feed.size, committed] = True
            visible[r, : feed.size][:, ours] = feed.visible.to(self.device)
        mask = self.layout.batch_mask(visible, q_pos, k_pos, self.dtype)
        full = call_model(model, tokens, q_pos, mask, self.cache, features=feats, hidden=hidden)
        logits = full.logits  # [B, t, V]
        out: list[ModelOut | None] = []
        for r, feed in enumerate(feeds):
            if feed is None:
                out.append(None)
                continue
            new = start + torch.arange(feed.size, device=self.device)
            self.committed[r] = torch.cat([self.committed[r], new[: feed.commit]])
            self.pending[r] = torch.cat([self.pending[r], new[feed.commit:]])
            self.pending_pos[r] = torch.cat([self.pending_pos[r], feed.positions[feed.commit:]])
            row_feats = None if full.features is None else full.features[r, : feed.size]
            out.append(ModelOut(logits[r, feed.size - (feed.keep or feed.size) : feed.size], row_feats))
        return out

    def compact(self, keeps: list[list[int]]) -> None:
        """Per row, keep its committed prefix plus its pending slots ``keeps[r]``; move them to the front."""
        sources = [torch.cat([c, p[torch.as_tensor(k, dtype=torch.long, device=self.device)]])
                   for c, p, k in zip(self.committed, self.pending, keeps, strict=True)]
        new_len = max((s.numel() for s in sources), default=0)
        # Only slots whose source differs from their place move (mostly the accepted path): one indexed copy
        # per layer for all rows; the right side is read into a new tensor first, so overlapping moves are safe.
        moves = [(torch.full_like(src, r), torch.arange(src.numel(), device=self.device), src)
                 for r, src in enumerate(sources)]
        row, dst, src = (torch.cat(parts) for parts in zip(*moves, strict=True)) if moves else (None, None, None)
        changed = dst != src if dst is not None else None
        for layer in self.cache.layers:
            if not layer.is_initialized:
                continue
            if changed is not None and bool(changed.any()):
                r, d, s = row[changed], dst[changed], src[changed]
                layer.keys[r, :, d] = layer.keys[r, :, s]
                layer.values[r, :, d] = layer.values[r, :, s]
            layer.keys, layer.values = layer.keys[:, :, :new_len], layer.values[:, :, :new_len]
        empty = torch.zeros(0, dtype=torch.long, device=self.device)
        self.committed = [torch.arange(s.numel(), device=self.device) for s in sources]
        self.pending, self.pending_pos = [empty] * len(sources), [empty] * len(sources)

    def add(self, count: int) -> None:
        """``count`` new empty rows at the end (continuous batching): their physical slots so far are zeros that
        no row sees; their first feed commits their prompt."""
        if count <= 0:
            return
        for layer in self.cache.layers:
            if layer.is_initialized:
                pad = (count, *layer.keys.shape[1:])
                layer.keys = torch.cat([layer.keys, layer.keys.new_zeros(pad)])
                layer.values = torch.cat([layer.values, layer.values.new_zeros((count, *layer.values.shape[1:]))])
        empty = torch.zeros(0, dtype=torch.long, device=self.device)
        self.committed += [empty] * count
        self.pending += [empty] * count
        self.pending_pos += [empty] * count

    def prefill(self, model: PreTrainedModel, row: int, tokens: torch.Tensor, hidden: bool = False) -> ModelOut | None:
        """Commit ``tokens`` as the prefix of ``row`` (an empty row, just added) by a forward of that row alone,
        copied into the batch: a joining request's prompt costs its own tokens, not the whole batch padded to
        them. None (nothing done) before the batch's first forward: the row's first feed carries its prompt.
        ``hidden``: the returned output holds the target's feature at every prefix position."""
        n = tokens.numel()
        layers = self.cache.layers
        if n == 0 or not layers or not all(layer.is_initialized for layer in layers):
            return None
        solo = SoloCache(DynamicCache(), self.layout, self.dtype, committed=0)
        chain = torch.ones(n, n, dtype=torch.bool, device=self.device).tril()
        out = solo.run(model, Feed(tokens, torch.arange(n, device=self.device), chain, commit=n, keep=1, causal=True),
                       hidden)
        for layer, src in zip(layers, solo.cache.layers, strict=True):
            short = n - layer.keys.shape[2]
            if short > 0:  # longer than the batch so far: every row gets slots no one sees
                layer.keys, layer.values = (torch.cat([t, t.new_zeros((*t.shape[:2], short, t.shape[3]))], dim=2)
                                            for t in (layer.keys, layer.values))
            layer.keys[row, :, :n] = src.keys[0]
            layer.values[row, :, :n] = src.values[0]
        self.committed[row] = torch.arange(n, device=self.device)
        return out

    def select(self, rows: list[int]) -> None:
        """Keep only ``rows`` of the batch (finished rows stop costing compute)."""
        idx = torch.tensor(rows, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys, layer.values = layer.keys[idx], layer.values[idx]
        self.committed = [self.committed[r] for r in rows]
        self.pending = [self.pending[r] for r in rows]
        self.pending_pos = [self.pending_pos[r] for r in rows]
