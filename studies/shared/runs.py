"""On-disk layout of a collect run, its atomic records, and reading every shard back as one run.

    runs/NAME/manifest.json                      settings every shard must share (written once)
    runs/NAME/shards/shard-I-of-N.json           one shard's host, versions, progress
    runs/NAME/nodes/shard-I-of-N/*.parquet       node logs, one part file per finished prompt
    runs/NAME/records/shard-I-of-N/<id>.json     per-prompt record with its per-step columns: the commit
    runs/NAME/steps/shard-I-of-N.parquet         per-step log of the shard (rebuilt from the records)
    runs/NAME/prompts/shard-I-of-N.parquet       per-prompt log of the shard (rebuilt from the records)
    runs/NAME/locks/shard-I-of-N.lock            held (flock) by the one process writing that shard

A prompt counts as finished only once its record exists; the record names its node file, so a node
file without a record (a kill between the two writes) is an orphan: ignored by readers, removed on
resume. A record whose node file is damaged (truncated by a full disk or a copy) is dropped with that file on
resume, so the prompt is collected again. Every file is written to a temporary name, fsynced and renamed;
the manifest is created exclusively (a hard link), so two shards starting at once cannot both write it.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ValidationError

from treewise.decoder import SCHEMA, TreewiseError, read_node_logs
from treewise.decoder.records.atomic import atomic_path, create_exclusive, write_bytes_atomic
from treewise.decoder.records.nodelog import part_is_readable


class RunError(TreewiseError):
    """A run folder that is missing, inconsistent or collected with other settings."""


class StepColumns(BaseModel):
    drafted: list[int] = []
    verified: list[int] = []
    accepted: list[int] = []
    emitted: list[int] = []
    draft_forwards: list[int] = []
    draft_s: list[float] = []
    verify_s: list[float] = []
    other_s: list[float] = []
    policy_s: list[float] = []  # part of other_s spent in the tree policy


class PromptRecord(BaseModel):
    prompt_id: str
    domain: str
    split: str | None
    shard: str
    node_file: str | None  # relative to the run folder; None when nothing was drafted
    node_rows: int
    prompt_tokens: int
    new_tokens: int
    n_steps: int
    drafted: int
    verified: int
    accepted: int
    tau: float
    finish_reason: str
    total_s: float
    tokens_per_s: float
    greedy_checked: bool
    greedy_match: bool | None
    plain_s: float | None
    text: str
    steps: StepColumns


class RunManifest(BaseModel):
    """What every shard of a run must agree on, plus provenance."""

    tree: str
    temperature: float
    max_new_tokens: int
    seed: int
    suite: str
    split: str
    domains: list[str] | None
    shards: int
    prompts: int
    suite_fingerprint: str
    target: str
    draft: str
    target_fingerprint: str  # weights and config, so a retrained pair at the same path is not mixed in
    draft_fingerprint: str
    node_schema_version: str
    versions: dict[str, str]
    created: str

    def must_match(self, other: RunManifest, run_dir: Path) -> None:
        keys = (
            "tree",
            "temperature",
            "max_new_tokens",
            "seed",
            "split",
            "domains",
            "shards",
            "suite_fingerprint",
            "target",
            "draft",
            "target_fingerprint",
            "draft_fingerprint",
            "node_schema_version",
        )
        diffs = [
            f"{k}: run has {getattr(self, k)!r}, asked {getattr(other, k)!r}"
            for k in keys
            if getattr(self, k) != getattr(other, k)
        ]
        if diffs:
            raise RunError(
                f"{run_dir} was collected with other settings ({'; '.join(diffs)}): "
                "pass the run's settings to resume it, or a new --out folder"
            )


def write_json_atomic(path: Path, obj: BaseModel | dict[str, Any]) -> None:
    text = obj.model_dump_json(indent=1) if isinstance(obj, BaseModel) else json.dumps(obj, indent=1)
    write_bytes_atomic(path, text.encode())


def write_table_atomic(path: Path, table: pa.Table) -> None:
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def safe_name(prompt_id: str) -> str:
    """A file-name stem for any prompt id; the hash keeps ids that sanitise alike apart."""
    stem = re.sub(r"[^A-Za-z0-9._-]", "_", prompt_id)[:80]
    return f"{stem}-{hashlib.sha1(prompt_id.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class ShardLayout:
    run_dir: Path
    index: int  # 1-based
    count: int

    @property
    def name(self) -> str:
        return f"shard-{self.index}-of-{self.count}"

    @property
    def nodes_dir(self) -> Path:
        return self.run_dir / "nodes" / self.name

    @property
    def records_dir(self) -> Path:
        return self.run_dir / "records" / self.name

    @property
    def lock_path(self) -> Path:
        return self.run_dir / "locks" / f"{self.name}.lock"

    @property
    def info_path(self) -> Path:
        return self.run_dir / "shards" / f"{self.name}.json"

    def record_path(self, prompt_id: str) -> Path:
        return self.records_dir / f"{safe_name(prompt_id)}.json"


def read_record(path: Path) -> PromptRecord:
    try:
        return PromptRecord.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValidationError) as err:
        raise RunError(
            f"{path}: unreadable prompt record ({_why(err)}); delete it to re-collect that prompt"
        ) from None


def read_records(records_dir: Path) -> list[PromptRecord]:
    return [read_record(p) for p in sorted(records_dir.glob("*.json"))] if records_dir.is_dir() else []


def drop_damaged(layout: ShardLayout, records: list[PromptRecord]) -> tuple[list[PromptRecord], list[str]]:
    """Records whose node file is missing or unreadable, deleted with that file so the prompt is re-collected;
    returns the intact records and the dropped prompt ids."""
    kept, dropped = [], []
    for r in records:
        node = layout.run_dir / r.node_file if r.node_file else None
        if node is None or part_is_readable(node):
            kept.append(r)
            continue
        layout.record_path(r.prompt_id).unlink(missing_ok=True)  # the commit goes first, then its data
        node.unlink(missing_ok=True)
        dropped.append(r.prompt_id)
    return kept, dropped


def create_manifest(run_dir: Path, manifest: RunManifest) -> RunManifest:
    """Write ``manifest`` unless the run has one (created exclusively); return the run's manifest."""
    path = run_dir / "manifest.json"
    if not path.exists():
        create_exclusive(path, manifest.model_dump_json(indent=1).encode())  # False: another shard was first
    existing = read_manifest(run_dir)
    if existing is None:
        raise RunError(f"{path} vanished while the run was starting: rerun the command")
    existing.must_match(manifest, run_dir)
    return existing


def remove_orphans(layout: ShardLayout, records: list[PromptRecord]) -> int:
    """Delete node files and temporaries of prompts that never got their record (killed midway)."""
    referenced = {layout.run_dir / r.node_file for r in records if r.node_file}
    removed = 0
    for folder in (layout.nodes_dir, layout.records_dir):
        if not folder.is_dir():
            continue
        for path in folder.iterdir():
            if path.name.endswith(".tmp") or (path.suffix == ".parquet" and path not in referenced):
                path.unlink()
                removed += 1
    return removed


def read_manifest(run_dir: Path) -> RunManifest | None:
    path = run_dir / "manifest.json"
    if not path.exists():
        return None
    try:
        return RunManifest.model_validate_json(path.read_text(encoding="utf-8"))
    except ValidationError as err:
        raise RunError(f"{path}: not a treewise run manifest ({_why(err)}); restore it from a backup, "
                       "or collect into a new --out") from None


def _why(err: Exception) -> str:
    """The first problem of a pydantic error (its own first line only says how many there are)."""
    if isinstance(err, ValidationError):
        first = err.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        return f"{where}: {first['msg']}" if where else first["msg"]
    return (str(err).splitlines() or [type(err).__name__])[0]


def steps_table(records: list[PromptRecord]) -> pa.Table:
    cols: dict[str, list] = {"prompt_id": [], "domain": [], "step": []}
    fields = list(StepColumns.model_fields)
    cols |= {f: [] for f in fields}
    for r in records:
        n = len(r.steps.accepted)
        cols["prompt_id"] += [r.prompt_id] * n
        cols["domain"] += [r.domain] * n
        cols["step"] += list(range(n))
        for f in fields:
            cols[f] += getattr(r.steps, f)
    return pa.table(cols)


def prompts_table(records: list[PromptRecord]) -> pa.Table:
    rows = [r.model_dump(exclude={"steps", "text"}) for r in records]
    if not rows:
        rows_schema = {k: [] for k in PromptRecord.model_fields if k not in ("steps", "text")}
        return pa.table(rows_schema)
    return pa.Table.from_pylist(rows)


def export_shard_logs(layout: ShardLayout, records: list[PromptRecord]) -> None:
    """Rewrite the shard's per-step and per-prompt parquet logs from its records."""
    write_table_atomic(layout.run_dir / "steps" / f"{layout.name}.parquet", steps_table(records))
    write_table_atomic(layout.run_dir / "prompts" / f"{layout.name}.parquet", prompts_table(records))


@dataclass
class RunData:
    """Every finished prompt of every shard of a run, as tables."""

    run_dir: Path
    manifest: RunManifest
    nodes: pa.Table
    steps: pa.Table
    prompts: pa.Table
    records: list[PromptRecord]
    shards_seen: list[str]

    @property
    def missing(self) -> int:
        """Prompts of the run not finished yet (a shard still running or not started, refused prompts)."""
        return self.manifest.prompts - len(self.records)


def load_run(run_dir: str | Path) -> RunData:
    """Read all shards of a run as one: committed records, the node files they name, no orphans."""
    run_dir = Path(run_dir)
    manifest = read_manifest(run_dir)
    if manifest is None:
        raise RunError(
            f"{run_dir} is not a collect run (no manifest.json): run `treewise collect --out {run_dir}` first"
        )
    shard_dirs = sorted(p for p in (run_dir / "records").glob("shard-*") if p.is_dir())
    records = [r for d in shard_dirs for r in read_records(d)]
    ids = [r.prompt_id for r in records]
    if len(ids) != len(set(ids)):
        dup = sorted({i for i in ids if ids.count(i) > 1})[:5]
        raise RunError(
            f"{run_dir}: prompts recorded by more than one shard ({dup}); shards of one run must use the same --shard N"
        )
    if not records:
        raise RunError(f"{run_dir}: no finished prompts yet; run `treewise collect --out {run_dir}`")
    tables = [read_node_logs(run_dir / r.node_file) for r in records if r.node_file]
    nodes = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
    return RunData(
        run_dir, manifest, nodes, steps_table(records), prompts_table(records), records, [d.name for d in shard_dirs]
    )
