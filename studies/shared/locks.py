"""An exclusive, advisory lock on a file (``flock``): one writer per shard of a run folder.

The kernel drops the lock when its holder exits, however it exits (kill -9 included), so a lock is never
left stale; the file itself stays and names the last holder, for the message a second writer gets.
"""

from __future__ import annotations

import fcntl
import os
import platform
from pathlib import Path

from treewise.decoder import TreewiseError


class LockedError(TreewiseError):
    """Another process holds the lock."""


class FileLock:
    """Hold with ``acquire`` (non-blocking: a held lock raises ``LockedError``) until ``release``."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = Path(path)
        self.what = what  # for the message: "shard 1/1 of runs/NAME"
        self._fd: int | None = None

    def acquire(self) -> FileLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise LockedError(
                f"{self.what} is being written by {holder} (lock {self.path}): wait for it to finish, "
                "or give this run another --out (or another --shard I/N of the same run)"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {platform.node()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> FileLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
