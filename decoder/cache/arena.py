"""A preallocated KV cache: the layers' keys and values share preallocated blocks, compacted by a few copies.

A stock ``DynamicCache`` grows each layer by ``torch.cat`` (a full copy of the layer per forward), and a
step's compaction moves the accepted rows layer by layer: 2 x layers copies of a few rows each, each paying
the framework's per-call overhead on CPU (docs/performance.md). ``ArenaCache`` keeps the layers that share
a shape, dtype and device in one ``KVBlock`` ([layers, 2, batch, heads, capacity, head_dim]): a forward
writes its new rows in place, and a compaction moves a row of every layer's keys and values in one copy.
It is a stock ``transformers`` cache (a ``Cache`` of ``CacheLayerMixin`` layers): the model is not touched.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

from treewise.decoder.errors import TreewiseError

_MIN_CAPACITY = 256  # positions; capacity doubles when a forward would overflow it


class KVBlock:
    """Keys and values of the layers that share (batch, heads, head size, dtype, device).

    ``kv`` [slots, 2, B, H, capacity, D] holds slot s's keys at [s, 0] and values at [s, 1], so one copy
    moves a position in every layer at once.
    """

    def __init__(self, arena: ArenaCache, states: torch.Tensor, slots: int, capacity: int) -> None:
        self.arena = arena
        self.kv = states.new_empty((slots, 2, *states.shape[:-2], capacity, states.shape[-1]))
        self.used = 0  # slots (layers) taken

    @property
    def capacity(self) -> int:
        return int(self.kv.shape[-2])

    def take_slot(self) -> int:
        if self.used == self.kv.shape[0]:
            self._reallocate(2 * self.used, self.capacity)
        self.used += 1
        return self.used - 1

    def reserve(self, length: int) -> None:
        """Make room for ``length`` positions per layer (doubling, so growth costs O(log n) copies)."""
        if length > self.capacity:
            self._reallocate(self.kv.shape[0], max(2 * self.capacity, length))

    def _reallocate(self, slots: int, capacity: int) -> None:
        kv = self.kv.new_empty((slots, *self.kv.shape[1:-2], capacity, self.kv.shape[-1]))
        kv[: self.kv.shape[0], ..., : self.capacity, :] = self.kv
        self.kv = kv
        self.arena.generation += 1  # layers take fresh views of their slots

    def move(self, dst: int, src: list[int]) -> None:
        """Copy positions ``src`` (increasing, each >= its destination) to ``dst, dst + 1, ...`` in every slot."""
        kv = self.kv if self.used == self.kv.shape[0] else self.kv[: self.used]
        runs = _runs(dst, src)
        if runs is not None:
            for d, s, n in runs:  # a basic-slice copy costs a third of an indexed one
                kv[..., d : d + n, :] = kv[..., s : s + n, :]
        else:  # the right side is gathered into a new tensor first, so overlapping moves are safe
            kv[..., dst : dst + len(src), :] = kv[..., torch.tensor(src, dtype=torch.long, device=kv.device), :]


def rows_in_place(committed: int, rows: list[int]) -> int:
    """How many of the kept ``rows`` (increasing) already sit right after the committed prefix: they need no
    copy (the root always does, often its first children too)."""
    lead = 0
    while lead < len(rows) and rows[lead] == committed + lead:
        lead += 1
    return lead


def _runs(dst: int, src: list[int], most: int = 3) -> list[tuple[int, int, int]] | None:
    """The move as at most ``most`` slice copies (dst, src, n) whose two sides never overlap; else None.

    Sources are increasing and each lies at or after its destination, so copying runs in order never
    overwrites a source still to be read; only a run's own two sides can overlap.
    """
    runs: list[tuple[int, int, int]] = []
    for i, s in enumerate(src):
        if runs and runs[-1][1] + runs[-1][2] == s and runs[-1][0] + runs[-1][2] < runs[-1][1]:
            d0, s0, n = runs[-1]
            runs[-1] = (d0, s0, n + 1)  # extends the run; its destination still ends before its source starts
        else:
            runs.append((dst + i, s, 1))
            if len(runs) > most:
                return None
    return runs


class ArenaLayer(CacheLayerMixin):
    """One layer's view of its slot: positions [0, length) of its keys and values."""

    is_sliding = False
    is_croppable = True

    def __init__(self, arena: ArenaCache) -> None:  # no super().__init__: keys/values are views below
        self.arena = arena
        self.is_initialized = False
        self.length = 0
        self._places: tuple[tuple[KVBlock, int], tuple[KVBlock, int]] | None = None  # (block, slot) of K, of V
        self._generation = -1
        self._keys = self._values = torch.empty(0)  # [B, H, capacity, D] this layer's slot

    @property
    def keys(self) -> torch.Tensor | None:  # [B, H, length, Dk]
        return self._slot()[0][..., : self.length, :] if self.is_initialized else None

    @property
    def values(self) -> torch.Tensor | None:  # [B, H, length, Dv]
        return self._slot()[1][..., : self.length, :] if self.is_initialized else None

    def _slot(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This layer's keys and values [B, H, capacity, D], fresh views if any block moved since the last look."""
        if self._generation != self.arena.generation:
            assert self._places is not None
            (k_block, k_slot), (v_block, v_slot) = self._places
            self._keys, self._values = k_block.kv[k_slot, 0], v_block.kv[v_slot, 1]
            self._generation = self.arena.generation
        return self._keys, self._values

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        k_block = self.arena.block_for(key_states)
        k_place = (k_block, k_block.take_slot())
        same = value_states.shape == key_states.shape and value_states.dtype == key_states.dtype
        if same:
            v_place = k_place
        else:  # keys and values of different sizes (e.g. latent attention) take a slot each
            v_block = self.arena.block_for(value_states)
            v_place = (v_block, v_block.take_slot())
        self._places = (k_place, v_place)
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new rows [B, H, t, D] after the cached ones; return views [B, H, length, D] of all."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        assert self._places is not None
        (k_block, k_slot), (v_block, v_slot) = self._places
        end = self.length + key_states.shape[-2]
        if end > k_block.capacity or end > v_block.capacity:
            k_block.reserve(end)
            v_block.reserve(end)
        keys, values = self._slot()
        keys[..., self.length : end, :] = key_states
        values[..., self.length : end, :] = value_states
        self.length = end
        return keys[..., :end, :], values[..., :end, :]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return -1

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise TreewiseError(f"crop takes a negative count of positions to drop, got {tokens_to_remove}")
        self.length = max(0, self.length + tokens_to_remove)

    def reset(self) -> None:
        self.length = 0

    def offload(self) -> None:
        raise TreewiseError("an ArenaCache cannot be offloaded: decode with a DynamicCache instead")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise TreewiseError("an ArenaCache serves one sequence: batched decoding keeps its own cache")


class ArenaCache(Cache):
    """A stock ``Cache`` whose layers are slots of shared preallocated blocks (one block in a uniform model).

    ``layers`` (the model's layer count, when known) sizes the first block exactly; ``capacity`` is the
    positions allocated up front (the prompt plus the new tokens saves every regrowth).
    """

    def __init__(self, layers: int = 1, capacity: int = _MIN_CAPACITY) -> None:
        super().__init__(layers=[])
        self.slots_hint, self.capacity_hint = max(1, layers), max(1, capacity)
        self.blocks: dict[tuple[Any, ...], KVBlock] = {}
        self.generation = 0  # bumped by any block's reallocation

    def block_for(self, states: torch.Tensor) -> KVBlock:
        """The block for states [B, H, t, D] of this shape, dtype and device (made on first use)."""
        key = (tuple(states.shape[:-2]), states.shape[-1], states.dtype, states.device)
        if key not in self.blocks:
            self.blocks[key] = KVBlock(self, states, self.slots_hint, max(self.capacity_hint, states.shape[-2]))
        return self.blocks[key]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        while len(self.layers) <= layer_idx:  # layers join on their first forward, as in a DynamicCache
            self.layers.append(ArenaLayer(self))
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)

    def keep(self, committed: int, rows: list[int]) -> None:
        """Keep positions [0, committed) plus ``rows`` (absolute, increasing), moved down to follow them."""
        lead = rows_in_place(committed, rows)
        if lead < len(rows):
            for block in self.blocks.values():
                block.move(committed + lead, rows[lead:])
        for layer in self.layers:
            if layer.is_initialized:
                layer.length = committed + len(rows)  # type: ignore[attr-defined]
