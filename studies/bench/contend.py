"""``treewise bench --contend N``: N CPU-bound processes of the bench's own share the cores for the whole run.

Each runs a single-threaded matrix product in a loop (cache-resident, so it competes for cores, not memory
bandwidth), as another CPU-bound job on the same machine would. They are started before the bench loads
anything and stopped when it ends, however it ends.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

# Each busy process stops by itself once its parent is gone (reparented): a bench killed without running its
# cleanup (SIGTERM, kill -9) leaves no process behind.
# The parent's pid comes as an argument: one read at start could already see the new parent.
_BUSY = ("import os\nimport sys\nimport numpy as np\na = np.random.default_rng(0).random((256, 256))\n"
         "while os.getppid() == int(sys.argv[1]):\n    a = a @ a * 1e-3 + 1.0\n")


@contextmanager
def contention(processes: int) -> Iterator[list[int]]:
    """Run ``processes`` busy processes while the block runs; yields their pids."""
    env = os.environ | {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _BUSY, str(os.getpid())], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(max(processes, 0))]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
