"""What every ``treewise`` command does alike: read option defaults from a config model, report a user
error in one red line, write a ``--json`` result."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NoReturn

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console


def option_default(model: type[BaseModel], name: str) -> Any:
    """A config field's default without building the whole config (defaults live once, in the model)."""
    return model.model_fields[name].get_default(call_default_factory=True)


def user_errors() -> tuple[type[Exception], ...]:
    """Errors whose message names the problem and its fix: printed in one line, no traceback.

    Imported when a command runs (the decoder imports torch); ``SuiteError`` and ``RunError`` are
    ``TreewiseError``s.
    """
    from decoder import NodeLogError, TreewiseError

    return (TreewiseError, NodeLogError, ValidationError)


def fail(console: Console, err: Exception | str, code: int = 2) -> NoReturn:
    """Print the error's first line (pydantic's messages run long) and exit with ``code``."""
    text = str(err).splitlines()[0] if isinstance(err, ValidationError) else str(err)
    console.print(f"[red]error:[/] {text}")
    raise typer.Exit(code)


def write_json(path: Path, model: BaseModel, console: Console) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(model.model_dump_json(indent=1), encoding="utf-8")
    console.print(f"wrote {path}")
