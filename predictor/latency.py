"""Wall time of ``predict_batch`` on frontier-sized batches drawn from real rows."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import numpy as np

from .features import NodeRows

if TYPE_CHECKING:
    from .model import AcceptancePredictor


@dataclass(frozen=True)
class LatencyResult:
    batch: int  # candidates per call
    calls: int
    median_us: float
    p90_us: float

    def to_dict(self) -> dict[str, float | int]:
        return asdict(self)


def measure_predict_batch(predictor: AcceptancePredictor, rows: NodeRows, batches: tuple[int, ...] = (4, 16, 64),
                          calls: int = 300, seed: int = 0) -> list[LatencyResult]:
    """Median and p90 microseconds per ``predict_batch`` call, one fresh feature dict per call.

    Building the dict is outside the timed region: the controller builds it from its frontier anyway.
    """
    if len(rows) == 0:
        raise ValueError("no rows to time predict_batch on: pass logs with verified nodes")
    rng = np.random.default_rng(seed)
    names = predictor.feature_names
    results = []
    for batch in batches:
        times = np.empty(calls)
        for i in range(calls):
            idx = rng.integers(0, len(rows), size=batch)
            features = {n: rows.columns[n][idx] for n in names}
            t0 = time.perf_counter()
            predictor.predict_batch(features)
            times[i] = time.perf_counter() - t0
        results.append(LatencyResult(batch, calls, float(np.median(times) * 1e6),
                                     float(np.percentile(times, 90) * 1e6)))
    return results
