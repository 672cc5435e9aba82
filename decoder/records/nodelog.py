"""Node log: one row per drafted node, features known before verification plus labels from it.

The schema here is the contract between the decoder (producer) and the studies and the predictor
(consumers). Files are parquet, one row group per request, written atomically (temp file + rename),
with ``treewise.schema_version`` in the file metadata.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from treewise.decoder.errors import TreewiseError

from .atomic import atomic_path

SCHEMA_VERSION = "1"
METADATA_KEY = b"treewise.schema_version"

TOKEN_TYPES: tuple[str, ...] = (
    "word_start",
    "word_cont",
    "digit",
    "punct",
    "whitespace",
    "code_symbol",
    "special",
)

# Who proposed a node, by code (decoder.candidates.merge): the draft model, a lookup source alone, or both.
SOURCES: tuple[str, ...] = ("draft", "lookup", "both")

# Columns known before the verify pass: what a predictor may use as features.
FEATURE_COLUMNS: dict[str, pa.DataType] = {
    "run_id": pa.string(),
    "prompt_id": pa.string(),
    "domain": pa.string(),
    "step": pa.int32(),
    "node_id": pa.int32(),  # index in the step's candidate list; the root is not a row
    "parent_id": pa.int32(),  # -1 when the parent is the root
    "depth": pa.int16(),  # 1 for the root's children
    "sibling_rank": pa.int16(),  # 0 for the parent's most likely child
    "token_id": pa.int32(),
    "token_type": pa.string(),  # one of TOKEN_TYPES
    "draft_logprob": pa.float32(),
    "draft_entropy": pa.float32(),  # entropy (nats) of the draft distribution the token was drawn from
    "draft_margin": pa.float32(),  # top1 - top2 probability of that distribution
    "path_logprob": pa.float32(),  # sum of draft log-probs from the root to this node
    "parent_draft_prob": pa.float32(),  # 1.0 for the root's children
    "position": pa.int32(),  # index in the output of the token this node would become
    "prompt_len": pa.int32(),
    "running_accept_rate": pa.float32(),  # conditional acceptance of this request's earlier steps, NaN at step 0
    "prev_accepted": pa.int16(),  # draft tokens accepted in the previous step, -1 at step 0
    "temperature": pa.float32(),
    # Who proposed the node (decoder.candidates.merge): "draft", "lookup" (a free candidate alone) or "both". A lookup
    # node's draft columns are NaN (rank -1) where the draft never expanded its parent.
    "source": pa.string(),
    "lookup_prob": pa.float32(),  # share of the matched occurrences continuing with it given its parent; NaN
    "lookup_count": pa.int32(),  # matched occurrences continuing with its path; 0 for the draft's alone
    "match_len": pa.int16(),  # tokens of the context's suffix the lookup matched; 0 for the draft's alone
}
# Added after files of this schema version were written: read from older files as these values.
ADDED_COLUMNS: dict[str, object] = {"source": "draft", "lookup_prob": float("nan"), "lookup_count": 0, "match_len": 0}

# Columns from the verify pass: labels.
LABEL_COLUMNS: dict[str, pa.DataType] = {
    "verified": pa.bool_(),  # kept by the policy and sent to the target
    "target_prob": pa.float32(),  # target probability of the token at the parent (after warping)
    "target_argmax_match": pa.bool_(),  # token == target argmax at the parent: conditional acceptance
    "on_accepted_path": pa.bool_(),
    "accept_prob": pa.float32(),  # probability the sampling verifier accepted with; NaN if not tried
}

# Each column's numpy type (strings are object arrays): what feature_columns casts to.
NUMPY_TYPES: dict[str, type] = {
    name: dtype.to_pandas_dtype() for name, dtype in {**FEATURE_COLUMNS, **LABEL_COLUMNS}.items()
}

SCHEMA = pa.schema(
    [pa.field(name, dtype) for name, dtype in {**FEATURE_COLUMNS, **LABEL_COLUMNS}.items()],
    metadata={METADATA_KEY: SCHEMA_VERSION.encode()},
)


def feature_columns(m: int, values: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Columns for ``m`` nodes, each cast to its schema type; a scalar value is repeated ``m`` times.

    The one place node features get their types: ``Frontier.features()`` (what a policy's predictor sees
    before verification) and the node-log rows (``logrows.step_rows``) are both built here.
    """
    return {name: np.asarray(value).astype(NUMPY_TYPES[name], copy=False) if np.ndim(value)
            else np.full(m, value, dtype=NUMPY_TYPES[name]) for name, value in values.items()}


class NodeLogError(TreewiseError):
    """A node log file is missing, malformed or of another schema version."""


@dataclass
class NodeLogWriter:
    """Buffers node rows and writes parquet part files atomically.

    Each ``flush`` writes one new part file (one row group per finished request), so a process killed
    midway leaves every flushed request readable and no half-written file under its final name.
    """

    directory: Path
    flush_every: int = 1  # requests per part file
    prefix: str = "nodes"
    _pending: list[pa.Table] = field(default_factory=list, repr=False)
    _current: list[dict[str, np.ndarray]] = field(default_factory=list, repr=False)
    _written: list[Path] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self.directory = Path(self.directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def add_step(self, columns: dict[str, np.ndarray]) -> None:
        """Add one step's rows: a dict of equal-length arrays keyed by schema column."""
        self._current.append(columns)

    def end_request(self) -> None:
        """Close the rows of the current request; flush if enough requests are pending."""
        if self._current:
            self._pending.append(_to_table(self._current))
            self._current = []
        if len(self._pending) >= self.flush_every:
            self.flush()

    def flush(self) -> Path | None:
        if not self._pending:
            return None
        path = self.directory / f"{self.prefix}-{uuid.uuid4().hex[:12]}.parquet"
        write_atomic(self._pending, path)
        self._pending = []
        self._written.append(path)
        return path

    def close(self) -> None:
        self.end_request()
        self.flush()

    @property
    def written(self) -> list[Path]:
        return list(self._written)

    def __enter__(self) -> NodeLogWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        # Requests still open when an exception escapes are dropped, finished ones are kept.
        self._current = []
        self.flush()


def _to_table(steps: list[dict[str, np.ndarray]]) -> pa.Table:
    cols = {name: np.concatenate([s[name] for s in steps]) for name in SCHEMA.names}
    return pa.Table.from_pydict(cols, schema=SCHEMA)


def write_atomic(tables: Iterable[pa.Table], path: Path) -> None:
    """Write tables as row groups of one parquet file, atomically."""
    with atomic_path(path) as tmp, pq.ParquetWriter(tmp, SCHEMA) as writer:
        for table in tables:
            writer.write_table(table)


def read_node_logs(path: str | Path) -> pa.Table:
    """Read one parquet file or every ``*.parquet`` under a folder (recursively) as one table.

    A run folder written by ``treewise collect`` keeps its node logs under ``nodes/``; that is what is read.
    """
    path = Path(path)
    if (path / "nodes").is_dir():
        path = path / "nodes"
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise NodeLogError(f"no node-log parquet files under {path}: run `treewise collect` first")
    return pa.concat_tables([_read_part(f) for f in files])


def _read_part(f: Path) -> pa.Table:
    """One part file, checked: a truncated or corrupt file (a crash mid-copy, a full disk) is named."""
    try:
        meta = pq.read_schema(f).metadata or {}
    except (pa.ArrowException, OSError) as err:
        raise NodeLogError(f"{f}: truncated or corrupt parquet file ({_first_line(err)}); {_FIX}") from None
    version = meta.get(METADATA_KEY, b"?").decode(errors="replace")
    if version != SCHEMA_VERSION:
        raise NodeLogError(
            f"{f}: node-log schema version {version!r}, this treewise reads {SCHEMA_VERSION!r}; "
            "re-collect the logs with this version"
        )
    try:
        present = set(pq.read_schema(f).names)
        table = pq.read_table(f, columns=[n for n in SCHEMA.names if n in present])
        for name, value in ADDED_COLUMNS.items():
            if name not in present:
                table = table.append_column(name, pa.array([value] * table.num_rows, SCHEMA.field(name).type))
        return table.select(SCHEMA.names).cast(SCHEMA)
    except (pa.ArrowException, OSError) as err:
        raise NodeLogError(f"{f}: corrupt node-log parquet file ({_first_line(err)}); {_FIX}") from None


_FIX = "rerun the `treewise collect` that wrote it (a resume re-collects damaged prompts) or delete it"


def _first_line(err: Exception) -> str:
    """The first sentence of an Arrow message (they run to several)."""
    text = (str(err).splitlines() or [type(err).__name__])[0]
    return text.split(". ")[0].rstrip(".")


def part_is_readable(path: Path) -> bool:
    """Whether a node-log part has an intact parquet footer of this schema version (cheap: no data read)."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except (pa.ArrowException, OSError):
        return False
    return meta.get(METADATA_KEY) == SCHEMA_VERSION.encode()
