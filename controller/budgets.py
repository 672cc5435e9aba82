"""Per-domain tree budgets: ``data/budgets.json``, written by the Optuna tuner, read by the controller.

The defaults live only in the fields of :class:`DomainBudget`. A missing *default* file means "no tuning
yet" and yields those built-in defaults (``provenance`` is then ``None``); a missing *explicit* file is an
error, since the caller asked for that file by name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from treewise.decoder import TreewiseError
from treewise.decoder.paths import data_dir
from treewise.decoder.records.atomic import write_bytes_atomic

BUDGETS_FILE = "budgets.json"
_FORMAT_HINT = 'expected {"version": 1, "default": {...}, "domains": {"<domain>": {...}}, "provenance": {...}}'


class BudgetError(TreewiseError):
    """The budgets file is missing, unreadable or invalid; the message names the file, the field and the fix."""


class DomainBudget(BaseModel):
    """How large a tree one decoding step may verify, and which policy grows it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    policy: Literal["static", "confidence", "learned"] = "learned"
    node_budget: int = Field(32, ge=1, le=1024, description="most tree nodes verified per step")
    max_depth: int = Field(6, ge=1, le=32, description="deepest tree level drafted")
    max_width: int = Field(4, ge=1, le=32, description="children drafted per expanded node")
    threshold: float = Field(
        0.02, ge=0.0, le=1.0,
        description="least predicted path value (path probability for confidence) to keep a node",
    )
    cost_scale: float = Field(
        1.0, ge=0.0, le=10.0, description="multiplies LearnedTree's latency-based stop rule; 0 disables it"
    )


class Provenance(BaseModel):
    """Where a budgets file came from (the tuning command and study), so a tuned result can be reproduced."""

    model_config = ConfigDict(extra="forbid")

    command: str
    trials: int = Field(ge=0)
    wall_s: float = Field(ge=0.0)
    created: str
    study_name: str | None = None
    storage: str | None = None
    notes: str = ""


class BudgetsFile(BaseModel):
    """A default budget plus per-domain overrides."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    default: DomainBudget
    domains: dict[str, DomainBudget] = Field(default_factory=dict)
    provenance: Provenance | None = None

    def for_domain(self, domain: str) -> DomainBudget:
        """The budget of ``domain``; unknown domains (and ``"auto"`` before classification) get the default."""
        return self.domains.get(domain, self.default)


def default_budgets_path() -> Path:
    return data_dir() / BUDGETS_FILE


def load_budgets(path: str | Path | None = None) -> BudgetsFile:
    """Read and validate a budgets file (default ``data_dir()/budgets.json``).

    Raises :class:`BudgetError` for a missing explicit file, bad JSON, a wrong version or an invalid field.
    """
    explicit = path is not None
    file = Path(path) if explicit else default_budgets_path()
    if not file.exists():
        if not explicit:
            return BudgetsFile(default=DomainBudget())
        raise BudgetError(
            f"{file}: budgets file not found; pass an existing file, or omit the path to use the built-in "
            f"defaults ({default_budgets_path()} when present); `treewise tune` writes one"
        )
    try:
        raw = json.loads(file.read_text(encoding="utf-8"))
    except OSError as err:
        raise BudgetError(f"{file}: cannot read budgets file: {err.strerror or err}") from None
    except UnicodeDecodeError as err:
        raise BudgetError(f"{file}: not UTF-8 text (byte {err.start}); save it as UTF-8 JSON, {_FORMAT_HINT}") from None
    except json.JSONDecodeError as err:
        raise BudgetError(
            f"{file}: not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}); fix the syntax, "
            f"{_FORMAT_HINT}"
        ) from None
    if not isinstance(raw, dict):
        raise BudgetError(f"{file}: top level is {type(raw).__name__}, not an object; {_FORMAT_HINT}")
    if raw.get("version", 1) != 1:
        raise BudgetError(
            f"{file}: field 'version' is {raw['version']!r} but this treewise reads version 1; "
            "rewrite the file with `treewise tune` or set \"version\": 1"
        )
    try:
        return BudgetsFile.model_validate(raw)
    except ValidationError as err:
        raise BudgetError(f"{file}: {_describe(err)}") from None


def _describe(err: ValidationError) -> str:
    """One line per invalid field: dotted path, what is wrong, and the fix."""
    lines = []
    for e in err.errors():
        where = ".".join(str(x) for x in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            fix = f"remove it (allowed: {_allowed_fields(e['loc'])})"
        elif e["type"] == "missing":
            fix = "add it"
        else:
            fix = f"got {e.get('input')!r}{_allowed_range(e['loc'])}"
        lines.append(f"field '{where}': {e['msg']}; {fix}")
    return "invalid budgets file: " + "; ".join(lines)


def _model_at(parent: tuple[int | str, ...]) -> type[BaseModel]:
    """The model whose fields sit at ``parent`` (a pydantic error location minus its last element)."""
    if not parent:
        return BudgetsFile
    if parent[0] == "provenance":
        return Provenance
    return DomainBudget  # default, or domains.<name>


def _allowed_fields(loc: tuple[int | str, ...]) -> str:
    """The field names valid next to ``loc``, so an unknown-field error lists the alternatives."""
    return ", ".join(_model_at(loc[:-1]).model_fields)


def _allowed_range(loc: tuple[int | str, ...]) -> str:
    """``"; allowed LO..HI"`` for a bounded field (read from its constraints, the only copy), else ``""``."""
    field = _model_at(loc[:-1]).model_fields.get(str(loc[-1])) if loc else None
    if field is None:
        return ""
    lo = next((m.ge for m in field.metadata if hasattr(m, "ge")), None)
    hi = next((m.le for m in field.metadata if hasattr(m, "le")), None)
    return f"; allowed {lo}..{hi}" if lo is not None and hi is not None else ""


def save_budgets(budgets: BudgetsFile, path: str | Path) -> Path:
    """Write ``budgets`` as JSON atomically (temp file in the same folder, then ``os.replace``)."""
    text = json.dumps(budgets.model_dump(mode="json"), indent=2) + "\n"
    return write_bytes_atomic(path, text.encode("utf-8"))
