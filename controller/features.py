"""A request's frontier features written straight into a predictor's input rows (LearnedTree's hot path).

``Frontier.numeric_features()`` builds a dict of ~17 arrays per level, which the predictor then copies
column by column into its float64 matrix: about 0.2 ms a step on this CPU, more than the compiled trees
themselves. A predictor that also offers ``predict_prefix`` (rows in ``feature_names`` order, categoricals
as their ``category_code``) gets the matrix filled here instead: the request's scalars in one assignment,
each frontier array in one. Values are cast through the node log's types first (float32 rates, integer
depths) so the trees see exactly the numbers training saw; ``tests/controller/test_features.py`` checks the
rows against the dict path on a real decode.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from decoder import Frontier, TreewiseError
from decoder.nodelog import NUMPY_TYPES, TOKEN_TYPES
from predictor.derived import DERIVED_COLUMNS, RequestFeatures

# Frontier arrays a predictor may read, by feature name.
_ARRAYS: dict[str, Callable[[Frontier], np.ndarray]] = {
    "sibling_rank": lambda f: f.sibling_rank.numpy(), "draft_logprob": lambda f: f.draft_logprob.numpy(),
    "draft_entropy": lambda f: f.draft_entropy.numpy(), "draft_margin": lambda f: f.draft_margin.numpy(),
    "path_logprob": lambda f: f.path_logprob.numpy(), "parent_draft_prob": lambda f: f.parent_draft_prob.numpy(),
    "token_id": lambda f: f.tokens.numpy(),
}
Scalar = Callable[[Frontier, RequestFeatures], float]
# Values shared by every candidate of a frontier, by feature name: the frontier's and the request's.
_SCALARS: dict[str, Scalar] = {
    "depth": lambda f, c: f.depth, "position": lambda f, c: f.position + f.depth - 1,
    "prompt_len": lambda f, c: f.prompt_len, "running_accept_rate": lambda f, c: f.running_accept_rate,
    "prev_accepted": lambda f, c: f.prev_accepted, "temperature": lambda f, c: f.temperature,
    "recent_accepted": lambda f, c: c.recent_accepted, "recent_accept_rate": lambda f, c: c.recent_rate,
}
_PARENT = ("parent_margin", "parent_entropy")  # per candidate, looked up one level up
_SPECIAL = TOKEN_TYPES.index("special")


@runtime_checkable
class MatrixAcceptanceModel(Protocol):
    """A predictor that takes encoded rows: ``predict_prefix(x, n)`` scores the first n rows of a float64
    C-contiguous matrix whose columns follow ``feature_names``, categoricals as ``category_code(name, value)``."""

    @property
    def feature_names(self) -> list[str]: ...

    def category_code(self, feature: str, value: str) -> int: ...

    def predict_prefix(self, x: np.ndarray, n: int) -> np.ndarray: ...


def _typed(name: str, get: Scalar) -> Scalar:
    """``get`` with its value passed through the node log's type (a rate through float32, as training stored
    it), then widened to the float64 the trees compare."""
    kind = NUMPY_TYPES[name] if name in NUMPY_TYPES else DERIVED_COLUMNS[name].to_pandas_dtype()
    return lambda f, c: float(kind(get(f, c)))


@dataclass
class FeatureRows:
    """Per request: the predictor's input matrix, filled one frontier at a time by ``fill``."""

    model: MatrixAcceptanceModel
    domain: str
    _x: np.ndarray = field(init=False, repr=False)  # [capacity, F] float64, C order
    _scalar_cols: np.ndarray = field(init=False, repr=False)  # columns of the per-level scalars
    _scalars: list[Scalar] = field(init=False, repr=False)
    _array_cols: list[tuple[int, Callable[[Frontier], np.ndarray]]] = field(init=False, repr=False)
    _type_col: int = field(default=-1, init=False, repr=False)
    _type_codes: np.ndarray | None = field(default=None, init=False, repr=False)  # TOKEN_TYPES index -> code
    _parent_cols: list[tuple[int, str]] = field(default_factory=list, init=False, repr=False)  # column, name

    @staticmethod
    def supports(model: object) -> bool:
        """True when every feature the model reads can be filled here (else the caller uses dicts)."""
        if not isinstance(model, MatrixAcceptanceModel):
            return False
        names = set(model.feature_names)
        if not names <= {"domain", "token_type", *_ARRAYS, *_SCALARS, *_PARENT}:
            return False
        try:  # the two categoricals must have codes (a model that reads them as numbers keeps the dict path)
            for name, value in (("domain", "unknown"), ("token_type", TOKEN_TYPES[0])):
                if name in names:
                    model.category_code(name, value)
        except TreewiseError:
            return False
        return True

    def __post_init__(self) -> None:
        names = list(self.model.feature_names)
        self._x = np.zeros((64, len(names)), dtype=np.float64)
        self._scalar_cols = np.asarray([j for j, n in enumerate(names) if n in _SCALARS], dtype=np.int64)
        self._scalars = [_typed(n, _SCALARS[n]) for n in names if n in _SCALARS]
        self._array_cols = [(j, _ARRAYS[n]) for j, n in enumerate(names) if n in _ARRAYS]
        self._parent_cols = [(j, n) for j, n in enumerate(names) if n in _PARENT]
        if "token_type" in names:
            self._type_col = names.index("token_type")
            codes = [self.model.category_code("token_type", t) for t in TOKEN_TYPES]
            self._type_codes = np.asarray([c if c >= 0 else math.nan for c in codes], dtype=np.float64)
        if "domain" in names:  # the request's code in every row, written once (fill never touches it)
            code = self.model.category_code("domain", self.domain)
            self._x[:, names.index("domain")] = float(code) if code >= 0 else math.nan  # unseen: missing, as trained

    def predict(self, frontier: Frontier, context: RequestFeatures, parent: np.ndarray) -> np.ndarray:
        """[m] float64 acceptance probabilities of the frontier's candidates, from one ``predict_prefix`` call.

        ``parent``: each candidate's parent as a candidate index in the step (-1 for the root)."""
        m = self.fill(frontier, context, parent)
        return np.asarray(self.model.predict_prefix(self._x, m), dtype=np.float64)

    @property
    def matrix(self) -> np.ndarray:
        """The whole buffer; rows ``[:m]`` hold the last frontier filled."""
        return self._x

    def fill(self, frontier: Frontier, context: RequestFeatures, parent: np.ndarray) -> int:
        """Write the frontier's rows into the first ``frontier.size`` rows of ``matrix``; returns that count."""
        m = frontier.size
        if m > self._x.shape[0]:
            grown = np.empty((max(m, 2 * self._x.shape[0]), self._x.shape[1]), dtype=np.float64)
            grown[:] = self._x[0]  # keeps the domain column
            self._x = grown
        x = self._x[:m]
        x[:, self._scalar_cols] = [get(frontier, context) for get in self._scalars]
        for j, get in self._array_cols:
            x[:, j] = get(frontier)
        if self._type_codes is not None:
            table = frontier.token_type_table
            kind = table[frontier.tokens.numpy()] if table is not None else np.full(m, _SPECIAL)
            x[:, self._type_col] = self._type_codes[kind]
        if self._parent_cols:
            values = context.parent_values(parent)
            for j, name in self._parent_cols:
                x[:, j] = values[name]
        context.push(frontier.draft_margin.numpy(), frontier.draft_entropy.numpy())
        return m
