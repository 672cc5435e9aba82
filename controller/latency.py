"""Latency profile of a pair on this device: forward time by tree size, measured once and cached.

LearnedTree reads it to stop growing a tree when one more node costs more than it is expected to
return (hardware-aware sizing in the spirit of Sequoia).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, PrivateAttr, ValidationError
from transformers import PreTrainedModel

from treewise.decoder import ArenaCache, TreeDecoder, TreewiseError, tree_attention_mask
from treewise.decoder.cache.kvcache import BatchCache, Feed
from treewise.decoder.capability import AttentionLayout
from treewise.decoder.kernels.mapped import output_vocab

SIZES = (1, 2, 4, 8, 16, 32, 64)
BATCH_ROWS = (1, 2, 4, 8, 16)  # the batch grid: rows ...
BATCH_SIZES = (1, 2, 4, 8, 16)  # ... times tokens fed by each row


class LatencyError(TreewiseError):
    """A latency profile file that cannot be read; the message names it and how to rebuild it."""


class LatencyProfile(BaseModel):
    """Median forward milliseconds for ``sizes`` new tokens on top of ``context`` cached ones, as measured.

    ``target_time`` / ``draft_time`` read them through a running maximum: a dip of a few percent between sizes
    (4.86 ms at 4 tokens, 4.84 at 8 on this CPU) would make nodes look free to LearnedTree's cost rule."""

    sizes: list[int]
    target_ms: list[float]
    draft_ms: list[float]
    context: int
    device: str
    threads: int
    key: str = ""
    created: str = ""
    host: str = ""  # the host kind it was measured on (controller.host.HostInfo.key); "" before hosts were named
    # The batch grid (``measure_batch_grid``): ms of one batched forward in which each of ``batch_rows`` rows
    # feeds ``batch_sizes`` tokens, through the batched cache ``generate_batch`` uses. Empty: never measured.
    batch_rows: list[int] = []
    batch_sizes: list[int] = []
    batch_target_ms: list[list[float]] = []  # [rows][sizes]
    batch_draft_ms: list[list[float]] = []

    # LearnedTree asks for the same few sizes dozens of times a step, and np.interp on a scalar is slow next to a
    # dict hit (docs/performance.md, "Why the hot path looks like this").
    _memo: dict[tuple[bool, float], float] = PrivateAttr(default_factory=dict)
    _views: dict[int, LatencyProfile] = PrivateAttr(default_factory=dict)

    def target_time(self, n: int | float) -> float:
        key = (True, n)
        if key not in self._memo:
            self._memo[key] = _interp(n, self.sizes, _rising(self.target_ms))
        return self._memo[key]

    def draft_time(self, n: int | float) -> float:
        key = (False, n)
        if key not in self._memo:
            self._memo[key] = _interp(n, self.sizes, _rising(self.draft_ms))
        return self._memo[key]

    def for_batch(self, rows: int) -> LatencyProfile:
        """The profile one row of a batch of ``rows`` sees: whole-step ms when every row feeds n tokens.

        LearnedTree's cost rule compares a node's value with the step's relative marginal cost; for one row
        of a batch that is the batch's (one more node in every row against the batch's step), read from the
        grid. One row, or no grid measured: this profile (solo decoding's choices, unchanged)."""
        if rows <= 1 or not self.batch_rows:
            return self
        if rows not in self._views:
            target, draft = (_grid_row(rows, self.batch_rows, g) for g in (self.batch_target_ms, self.batch_draft_ms))
            self._views[rows] = LatencyProfile(sizes=self.batch_sizes, target_ms=target, draft_ms=draft,
                                               context=self.context, device=self.device, threads=self.threads,
                                               key=self.key, created=self.created)
        return self._views[rows]

    @classmethod
    def read(cls, path: str | Path) -> LatencyProfile:
        """A profile written by ``treewise latency`` (or the cache); garbage raises ``LatencyError`` naming it."""
        file = Path(path)
        try:
            return cls.model_validate_json(file.read_bytes())
        except (OSError, ValidationError) as err:
            why = str(err) if isinstance(err, OSError) else _first(err)
            raise LatencyError(f"{file}: not a latency profile ({why}); measure it again with `treewise latency "
                               f"--out {file}` (or delete it)") from None

    @classmethod
    def flat(cls, target_ms: float = 1.0, draft_ms: float = 0.3, per_node_ms: float = 0.0) -> LatencyProfile:
        """A synthetic profile (tests, or a device that was never measured): constant call cost."""
        sizes = list(SIZES)
        return cls(sizes=sizes, target_ms=[target_ms + per_node_ms * (s - 1) for s in sizes],
                   draft_ms=[draft_ms + per_node_ms * (s - 1) / 4 for s in sizes], context=0, device="synthetic",
                   threads=0)


def _grid_row(rows: int, measured: list[int], grid: list[list[float]]) -> list[float]:
    """The grid's curve at ``rows``: linear between measured row counts, along the last segment past the largest,
    never below a smaller batch's (running maximum over rows, then over sizes)."""
    g = np.maximum.accumulate(np.maximum.accumulate(np.asarray(grid, dtype=np.float64), axis=0), axis=1)
    return _rising([_interp(rows, measured, g[:, j].tolist()) for j in range(g.shape[1])])


def _rising(ys: list[float]) -> list[float]:
    return np.maximum.accumulate(ys).tolist()


def _interp(n: float, xs: list[int], ys: list[float]) -> float:
    if n <= xs[-1]:
        return float(np.interp(n, xs, ys))
    # Extrapolate along the last segment; timing noise must not make bigger trees look cheaper.
    slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
    return ys[-1] + slope * (n - xs[-1])


@torch.inference_mode()
def time_forwards(model: PreTrainedModel, context: int, sizes: tuple[int, ...], repeats: int) -> list[float]:
    """The median ms of one forward of n new tokens over ``context`` cached ones, for each n of ``sizes``.

    The sizes take turns within every repeat: a slow spell of the machine then spreads over all of them instead
    of bending one size's entry (timed one size after another, profiles came out non-monotone). One model at a time:
    interleaving the target's forwards with the draft's timed the draft with its weights evicted (0.99 against
    0.33 ms at one token), which only the root's draft forward of a step sees."""
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    vocab = output_vocab(model)
    gen = torch.Generator().manual_seed(0)
    cache = ArenaCache(capacity=context + max(sizes))  # the cache decoding uses
    model(input_ids=torch.randint(0, vocab, (1, context), generator=gen).to(device), cache=cache, use_cache=True)
    feeds = []
    for n in sizes:
        ids = torch.randint(0, vocab, (1, n), generator=gen).to(device)  # [1, n]
        mask = tree_attention_mask(torch.ones(n, n, dtype=torch.bool, device=device).tril(), context, dtype)
        pos = torch.arange(context, context + n, device=device)[None]  # [1, n]
        feeds.append({"input_ids": ids, "attention_mask": mask, "position_ids": pos, "cache": cache, "use_cache": True})
    times: list[list[float]] = [[] for _ in sizes]
    for _ in range(repeats + 2):  # the first two rounds warm up
        for n, kwargs, t in zip(sizes, feeds, times, strict=True):
            t0 = time.perf_counter()
            model(**kwargs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t.append(time.perf_counter() - t0)
            cache.crop(-n)
    return [1e3 * statistics.median(t[2:]) for t in times]


def measure_latency(target: PreTrainedModel, draft: PreTrainedModel, context: int = 128,
                    sizes: tuple[int, ...] = SIZES, repeats: int = 40) -> LatencyProfile:
    device = next(target.parameters()).device
    return LatencyProfile(
        sizes=list(sizes), target_ms=time_forwards(target, context, sizes, repeats),
        draft_ms=time_forwards(draft, context, sizes, repeats), context=context, device=str(device),
        threads=torch.get_num_threads(), key=pair_key(target, draft),
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
    )


@torch.inference_mode()
def time_batch_forwards(model: PreTrainedModel, layout: AttentionLayout, context: int, rows: tuple[int, ...],
                        sizes: tuple[int, ...], repeats: int) -> list[list[float]]:
    """The median ms of one batched forward through ``BatchCache`` (as ``generate_batch`` runs them) in which each
    of ``rows`` rows feeds a tree chain of n tokens over ``context`` committed ones: [rows][sizes]. Sizes take
    turns within every repeat, as in ``time_forwards``."""
    device, dtype = next(model.parameters()).device, next(model.parameters()).dtype
    vocab = output_vocab(model)
    gen = torch.Generator().manual_seed(0)
    grid = []
    for b in rows:
        cache = BatchCache(b, layout, dtype, device)
        prompt = torch.randint(0, vocab, (b, context), generator=gen).to(device)
        pos = torch.arange(context, device=device)
        chain = torch.ones(context, context, dtype=torch.bool, device=device).tril()
        cache.forward(model, [Feed(prompt[r], pos, chain, commit=context, causal=True) for r in range(b)])
        feeds = [[Feed(torch.randint(0, vocab, (n,), generator=gen).to(device),
                       context + torch.arange(n, device=device),
                       torch.ones(n, n, dtype=torch.bool, device=device).tril(), keep=n) for _ in range(b)]
                 for n in sizes]
        times: list[list[float]] = [[] for _ in sizes]
        for _ in range(repeats + 2):  # the first two rounds warm up
            for fs, t in zip(feeds, times, strict=True):
                t0 = time.perf_counter()
                cache.forward(model, fs)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                t.append(time.perf_counter() - t0)
                cache.compact([[] for _ in range(b)])
        grid.append([1e3 * statistics.median(t[2:]) for t in times])
    return grid


def measure_batch_grid(dec: TreeDecoder, profile: LatencyProfile, rows: tuple[int, ...] = BATCH_ROWS,
                       sizes: tuple[int, ...] = BATCH_SIZES, repeats: int = 10) -> LatencyProfile:
    """``profile`` with its batch grid (re)measured for ``dec``'s pair at the profile's context; the solo curves
    stay as they are."""
    grid = {name: time_batch_forwards(model, layout, profile.context, rows, sizes, repeats)
            for name, model, layout in (("target", dec.target, dec.target_layout),
                                        ("draft", dec.draft, dec.draft_layout))}
    return LatencyProfile(**{**profile.model_dump(), "batch_rows": list(rows), "batch_sizes": list(sizes),
                             "batch_target_ms": grid["target"], "batch_draft_ms": grid["draft"]})


def _first(err: ValidationError) -> str:
    first = err.errors()[0]
    where = ".".join(str(x) for x in first["loc"])
    return f"{where}: {first['msg']}" if where else first["msg"]


def pair_key(target: PreTrainedModel, draft: PreTrainedModel) -> str:
    """Identifies a pair on a device: both configs, dtypes, the device and the thread count."""
    parts = [_config_text(target), _config_text(draft),
             str(next(target.parameters()).dtype), str(next(target.parameters()).device), str(torch.get_num_threads())]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _config_text(model: PreTrainedModel) -> str:
    cfg = model.config.to_dict()
    for volatile in ("_name_or_path", "transformers_version"):  # the same pair loaded from another path
        cfg.pop(volatile, None)
    return json.dumps(cfg, sort_keys=True, default=str)
