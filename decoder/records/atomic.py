"""Atomic file writes: a temp file in the same folder, then ``os.replace``; nothing half-written is left."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | Path, mode: int = 0o644) -> Iterator[Path]:
    """Yield a temp path next to ``path`` for any writer; on success fsync it and rename it onto ``path``.

    On error the temp file is removed and ``path`` keeps its old content. ``mode`` because mkstemp files are
    owner-only. Temp names end in ``.tmp`` so folder scans can skip them.
    """
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".tmp", dir=file.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, file)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes_atomic(path: str | Path, data: bytes, mode: int = 0o644) -> Path:
    """Write ``data`` to ``path`` atomically."""
    with atomic_path(path, mode) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def create_exclusive(path: str | Path, data: bytes, mode: int = 0o644) -> bool:
    """Create ``path`` holding ``data`` unless it exists; False when another writer created it first.

    The content is complete before it gets its name (a hard link from a synced temp file), so a reader
    never sees a half-written file, and of two concurrent creators exactly one wins.
    """
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{file.name}.", suffix=".tmp", dir=file.parent)
    try:
        view = memoryview(data)
        while view:  # a short write (a full disk raises) must not be linked as complete
            view = view[os.write(fd, view):]
        os.fsync(fd)
        os.fchmod(fd, mode)
        os.link(name, file)
        return True
    except FileExistsError:
        return False
    finally:
        os.close(fd)
        os.unlink(name)


@contextmanager
def atomic_dir(path: str | Path, owned: Collection[str] = ()) -> Iterator[Path]:
    """Yield an empty staging folder next to ``path``; on success it replaces ``path`` as a whole.

    For artifacts made of several files that only make sense together (a predictor: model + feature schema
    + calibration). The old folder is renamed aside, the new one renamed in, then entries of the old one the
    new one lacks and that are not ``owned`` by the artifact (files a user keeps there) are moved over and the
    old one removed. A kill at any point
    leaves either the old or the new folder complete; ``recover_dir`` (run by readers and writers) finishes
    or undoes an interrupted swap.
    """
    final = Path(path)
    final.parent.mkdir(parents=True, exist_ok=True)
    recover_dir(final, owned)
    stage = Path(tempfile.mkdtemp(prefix=f".{final.name}.new-", dir=final.parent))
    try:
        yield stage
        for file in stage.rglob("*"):
            if file.is_file():
                with open(file, "rb") as handle:
                    os.fsync(handle.fileno())
        os.chmod(stage, 0o755)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    if final.exists():
        old = final.parent / f".{final.name}.old-{stage.name.rsplit('-', 1)[-1]}"
        os.rename(final, old)
        os.rename(stage, final)
        _finish_swap(final, old, owned)
    else:
        os.rename(stage, final)


def recover_dir(path: str | Path, owned: Collection[str] = ()) -> None:
    """Finish or undo a swap of ``atomic_dir`` that a kill interrupted; a no-op otherwise."""
    final = Path(path)
    olds = sorted(final.parent.glob(f".{final.name}.old-*")) if final.parent.is_dir() else []
    for old in olds:
        if not final.exists():
            os.rename(old, final)  # killed between the two renames: the old folder comes back
        else:
            _finish_swap(final, old, owned)


def _finish_swap(final: Path, old: Path, owned: Collection[str]) -> None:
    for entry in old.iterdir():
        if entry.name not in owned and not (final / entry.name).exists():
            os.rename(entry, final / entry.name)
    shutil.rmtree(old)
