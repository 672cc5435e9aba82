"""KV-cache compaction: after verification only the accepted path stays in the cache."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def keep_rows(cache: DynamicCache, committed: int, rows: torch.Tensor) -> None:
    """Keep the first ``committed`` positions plus the slots ``rows`` (absolute, increasing), drop the rest.

    The kept rows are copied down to sit right after the committed prefix, then the tail is cropped,
    so the cache reads as if only the accepted tokens had ever been fed.
    """
    new_len = committed + rows.numel()
    for layer in cache.layers:
        if not layer.is_initialized:
            continue
        if rows.numel():
            idx = rows.to(layer.keys.device)
            # Advanced indexing on the right makes a copy first, so overlapping moves are safe.
            layer.keys[..., committed:new_len, :] = layer.keys[..., idx, :]
            layer.values[..., committed:new_len, :] = layer.values[..., idx, :]
        layer.keys = layer.keys[..., :new_len, :]
        layer.values = layer.values[..., :new_len, :]
