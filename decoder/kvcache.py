"""KV-cache compaction: after verification only the accepted path stays in the cache."""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from .errors import TreewiseError


def keep_rows(cache: DynamicCache, committed: int, rows: torch.Tensor) -> None:
    """Keep the first ``committed`` positions plus the slots ``rows`` (absolute, increasing), drop the rest.

    The kept rows are copied down to sit right after the committed prefix, then the tail is cropped,
    so the cache reads as if only the accepted tokens had ever been fed. Slot i must hold position i, so
    only plain per-token layers qualify: a sliding-window layer evicts old rows and shifts every index.
    """
    new_len = committed + rows.numel()
    for layer in cache.layers:
        if type(layer) is not DynamicLayer:
            raise TreewiseError(f"cannot compact a {type(layer).__name__} cache layer by row index: "
                                "decode with a plain DynamicCache() (treewise masks sliding windows instead)")
        if not layer.is_initialized:
            continue
        if rows.numel():
            idx = rows.to(layer.keys.device)
            # Advanced indexing on the right makes a copy first, so overlapping moves are safe.
            layer.keys[..., committed:new_len, :] = layer.keys[..., idx, :]
            layer.values[..., committed:new_len, :] = layer.values[..., idx, :]
        layer.keys = layer.keys[..., :new_len, :]
        layer.values = layer.values[..., :new_len, :]
