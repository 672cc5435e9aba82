"""Workers started at once on a fresh storage all open it: creating Optuna's schema is serialised by
`storage_lock` (and its known race errors retried), so none of them exits before its first trial.

Without the lock, 4 processes opening one fresh SQLite file or PostgreSQL database in the same instant failed
in every round tried ("table studies already exists", a unique violation on pg_type): these tests fail there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest

from treewise.studies.tune.storage import TuneError, open_storage, storage_lock

ROOT = Path(__file__).resolve().parents[2]
PG_URL = os.environ.get("TREEWISE_PG_URL")
WORKERS, ROUNDS = 4, 3

# Each worker opens the round's storage at the round's instant (a shared clock, no other synchronisation),
# creates the study with load_if_exists as `tune` does, and prints what happened per round.
_WORKER = """
import json, sys, time
import optuna
from treewise.studies.tune.storage import open_storage, storage_lock
optuna.logging.set_verbosity(optuna.logging.ERROR)
t0, urls = float(sys.argv[1]), sys.argv[2:]
out = []
for k, url in enumerate(urls):
    while time.time() < t0 + 2.0 * k:
        pass
    try:
        storage = open_storage(url)
        with storage_lock(url):
            optuna.create_study(storage=storage, study_name="race", load_if_exists=True)
        out.append("ok")
    except Exception as err:
        out.append(f"{type(err).__name__}: {err}")
print(json.dumps(out))
"""


def _race(urls: list[str]) -> list[list[str]]:
    """What each of WORKERS processes got, per URL, opening every URL at the same instant as the others."""
    t0 = time.time() + 6.0  # the interpreters start and import optuna before the first instant
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", _WORKER, str(t0), *urls], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(WORKERS)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def _all_opened(results: list[list[str]]) -> None:
    failures = [r for worker in results for r in worker if r != "ok"]
    assert not failures, failures


def test_workers_opening_a_fresh_sqlite_file_at_once_all_succeed(tmp_path) -> None:
    _all_opened(_race([f"sqlite:///{tmp_path}/fresh{k}.db" for k in range(ROUNDS)]))


def test_workers_opening_a_fresh_journal_at_once_all_succeed(tmp_path) -> None:
    _all_opened(_race([f"journal:///{tmp_path}/fresh{k}.log" for k in range(ROUNDS)]))


def test_the_lock_leaves_the_journal_backend_its_own_lock_file(tmp_path) -> None:
    """storage_lock once took FILE.lock, the name Optuna's journal backend locks with: every study created under
    it waited out the backend's 30 s grace period."""
    url = f"journal:///{tmp_path}/j.log"
    storage = open_storage(url)
    t0 = time.perf_counter()
    with storage_lock(url):
        optuna.create_study(storage=storage, study_name="one", load_if_exists=True)
    assert time.perf_counter() - t0 < 10


@pytest.mark.postgres
@pytest.mark.skipif(not PG_URL, reason="no PostgreSQL: set TREEWISE_PG_URL (.ci/run starts a throwaway cluster)")
def test_workers_opening_a_fresh_postgresql_database_at_once_all_succeed(fresh_pg_db) -> None:
    _all_opened(_race([fresh_pg_db() for _ in range(ROUNDS)]))


def test_a_held_lock_makes_others_wait_then_fail_in_one_line(tmp_path) -> None:
    url = f"sqlite:///{tmp_path}/held.db"
    released = threading.Event()

    def hold() -> None:
        with storage_lock(url):
            released.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    time.sleep(0.2)
    try:
        with pytest.raises(TuneError) as err, storage_lock(url, wait_s=0.5):
            pass
        assert "\n" not in str(err.value) and "held its lock" in str(err.value) and "held.db" in str(err.value)
    finally:
        released.set()
        holder.join()
    with storage_lock(url, wait_s=0.5):  # released with its holder
        pass


def test_errors_that_are_not_the_race_are_not_retried(tmp_path) -> None:
    (tmp_path / "x.db").write_bytes(b"not a database at all, some bytes" * 100)
    t0 = time.perf_counter()
    with pytest.raises(TuneError, match="cannot be opened: .*not a database"):
        open_storage(f"sqlite:///{tmp_path}/x.db")
    assert time.perf_counter() - t0 < 5  # refused at once, not after a round of jittered retries

