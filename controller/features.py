"""A request's frontier features written straight into a predictor's input rows (LearnedTree's hot path).

``Frontier.numeric_features()`` builds a dict of ~17 arrays per level, which the predictor then copies
column by column into its float64 matrix: about 0.2 ms a step on this CPU, more than the compiled trees
themselves. A predictor that also offers ``predict_prefix`` (rows in ``feature_names`` order, categoricals
as their ``category_code``) gets the matrix filled here instead: the scalars a step's levels share written
into every row once per step, depth and position per level, the frontier's arrays in one block, the
parents' columns in one gather. Values are cast through the node log's types first (float32 rates,
integer depths) so the trees see exactly the numbers training saw; ``tests/controller/test_features.py``
checks the rows against the dict path on a real decode.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np

from treewise.decoder import Frontier, TreewiseError
from treewise.decoder.nodelog import NUMPY_TYPES, TOKEN_TYPES
from treewise.predictor.derived import DERIVED_COLUMNS, RequestFeatures

# Frontier columns a predictor may read, by feature name -> ``Frontier.arrays()`` key.
_ARRAYS: dict[str, str] = {
    "sibling_rank": "sibling_rank", "draft_logprob": "draft_logprob", "draft_entropy": "draft_entropy",
    "draft_margin": "draft_margin", "path_logprob": "path_logprob", "parent_draft_prob": "parent_draft_prob",
    "token_id": "tokens",
}
Scalar = Callable[[Frontier, RequestFeatures], float]
# Values shared by every candidate of a frontier, by feature name: the frontier's and the request's.
_SCALARS: dict[str, Scalar] = {
    "depth": lambda f, c: f.depth, "position": lambda f, c: f.position + f.depth - 1,
    "prompt_len": lambda f, c: f.prompt_len, "running_accept_rate": lambda f, c: f.running_accept_rate,
    "prev_accepted": lambda f, c: f.prev_accepted, "temperature": lambda f, c: f.temperature,
    "recent_accepted": lambda f, c: c.recent_accepted, "recent_accept_rate": lambda f, c: c.recent_rate,
}
_BY_DEPTH = ("depth", "position")  # the only scalars that change between the levels of one step
STEP_SCALARS = tuple(n for n in _SCALARS if n not in _BY_DEPTH)  # the ones every level of a step shares
_PARENT = ("parent_margin", "parent_entropy")  # per candidate, looked up one level up
SPECIAL = TOKEN_TYPES.index("special")


@runtime_checkable
class MatrixAcceptanceModel(Protocol):
    """A predictor that takes encoded rows: ``predict_prefix(x, n)`` scores the first n rows of a float64
    C-contiguous matrix whose columns follow ``feature_names``, categoricals as ``category_code(name, value)``."""

    @property
    def feature_names(self) -> list[str]: ...

    def category_code(self, feature: str, value: str) -> int: ...

    def predict_prefix(self, x: np.ndarray, n: int) -> np.ndarray: ...


Columns = slice | np.ndarray  # a slice when the columns are consecutive (a cheaper write than an index array)


def _columns(index: list[int]) -> Columns:
    if index and index == list(range(index[0], index[0] + len(index))):
        return slice(index[0], index[0] + len(index))
    return np.asarray(index, dtype=np.int64)


def _kind(name: str) -> type:
    """The numpy type the node log stores a scalar feature as."""
    return NUMPY_TYPES[name] if name in NUMPY_TYPES else DERIVED_COLUMNS[name].to_pandas_dtype()


def _typed(name: str, get: Scalar) -> Scalar:
    """``get`` with its value passed through the node log's type (a rate through float32, as training stored
    it), then widened to the float64 the trees compare."""
    kind = _kind(name)
    return lambda f, c: float(kind(get(f, c)))


def raw_step_scalars(f: Frontier, c: RequestFeatures) -> tuple[float, ...]:
    """The step's shared scalars in ``STEP_SCALARS`` order, untyped (for a native caller that types them).

    Spelled out rather than looked up in ``_SCALARS`` (six lambda calls cost ~4 us a step after a forward);
    tests/controller/test_features.py holds it to the lookups."""
    return (f.prompt_len, f.running_accept_rate, f.prev_accepted, f.temperature, c.recent_accepted, c.recent_rate)


@dataclass
class FeatureRows:
    """Per request: the predictor's input matrix, filled one frontier at a time by ``fill``."""

    model: MatrixAcceptanceModel
    domain: str
    _names: list[str] = field(init=False, repr=False)  # the model's features, in matrix column order
    _x: np.ndarray = field(init=False, repr=False)  # [capacity, F] float64, C order
    _step_cols: Columns = field(init=False, repr=False)  # columns of the scalars shared by a step's levels ...
    _step_scalars: list[Scalar] = field(init=False, repr=False)  # ... and their values
    _step_key: tuple[object, ...] = field(default=(), init=False, repr=False)  # what the buffer's step columns hold
    _level_scalars: list[tuple[int, Scalar]] = field(default_factory=list, init=False, repr=False)  # depth, position
    _array_cols: Columns = field(init=False, repr=False)  # columns taken from the frontier's arrays ...
    _array_keys: list[str] = field(default_factory=list, init=False, repr=False)  # ... and their keys
    _parents: bool = field(default=False, init=False, repr=False)  # the model reads a parent column
    _type_col: int = field(default=-1, init=False, repr=False)
    _type_codes: np.ndarray | None = field(default=None, init=False, repr=False)  # TOKEN_TYPES index -> code
    _parent_cols: Columns = field(init=False, repr=False)  # columns of parent_margin / parent_entropy ...
    _parent_sel: Columns = field(init=False, repr=False)  # ... their slots in RequestFeatures.parent_rows

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
        names = self._names = list(self.model.feature_names)
        self._x = np.zeros((64, len(names)), dtype=np.float64)
        scalars = [n for n in names if n in _SCALARS]
        self._step_cols = _columns([names.index(n) for n in scalars if n not in _BY_DEPTH])
        self._step_scalars = [_typed(n, _SCALARS[n]) for n in scalars if n not in _BY_DEPTH]
        self._level_scalars = [(names.index(n), _typed(n, _SCALARS[n])) for n in scalars if n in _BY_DEPTH]
        arrays = [n for n in names if n in _ARRAYS]
        self._array_cols = _columns([names.index(n) for n in arrays])
        self._array_keys = [_ARRAYS[n] for n in arrays]
        parents = [n for n in names if n in _PARENT]
        self._parent_cols = _columns([names.index(n) for n in parents])
        self._parent_sel = _columns([_PARENT.index(n) for n in parents])
        self._parents = bool(parents)
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

    def reserve(self, m: int) -> np.ndarray:
        """The whole matrix, grown when it holds fewer than ``m`` rows (the domain column and the step's scalars
        carried over from row 0)."""
        if m > self._x.shape[0]:
            grown = np.empty((max(m, 2 * self._x.shape[0]), self._x.shape[1]), dtype=np.float64)
            grown[:] = self._x[0]
            self._x = grown
        return self._x

    def step_map(self) -> list[tuple[int, int, bool]]:
        """Per step scalar the model reads: its matrix column, its index in ``STEP_SCALARS`` and whether the node
        log stores it as float32 (a native caller rounds the raw value through float32 as training saw it)."""
        return [(self._names.index(n), STEP_SCALARS.index(n), _kind(n) == np.float32)
                for n in self._names if n in STEP_SCALARS]

    def source_columns(self, sources: tuple[str, ...]) -> list[int]:
        """The matrix column of each named feature, -1 for one the model does not read."""
        return [self._names.index(n) if n in self._names else -1 for n in sources]

    def type_codes(self) -> np.ndarray:
        """[len(TOKEN_TYPES)] float64: the model's code of each token type (NaN if unseen); empty if unread."""
        return self._type_codes if self._type_codes is not None else np.zeros(0)

    def fill(self, frontier: Frontier, context: RequestFeatures, parent: np.ndarray) -> int:
        """Write the frontier's rows into the first ``frontier.size`` rows of ``matrix``; returns that count.

        A handful of numpy calls per level, whatever the feature count: each call right after a model
        forward costs several microseconds (cold caches), more than its work on a dozen rows."""
        m = frontier.size
        x = self.reserve(m)[:m]
        self._fill_step_scalars(frontier, context)
        for j, get in self._level_scalars:
            x[:, j] = get(frontier, context)
        cols = frontier.arrays()
        if self._array_keys:  # one [K, m] float64 block from the level's arrays (np.array is one C call)
            x[:, self._array_cols] = np.array([cols[k] for k in self._array_keys], dtype=np.float64).T
        if self._type_codes is not None:
            table = frontier.token_type_table
            kind = table[cols["tokens"]] if table is not None else SPECIAL
            x[:, self._type_col] = self._type_codes[kind]
        if self._parents:
            x[:, self._parent_cols] = context.parent_rows(parent)[:, self._parent_sel]
        context.push(cols["draft_margin"], cols["draft_entropy"])
        return m

    def _fill_step_scalars(self, f: Frontier, c: RequestFeatures) -> None:
        """Write the scalars every level of a step shares into every row of the buffer, once per step."""
        key = (f.step, f.position, f.prompt_len, f.running_accept_rate, f.prev_accepted, f.temperature,
               c.recent_accepted, c.recent_rate)
        if key != self._step_key:  # a NaN equals only itself (the same object): else rewritten, never stale
            self._x[:, self._step_cols] = [get(f, c) for get in self._step_scalars]
            self._step_key = key
