"""From node logs to a feature matrix: which rows train the predictor, their labels, and the encoding.

Rows: nodes that were verified and whose parent was accepted (a root child, or a parent on the accepted
path), so the predictor learns *conditional* acceptance, the quantity a tree policy multiplies along a
path. Hard label: ``target_argmax_match``. Soft label: ``accept_prob`` where the sampling verifier tried
the node, else ``target_prob``, else (both NaN) the hard label.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from treewise.decoder.errors import TreewiseError
from treewise.decoder.records.nodelog import FEATURE_COLUMNS, SCHEMA_VERSION, SOURCES, TOKEN_TYPES

from .derived import DERIVED_COLUMNS, derived_columns, parent_row

FEATURE_SCHEMA_VERSION = "1"
# Every column a predictor may use: the node log's pre-verification columns and the derived ones.
ALL_FEATURE_COLUMNS: dict[str, pa.DataType] = {**FEATURE_COLUMNS, **DERIVED_COLUMNS}
FeatureKind = Literal["numeric", "categorical"]


class FeatureSchemaError(TreewiseError):
    """Features given to a predictor do not match the schema it was trained with."""


@dataclass(frozen=True)
class FeatureSpec:
    name: str
    dtype: str  # the node-log arrow type, e.g. "float", "int16", "string"
    kind: FeatureKind
    categories: list[str] | None = None  # code i <-> categories[i]; unknown values are missing


@dataclass(frozen=True)
class FeatureSchema:
    features: list[FeatureSpec]
    version: str = FEATURE_SCHEMA_VERSION
    node_log_schema_version: str = SCHEMA_VERSION

    @property
    def names(self) -> list[str]:
        return [f.name for f in self.features]

    @property
    def categorical(self) -> list[str]:
        return [f.name for f in self.features if f.kind == "categorical"]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> FeatureSchema:
        return cls(
            features=[FeatureSpec(**f) for f in data["features"]],
            version=str(data["version"]),
            node_log_schema_version=str(data["node_log_schema_version"]),
        )

    def check_keys(self, given: Mapping[str, object]) -> None:
        """Raise naming the missing and extra feature columns (the fix: pass exactly ``names``)."""
        missing = [n for n in self.names if n not in given]
        extra = sorted(k for k in given if k not in set(self.names))
        if missing or extra:
            raise FeatureSchemaError(
                f"feature columns do not match the predictor's schema: missing {missing}, extra {extra}; "
                f"pass exactly predictor.feature_names = {self.names}"
            )


def build_schema(table: pa.Table, names: list[str]) -> FeatureSchema:
    """Fix the feature list and the category lists (domains seen in the logs, all token types)."""
    strings = [n for n in names if n in FEATURE_COLUMNS and pa.types.is_string(FEATURE_COLUMNS[n])]
    return schema_from_columns({n: _np(table, n) for n in strings}, names)


def schema_from_columns(columns: Mapping[str, np.ndarray], names: list[str]) -> FeatureSchema:
    """As ``build_schema``, from numpy columns: a categorical's categories are the values these rows hold
    (all ``TOKEN_TYPES`` for the token type, all ``SOURCES`` for the source), so a domain absent from them is a
    missing value."""
    specs = []
    for name in names:
        dtype = ALL_FEATURE_COLUMNS[name]
        if pa.types.is_string(dtype):
            fixed = {"token_type": TOKEN_TYPES, "source": SOURCES}.get(name)
            cats = list(fixed) if fixed is not None else sorted(
                {v for v in np.asarray(columns[name]).tolist() if v is not None}
            )
            specs.append(FeatureSpec(name, str(dtype), "categorical", cats))
        else:
            specs.append(FeatureSpec(name, str(dtype), "numeric"))
    return FeatureSchema(specs)


@dataclass
class NodeRows:
    """The training rows of some node logs, as numpy columns plus labels and split groups."""

    columns: dict[str, np.ndarray]  # every FEATURE_COLUMNS and DERIVED_COLUMNS column
    hard: np.ndarray  # float64 0/1
    soft: np.ndarray  # float64 in [0, 1]
    group: np.ndarray  # split group key per row (prompt or request)
    request: np.ndarray  # request key per row (run_id + prompt_id), for online baselines
    n_logged: int = 0  # rows in the logs before selection
    n_soft_fallback: int = field(default=0)  # rows whose soft label fell back to the hard label

    def __len__(self) -> int:
        return len(self.hard)

    def label(self, kind: str) -> np.ndarray:
        return self.hard if kind == "hard" else self.soft

    def subset(self, mask: np.ndarray) -> NodeRows:
        return NodeRows(
            columns={k: v[mask] for k, v in self.columns.items()},
            hard=self.hard[mask],
            soft=self.soft[mask],
            group=self.group[mask],
            request=self.request[mask],
            n_logged=self.n_logged,
            n_soft_fallback=int(self.n_soft_fallback),
        )


def _strings(col: pa.ChunkedArray) -> np.ndarray:
    """Object array of a string column; via the dictionary, since logs repeat few distinct values."""
    encoded = pc.dictionary_encode(col).combine_chunks()
    words = np.asarray(encoded.dictionary.to_pylist(), dtype=object)
    return words[encoded.indices.to_numpy(zero_copy_only=False)] if len(words) else np.zeros(len(col), object)


def _np(table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    if pa.types.is_string(col.type):
        return _strings(col)
    if pa.types.is_boolean(col.type):
        return np.asarray(col.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool)
    return np.asarray(col.to_numpy(zero_copy_only=False))


def request_keys(table: pa.Table) -> np.ndarray:
    return _strings(pc.binary_join_element_wise(table.column("run_id"), table.column("prompt_id"), "\x1f"))


def conditional_mask(table: pa.Table, request: np.ndarray) -> np.ndarray:
    """Verified nodes whose parent was accepted (depth 1, or the parent row is on the accepted path)."""
    req = np.unique(request, return_inverse=True)[1].astype(np.int64)
    step = _np(table, "step").astype(np.int64)
    node = _np(table, "node_id").astype(np.int64)
    parent = _np(table, "parent_id").astype(np.int64)
    at = parent_row(req, step, node, parent)
    parent_on_path = np.zeros(len(at), dtype=bool)
    found = at >= 0
    parent_on_path[found] = _np(table, "on_accepted_path")[at[found]]
    depth = _np(table, "depth")
    return _np(table, "verified") & ((depth == 1) | parent_on_path)


def select_rows(table: pa.Table, split_by: str = "prompt_id", untried: bool = False) -> NodeRows:
    """The predictor's rows and labels from a node-log table (see the module docstring).

    ``untried=True`` keeps every verified row, also those under a rejected parent (a replay of whole
    verified trees needs them); the boolean columns ``tried`` and ``on_accepted_path`` tell them apart.
    """
    request_all = request_keys(table)
    mask = conditional_mask(table, request_all)
    needed = ("step", "node_id", "parent_id", "draft_margin", "draft_entropy", "on_accepted_path", "verified")
    raw = {n: _np(table, n) for n in needed}
    derived = derived_columns(raw, request_all, mask)
    keep = raw["verified"] if untried else mask
    sub = table.filter(pa.array(keep))
    columns = {name: _np(sub, name) for name in FEATURE_COLUMNS}
    columns.update({name: col[keep] for name, col in derived.items()})
    columns["tried"], columns["on_accepted_path"] = mask[keep], raw["on_accepted_path"][keep]
    hard = _np(sub, "target_argmax_match").astype(np.float64)
    accept = _np(sub, "accept_prob").astype(np.float64)
    target = _np(sub, "target_prob").astype(np.float64)
    soft = np.where(np.isnan(accept), target, accept)
    fallback = np.isnan(soft)
    soft = np.clip(np.where(fallback, hard, soft), 0.0, 1.0)
    request = request_all[keep]
    group = columns["prompt_id"] if split_by == "prompt_id" else request
    return NodeRows(columns, hard, soft, group, request, table.num_rows, int(fallback[columns["tried"]].sum()))


def encode(columns: Mapping[str, np.ndarray], schema: FeatureSchema, out: np.ndarray | None = None) -> np.ndarray:
    """Feature matrix (rows x features, float64) in schema order; categories become codes, unknown NaN.

    Categorical columns may also be given as integer codes already (index into the schema's categories).
    """
    names = schema.names
    n = len(columns[names[0]])
    x = out[:n] if out is not None and out.shape[0] >= n else np.empty((n, len(names)), dtype=np.float64)
    for j, spec in enumerate(schema.features):
        col = np.asarray(columns[spec.name])
        if len(col) != n:
            raise FeatureSchemaError(
                f"feature {spec.name!r} has {len(col)} values, {names[0]!r} has {n}: give one value per candidate"
            )
        if spec.kind == "categorical" and col.dtype.kind in "OUS":
            lut = _lookup(spec)
            x[:, j] = [lut.get(v, math.nan) for v in col.tolist()]
        else:
            x[:, j] = col
    return x


_LOOKUPS: dict[tuple[str, ...], dict[str, float]] = {}


def _lookup(spec: FeatureSpec) -> dict[str, float]:
    cats = tuple(spec.categories or ())
    lut = _LOOKUPS.get(cats)
    if lut is None:
        lut = _LOOKUPS[cats] = {c: float(i) for i, c in enumerate(cats)}
    return lut
