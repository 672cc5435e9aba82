"""Microseconds per call of the predictor's forest: the numba walk of its own arrays against LightGBM's predict.

The rows are synthetic but take every split both ways: each numeric column draws one of the forest's own
thresholds on that feature, nudged just below or above it, and each categorical column one of the codes its
splits name. The two evaluators must agree bit for bit on every timed matrix, or the run fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from treewise.decoder.errors import TreewiseError
from treewise.predictor.forest import CATEGORICAL, FEATURE, FLAGS, ForestArrays, compiled_predict


class ForestTiming(BaseModel):
    rows: int
    calls: int
    numba_us: float | None  # median; None where numba is not installed
    lightgbm_us: float


class ForestBench(BaseModel):
    model: str
    trees: int
    nodes: int
    timings: list[ForestTiming]


def split_rows(forest: ForestArrays, n_features: int, rows: int, rng: np.random.Generator) -> np.ndarray:
    """``rows`` x ``n_features`` values that land on both sides of the forest's splits."""
    x = np.zeros((rows, n_features))
    splits = forest.nodes[:, FEATURE] >= 0
    for f in range(n_features):
        on_f = splits & (forest.nodes[:, FEATURE] == f)
        if not on_f.any():
            continue
        if (forest.nodes[on_f, FLAGS] & CATEGORICAL).any():
            x[:, f] = rng.integers(0, 32, rows)
        else:
            x[:, f] = rng.choice(forest.values[on_f, 0], rows) + rng.choice([-1e-9, 1e-9], rows)
    return x


def _median_us(fn: Callable[[np.ndarray], object], x: np.ndarray, calls: int) -> float:
    times = np.empty(calls)
    for i in range(calls):
        t0 = time.perf_counter()
        fn(x)
        times[i] = time.perf_counter() - t0
    return float(np.median(times) * 1e6)


def time_forest(model_dir: Path, rows: tuple[int, ...] = (4, 16, 64), calls: int = 2000,
                seed: int = 0) -> ForestBench:
    import lightgbm as lgb

    model_file = model_dir / "model.txt"
    if not model_file.is_file():
        raise TreewiseError(f"{model_file} does not exist: pass --model a predictor folder (e.g. data/predictor)")
    booster = lgb.Booster(model_file=str(model_file))
    forest = ForestArrays.from_booster(booster)
    rng = np.random.default_rng(seed)
    native = compiled_predict() is not None
    timings = []
    for n in rows:
        x = split_rows(forest, booster.num_feature(), n, rng)
        expect = booster.predict(x, num_threads=1)
        if native and not np.array_equal(forest.predict(x), expect):
            raise TreewiseError("the numba forest disagrees with Booster.predict: report this model as a bug")
        timings.append(ForestTiming(
            rows=n, calls=calls, numba_us=_median_us(forest.predict, x, calls) if native else None,
            lightgbm_us=_median_us(lambda v: booster.predict(v, num_threads=1), x, calls)))
    return ForestBench(model=str(model_dir), trees=len(forest.roots), nodes=len(forest.nodes), timings=timings)
