"""What every ``treewise`` command does alike: read option defaults from a config model, report a user
error in one red line, write a ``--json`` or ``--markdown`` output atomically."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import typer
from pydantic import BaseModel, ValidationError
from rich.console import Console
from rich.progress import Progress, TextColumn

if TYPE_CHECKING:
    from .pairs import ResolvedPair


def option_default(model: type[BaseModel], name: str) -> Any:
    """A config field's default without building the whole config (defaults live once, in the model)."""
    return model.model_fields[name].get_default(call_default_factory=True)


def user_errors() -> tuple[type[Exception], ...]:
    """Errors whose message names the problem and its fix: printed in one line, no traceback.

    Imported when a command runs (the decoder imports torch); ``SuiteError`` and ``RunError`` are
    ``TreewiseError``s.
    """
    from treewise.decoder import NodeLogError, TreewiseError

    return (TreewiseError, NodeLogError, ValidationError)


def fail(console: Console, err: Exception | str, code: int = 2) -> NoReturn:
    """Print the error's first line (pydantic's messages run long) and exit with ``code``."""
    text = str(err).splitlines()[0] if isinstance(err, ValidationError) else str(err)
    console.print(f"[red]error:[/] {text}")
    raise typer.Exit(code)


def write_text(path: Path, text: str, console: Console | None = None) -> Path:
    """Write a command's output file atomically (decoder.records.atomic: temp file, fsync, rename), so a reader never
    sees half a JSON; say so on ``console`` when given."""
    from treewise.decoder.records.atomic import (
        write_bytes_atomic,  # the decoder imports torch: only once a command writes
    )

    write_bytes_atomic(path, text.encode("utf-8"))
    if console is not None:
        console.print(f"wrote {path}")
    return path


def write_json(path: Path, model: BaseModel, console: Console | None = None) -> Path:
    return write_text(path, model.model_dump_json(indent=1), console)


def open_pair(console: Console, name: str | None, target: str | Path | None = None,
              draft: str | Path | None = None, files: bool = True) -> ResolvedPair:
    """Resolve the command's model pair (``studies.shared.pairs.resolve_pair``) under a transient progress line,
    since the real pair's first use fetches and converts its target; then say which data files it borrows
    (``files=False``: the command reads none of them)."""
    from .pairs import resolve_pair

    with Progress(TextColumn("{task.description}"), console=console, transient=True) as progress:
        task = progress.add_task(f"model pair {name or ''}".rstrip(), total=None)
        pair = resolve_pair(name, target, draft, on_stage=lambda s: progress.update(task, description=s))
    for note in pair.files.borrowed if files else ():
        console.print(f"[yellow]note:[/] {pair.name} pair: {note}")
    return pair
