"""The LightGBM forest as plain arrays, evaluated by one scalar-loop function that numba compiles.

LightGBM's own ``Booster.predict`` spends most of a 4-64 row call in per-call setup (docs/predictor.md, its
runtime table). The trees themselves are a few hundred comparisons a row, so the forest is flattened
here once per model (``ForestArrays.from_booster``) and walked by ``forest_predict``: the same source runs
compiled (``compiled_predict``, numba, cached on disk) inside LearnedTree's native level
(``controller.level``) or on its own, and as plain Python in tests. Without numba the predictor uses
LightGBM's predict instead (a Python walk of 100 trees would be slower than LightGBM).

Decisions follow LightGBM's ``Tree::NumericalDecision`` and ``Tree::CategoricalDecision`` (missing-value
types None / Zero / NaN, default direction, category bitsets); tests/predictor/test_forest.py holds the
outputs to ``Booster.predict`` on models with categorical splits, NaNs and zeros.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from treewise.decoder.errors import TreewiseError

# nodes[i]: feature (-1 for a leaf), left, right (node indices), flags, first bitset word, bitset words.
FEATURE, LEFT, RIGHT, FLAGS, CAT_START, CAT_WORDS = range(6)
CATEGORICAL, DEFAULT_LEFT, MISSING_ZERO, MISSING_NAN = 1, 2, 4, 8
ZERO = 1e-35  # LightGBM's kZeroThreshold


class ForestError(TreewiseError):
    """A model this evaluator does not reproduce (multiclass, linear trees, another objective)."""


class ForestTables(NamedTuple):
    """A forest as the kernels take it, after their rows (``forest_predict``, the controller's level)."""

    nodes: np.ndarray  # [n, 6] int64 per node (``FEATURE``, ``FLAGS``, ... columns)
    values: np.ndarray  # [n, 2] float64: leaf value or threshold, and a spare column
    bits: np.ndarray  # uint32 words of the categorical splits' bitsets
    roots: np.ndarray  # each tree's root node
    sigmoid: float  # the objective's sigmoid scale (0: raw scores)


@dataclass(frozen=True, eq=False)
class ForestArrays:
    """A LightGBM binary or regression forest as arrays: ``predict(x)`` equals ``Booster.predict(x)``."""

    nodes: np.ndarray  # [N, 6] int64, see FEATURE...
    values: np.ndarray  # [N, 2] float64: threshold (split) or leaf value (leaf) in column 0; column 1 unused
    bits: np.ndarray  # [K] uint32 category bitsets
    roots: np.ndarray  # [T] int64 the first node of each tree
    sigmoid: float  # > 0: binary objective, 1 / (1 + exp(-sigmoid * score)); 0: the raw score

    @classmethod
    def from_booster(cls, booster: Any) -> ForestArrays:
        dump = booster.dump_model()
        objective = str(dump.get("objective", "")).split()
        if dump.get("num_class", 1) != 1 or dump.get("num_tree_per_iteration", 1) != 1:
            raise ForestError("the forest evaluator reads one-output models only (not multiclass)")
        if dump.get("average_output"):
            raise ForestError("the forest evaluator does not average outputs (random-forest mode)")
        if objective and objective[0] == "binary":
            sigmoid = float(next(o.split(":")[1] for o in objective if o.startswith("sigmoid:")))
        elif objective and objective[0] in ("regression", "regression_l1", "huber", "fair", "quantile", "mape"):
            sigmoid = 0.0
        else:
            raise ForestError(f"the forest evaluator does not apply objective {' '.join(objective)!r}")
        nodes: list[list[int]] = []
        values: list[float] = []
        bits: list[int] = []
        roots = []
        for tree in dump["tree_info"]:
            if "is_linear" in tree and tree["is_linear"]:
                raise ForestError("the forest evaluator does not read linear trees")
            roots.append(len(nodes))
            _flatten(tree["tree_structure"], nodes, values, bits)
        return cls(np.asarray(nodes, dtype=np.int64).reshape(-1, 6),
                   np.stack([np.asarray(values, dtype=np.float64), np.zeros(len(values))], axis=1),
                   np.asarray(bits or [0], dtype=np.uint32), np.asarray(roots, dtype=np.int64), sigmoid)

    @property
    def arrays(self) -> ForestTables:
        """The arguments ``forest_predict`` takes after its rows."""
        return ForestTables(self.nodes, self.values, self.bits, self.roots, self.sigmoid)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Probabilities (or raw scores) for every row of a float64 matrix; compiled when numba imports."""
        x = np.ascontiguousarray(x, dtype=np.float64)
        out = np.empty(x.shape[0], dtype=np.float64)
        (compiled_predict() or forest_predict)(x, x.shape[0], out, *self.arrays)
        return out


def _flatten(node: dict, nodes: list[list[int]], values: list[float], bits: list[int]) -> int:
    """Append ``node`` and its subtree (pre-order); returns its index."""
    at = len(nodes)
    nodes.append([-1, -1, -1, 0, 0, 0])
    if "leaf_value" in node or "split_feature" not in node:
        values.append(float(node.get("leaf_value", 0.0)))
        return at
    flags = DEFAULT_LEFT if node.get("default_left") else 0
    flags |= {"Zero": MISSING_ZERO, "NaN": MISSING_NAN}.get(node.get("missing_type", "None"), 0)
    start = words = 0
    if node["decision_type"] == "==":
        flags |= CATEGORICAL
        cats = [int(c) for c in str(node["threshold"]).split("||")]
        words = max(cats) // 32 + 1
        start = len(bits)
        bits.extend([0] * words)
        for c in cats:
            bits[start + c // 32] |= 1 << (c % 32)
        values.append(0.0)
    else:
        values.append(float(node["threshold"]))
    left = _flatten(node["left_child"], nodes, values, bits)
    right = _flatten(node["right_child"], nodes, values, bits)
    nodes[at] = [int(node["split_feature"]), left, right, flags, start, words]
    return at


def forest_predict(x: np.ndarray, m: int, out: np.ndarray, nodes: np.ndarray, values: np.ndarray, bits: np.ndarray,
                   roots: np.ndarray, sigmoid: float) -> None:
    """``out[:m]`` <- the forest's output for rows ``x[:m]``: the leaf values summed in tree order, then the
    sigmoid. Scalar loops only, so numba compiles it (``compiled_predict``) and Python runs it as it is."""
    for r in range(m):
        out[r] = 0.0
    for t in range(roots.shape[0]):  # trees outer: one tree's nodes stay in cache across the rows
        for r in range(m):
            i = roots[t]
            while nodes[i, FEATURE] >= 0:
                v = x[r, nodes[i, FEATURE]]
                flags = nodes[i, FLAGS]
                go_left = False
                if flags & CATEGORICAL:
                    c = -1 if math.isnan(v) else int(v)  # NaN and negative codes go right (C++'s cast truncates)
                    if c >= 0:
                        w = c // 32
                        go_left = w < nodes[i, CAT_WORDS] and (bits[nodes[i, CAT_START] + w] >> (c % 32)) & 1 == 1
                else:
                    if math.isnan(v) and not flags & MISSING_NAN:
                        v = 0.0
                    if (flags & MISSING_ZERO and -ZERO <= v <= ZERO) or (flags & MISSING_NAN and math.isnan(v)):
                        go_left = flags & DEFAULT_LEFT != 0
                    else:
                        go_left = v <= values[i, 0]
                i = nodes[i, LEFT] if go_left else nodes[i, RIGHT]
            out[r] += values[i, 0]
    if sigmoid > 0.0:
        for r in range(m):
            out[r] = 1.0 / (1.0 + math.exp(-sigmoid * out[r]))


@functools.cache
def compiled_predict() -> Any | None:
    """``forest_predict`` compiled by numba (machine code cached on disk), or None where numba is missing."""
    try:
        import numba
    except ImportError:
        return None
    return numba.njit(cache=True, nogil=True)(forest_predict)
