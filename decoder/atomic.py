"""Atomic file writes: a temp file in the same folder, then ``os.replace``; nothing half-written is left."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
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
