"""``treewise bench --contend N``: the busy processes run during the block and are gone after it."""

from __future__ import annotations

import os

import pytest

from treewise.studies.bench.contend import contention


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is not running
        return f.read().split(") ")[1][0] != "Z"


def test_contention_runs_busy_processes_only_inside_the_block() -> None:
    with contention(2) as pids:
        assert len(pids) == 2 and all(_alive(p) for p in pids)
    assert not any(_alive(p) for p in pids)
    with pytest.raises(RuntimeError), contention(1) as pids:
        raise RuntimeError("the bench failed")
    assert not any(_alive(p) for p in pids)
    with contention(0) as none:
        assert none == []


def test_busy_processes_stop_when_the_bench_is_killed() -> None:
    """kill -9 skips the block's cleanup: each busy process notices its parent is gone and stops."""
    import signal
    import subprocess
    import sys
    import time

    code = ("import time\nfrom treewise.studies.bench.contend import contention\n"
            "with contention(1) as pids:\n    print(pids[0], flush=True)\n    time.sleep(60)\n")
    bench = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    busy = int(bench.stdout.readline())
    assert _alive(busy)
    os.kill(bench.pid, signal.SIGKILL)
    bench.wait()
    deadline = time.monotonic() + 20
    while _alive(busy) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(busy)
