"""Where each feature a predictor reads comes from, laid out once per request for LearnedTree's level.

The level (``controller.level.fill``) writes a frontier's features straight into a float64 matrix whose
columns follow the predictor's ``feature_names``: the scalars a step's levels share, depth and position, the
frontier's arrays, the parents' margin and entropy, the token type and the domain as the predictor's category
codes. ``FeatureLayout`` says which column each source goes to. A predictor that scores such rows
(``predict_prefix``) takes the matrix; any other ``AcceptanceModel`` gets the same numbers as a dict of
columns in the node log's types (``FeatureLayout.as_dict``). Step scalars pass through the node log's types
(float32 rates) so the trees see exactly the numbers training saw; tests/controller/test_features.py holds
the rows to the node log's encoded features on real decodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol, runtime_checkable

import numpy as np

from treewise.decoder import Frontier, TreewiseError
from treewise.decoder.records.nodelog import NUMPY_TYPES, TOKEN_TYPES
from treewise.predictor.derived import DERIVED_COLUMNS, RequestFeatures

Scalar = Callable[[Frontier, RequestFeatures], float]
# Values shared by every candidate of a frontier, by feature name: the frontier's and the request's.
_SCALARS: dict[str, Scalar] = {
    "depth": lambda f, c: f.depth, "position": lambda f, c: f.position + f.depth - 1,
    "prompt_len": lambda f, c: f.prompt_len, "running_accept_rate": lambda f, c: f.running_accept_rate,
    "prev_accepted": lambda f, c: f.prev_accepted, "temperature": lambda f, c: f.temperature,
    "recent_accepted": lambda f, c: c.recent_accepted, "recent_accept_rate": lambda f, c: c.recent_rate,
}
_BY_DEPTH = ("depth", "position")  # the only scalars that change between the levels of one step (written per level)
STEP_SCALARS = tuple(n for n in _SCALARS if n not in _BY_DEPTH)  # the ones every level of a step shares
SPECIAL = TOKEN_TYPES.index("special")


@runtime_checkable
class MatrixAcceptanceModel(Protocol):
    """A predictor that takes encoded rows: ``predict_prefix(x, n)`` scores the first n rows of a float64
    C-contiguous matrix whose columns follow ``feature_names``, categoricals as ``category_code(name, value)``."""

    @property
    def feature_names(self) -> list[str]: ...

    def category_code(self, feature: str, value: str) -> int: ...

    def predict_prefix(self, x: np.ndarray, n: int) -> np.ndarray: ...


def _kind(name: str) -> type:
    """The numpy type the node log stores a scalar feature as."""
    return NUMPY_TYPES[name] if name in NUMPY_TYPES else DERIVED_COLUMNS[name].to_pandas_dtype()


class StepScalars(NamedTuple):
    """The scalars every level of a step shares, in ``STEP_SCALARS`` order (a test holds the two equal)."""

    prompt_len: float
    running_accept_rate: float
    prev_accepted: float
    temperature: float
    recent_accepted: float
    recent_accept_rate: float


def raw_step_scalars(f: Frontier, c: RequestFeatures) -> StepScalars:
    """The step's shared scalars, untyped (for a native caller that types them).

    Spelled out rather than looked up in ``_SCALARS``: a lambda call per scalar is slow right after a forward
    (docs/performance.md); tests/controller/test_features.py holds it to the lookups."""
    return StepScalars(f.prompt_len, f.running_accept_rate, f.prev_accepted, f.temperature, c.recent_accepted,
                       c.recent_rate)


# The per-level sources the level writes, in the order of ``FeatureLayout.cols`` (-1: the model does not read it).
SOURCES = ("sibling_rank", "draft_logprob", "draft_entropy", "draft_margin", "path_logprob", "parent_draft_prob",
           "token_id", "token_type", "parent_margin", "parent_entropy", "depth", "position")
# What the draft model's own candidates hold in the lookup columns (decoder.candidates.merge): the same in every row, so
# the request's template row carries them and the level never writes them.
DRAFT_ONLY: dict[str, float] = {"lookup_prob": math.nan, "lookup_count": 0.0, "match_len": 0.0}
FILLED = frozenset({"domain", "source", *DRAFT_ONLY, *SOURCES, *STEP_SCALARS})


def _codes(model: object, feature: str, values: tuple[str, ...]) -> list[int] | None:
    """The model's category code of each value, or None when it takes no codes for ``feature`` (then a dict
    model reads the name, as the node log holds it)."""
    code = getattr(model, "category_code", None)
    if code is None:
        return None
    try:
        return [code(feature, v) for v in values]
    except TreewiseError:  # a model that reads the feature as a number
        return None


@dataclass(frozen=True, eq=False)
class FeatureLayout:
    """Per request: the matrix column of every source the level fills, and the categoricals' codes."""

    names: tuple[str, ...]  # the model's features, in matrix column order
    cols: np.ndarray  # [len(SOURCES)] int64: the column of each per-level source, -1 if unread
    step_map: np.ndarray  # [k, 3] int64: per step scalar read, (column, STEP_SCALARS index, logged as float32)
    type_codes: np.ndarray  # [len(TOKEN_TYPES)] float64: the model's code of each token type (NaN if unseen)
    template: np.ndarray  # [width] float64: a row holding the request's domain code (the level never writes it)
    domain: str
    coded: bool  # the model scores encoded rows (``predict_prefix``); else it takes dicts (``as_dict``)

    @classmethod
    def of(cls, model: object, domain: str) -> FeatureLayout:
        names = tuple(model.feature_names)  # type: ignore[attr-defined]
        unknown = sorted(set(names) - FILLED)
        if unknown:
            raise TreewiseError(f"LearnedTree cannot compute the features {unknown} at run time (it fills "
                                f"{sorted(FILLED)}): train the predictor on those features only")
        types = _codes(model, "token_type", TOKEN_TYPES) if "token_type" in names else None
        domains = _codes(model, "domain", (domain,)) if "domain" in names else None
        template = np.zeros(len(names), dtype=np.float64)
        if "domain" in names:  # an unseen domain is a missing value, as in training
            template[names.index("domain")] = domains[0] if domains is not None and domains[0] >= 0 else math.nan
        sources = _codes(model, "source", ("draft",)) if "source" in names else None
        if "source" in names:
            template[names.index("source")] = sources[0] if sources is not None and sources[0] >= 0 else math.nan
        for name, value in DRAFT_ONLY.items():
            if name in names:
                template[names.index(name)] = value
        cols = [names.index(n) if n in names else -1 for n in SOURCES]
        step_map = [(names.index(n), STEP_SCALARS.index(n), _kind(n) == np.float32) for n in names
                    if n in STEP_SCALARS]
        coded = (isinstance(model, MatrixAcceptanceModel) and ("token_type" not in names or types is not None)
                 and ("domain" not in names or domains is not None) and ("source" not in names or sources is not None))
        return cls(names, np.asarray(cols, dtype=np.int64), np.asarray(step_map, dtype=np.int64).reshape(-1, 3),
                   np.asarray([c if c >= 0 else math.nan for c in types] if types is not None
                              else range(len(TOKEN_TYPES)), dtype=np.float64), template, domain, coded)

    def as_dict(self, x: np.ndarray, m: int) -> dict[str, np.ndarray]:
        """The first ``m`` rows as a dict of columns in the node log's types, the domain as its name and the
        token type as its index into TOKEN_TYPES (what ``Frontier.numeric_features`` hands a predictor)."""
        out: dict[str, np.ndarray] = {}
        for j, name in enumerate(self.names):
            if name == "domain":
                out[name] = np.full(m, self.domain, dtype=object)
            elif name == "source":  # the draft's own candidates: code 0 into SOURCES, as numeric_features gives
                out[name] = np.zeros(m, dtype=np.int64)
            elif name == "token_type":
                out[name] = x[:m, j].astype(np.int64)
            else:
                out[name] = x[:m, j].astype(_kind(name))
        return out


def dict_scorer(model: object, layout: FeatureLayout) -> Callable[[np.ndarray, int], np.ndarray]:
    """Scores the first m rows of the level's matrix with the model's own entry point."""
    if layout.coded:
        prefix = model.predict_prefix  # type: ignore[attr-defined]
        return lambda x, m: np.asarray(prefix(x, m), dtype=np.float64)
    batch = model.predict_batch  # type: ignore[attr-defined]
    return lambda x, m: np.asarray(batch(layout.as_dict(x, m)), dtype=np.float64)

