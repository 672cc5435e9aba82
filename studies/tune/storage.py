"""Optuna storage URLs for ``treewise tune``: checked before anything connects, opened with heartbeats.

:func:`parse_storage_url` is pure (no file, driver or network touched) and turns any bad URL into a one-line
:class:`TuneError`; :func:`open_storage` then checks the file or driver and connects. RDB storages (SQLite,
PostgreSQL, MySQL) get a heartbeat: a trial whose worker stops beating (killed, machine lost) is marked FAIL
by the next worker that starts a trial or finalises, and re-queued once more for another worker to run.

Workers started at once on a fresh database all create Optuna's tables, and the database refuses all but
the first (PostgreSQL: a unique violation on ``pg_type``, or "relation already exists"; SQLite: "table
already exists"; Optuna issue #1092). :func:`storage_lock` serialises that first use across processes and
machines (PostgreSQL's advisory lock, MySQL's ``GET_LOCK``, an ``flock`` beside a SQLite or journal file), and
:func:`open_storage` holds it while it connects, retrying the known race errors a few times besides (a process
that does not take the lock, such as optuna-dashboard, may still create the tables at the same moment).
"""

from __future__ import annotations

import random
import re
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from treewise.decoder import TreewiseError
from treewise.studies.shared.locks import FileLock, LockedError

try:  # Optuna >= 4.9 renamed the retry callback and its RDBStorage argument
    from optuna.storages import RetryHeartbeatStaleTrialCallback as _Retry

    _RETRY_ARG = "heartbeat_stale_trial_callback"
except ImportError:  # pragma: no cover - older Optuna
    from optuna.storages import RetryFailedTrialCallback as _Retry

    _RETRY_ARG = "failed_trial_callback"

JOURNAL = "journal://"
BACKENDS = ("sqlite", "postgresql", "mysql")
LOCK_WAIT_S = 120.0  # how long a worker waits for another's first open (creating the schema takes ~1 s)
LOCK_KEY = 0x7472_6565  # PostgreSQL advisory lock key ("tree"); advisory locks are per database
OPEN_ATTEMPTS = 4  # tries of a first open that hits a known race error, jittered apart
# Errors two processes creating Optuna's schema at once get (psycopg, sqlite3, MySQL): retried, never others.
_RACE = re.compile(r"already exists|duplicate key value|UniqueViolation|database is locked|Duplicate entry",
                   re.IGNORECASE)
MAX_RETRY = 2  # a trial re-queued this often after dead workers is left FAILED (it may be what kills them)
_URL_HINT = "use sqlite:///PATH, postgresql://USER@HOST[:PORT]/DB, mysql+pymysql://USER@HOST/DB or journal:///PATH"
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_PASSWORD = re.compile(r"(://[^/@:]*:)[^@]*@")  # scheme://user:PASSWORD@host
# pip packages for the DB-API modules SQLAlchemy imports; psycopg comes with the `postgres` extra.
_INSTALL = {"psycopg": 'pip install -e ".[postgres]" (or pip install "psycopg[binary]")',
            "psycopg2": "pip install psycopg2-binary", "pymysql": "pip install pymysql",
            "MySQLdb": "pip install mysqlclient", "mysql": "pip install mysql-connector-python"}


class TuneError(TreewiseError):
    """Bad tuning input (space, storage, suite, predictor); the message names the problem and the fix."""


@dataclass(frozen=True)
class StorageUrl:
    """A checked storage URL: a journal file, or an RDB ``backend`` reached through SQLAlchemy ``driver``."""

    url: str
    kind: Literal["journal", "rdb"]
    backend: str  # journal, sqlite, postgresql, mysql
    driver: str  # the DB-API SQLAlchemy imports for this URL (psycopg for postgresql://); "" for a journal
    path: Path | None  # the journal or SQLite file
    host: str | None = None
    port: int | None = None


def safe_url(url: str) -> str:
    """``url`` with its password masked, for messages, reports and the budgets file's provenance."""
    return _PASSWORD.sub(r"\1***@", url)


def shown(url: str) -> str:
    """How messages quote a URL: masked, and repr() so a stray newline or space is visible."""
    return repr(safe_url(url))


def _bad(url: str, problem: str) -> TuneError:
    return TuneError(f"storage {shown(url)}: {problem}; {_URL_HINT}")


def parse_storage_url(url: str) -> StorageUrl:
    """Check ``url`` without touching files, drivers or the network; raise a one-line :class:`TuneError`."""
    if not url:
        raise _bad(url, "empty URL")
    if url != url.strip() or _CONTROL.search(url):
        raise _bad(url, "leading/trailing spaces or control characters (a pasted newline?)")
    if url.startswith(JOURNAL):
        path = url[len(JOURNAL):]
        if not path or path.endswith("/"):
            raise _bad(url, "a journal URL needs a file path after journal://")
        return StorageUrl(url, "journal", "journal", "", Path(path))
    if "://" not in url:
        raise _bad(url, "not a URL (no scheme://)")
    from sqlalchemy.engine import make_url

    try:
        parsed = make_url(url)
        port = parsed.port
    except Exception as err:  # ArgumentError, ValueError (a non-numeric port), ...
        raise _bad(url, f"not a valid database URL ({_first_line(err)})") from None
    backend = parsed.get_backend_name()
    if backend not in BACKENDS:
        raise _bad(url, f"unsupported database {backend!r} (Optuna stores studies in {', '.join(BACKENDS)})")
    if port is not None and not 0 < port < 65536:
        raise _bad(url, f"port {port} is outside 1..65535")
    try:
        driver = parsed.get_dialect().driver  # loads SQLAlchemy's dialect, not the driver module itself
    except Exception:
        raise _bad(url, f"SQLAlchemy has no driver {parsed.drivername!r}") from None
    path = None
    if backend == "sqlite":
        if parsed.database in (None, "", ":memory:") or (parsed.database or "").startswith("file::memory:"):
            raise _bad(url, "an in-memory SQLite database keeps nothing between runs or workers; give a file")
        path = Path(parsed.database)  # type: ignore[arg-type]
    return StorageUrl(url, "rdb", backend, driver, path, parsed.host, port)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def _check_driver(spec: StorageUrl) -> None:
    """Import the DB-API module SQLAlchemy will use, so a missing one is named before anything else fails."""
    from sqlalchemy.engine import make_url

    try:
        make_url(spec.url).get_dialect().import_dbapi()
    except ImportError as err:
        module = err.name or spec.driver
        install = _INSTALL.get(module, f"pip install {module}")
        raise TuneError(f"storage {shown(spec.url)}: SQLAlchemy opens {spec.backend} URLs with the {module} driver, "
                        f"which is not installed: {install}") from None


def open_storage(url: str, heartbeat_s: int | None = None, must_exist: bool = False) -> BaseStorage:
    """An Optuna storage for ``url``; ``journal:///PATH`` is a journal file. ``must_exist`` for read-only use.

    ``heartbeat_s`` (RDB storages): each running trial records a heartbeat this often; one silent for 3x as
    long is failed and re-queued (up to :data:`MAX_RETRY` times) when a worker next starts a trial.
    """
    spec = parse_storage_url(url)
    if spec.path is not None:
        _check_file(spec, must_exist)
    if spec.kind == "journal":
        assert spec.path is not None
        try:
            return JournalStorage(JournalFileBackend(str(spec.path)))
        except OSError as err:
            raise TuneError(f"storage {shown(url)}: journal file {spec.path} cannot be opened: {err.strerror}") \
                from None
    _check_driver(spec)
    kwargs = {"connect_args": _connect_args(spec)}

    def connect() -> BaseStorage:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats are "experimental"
            heartbeat = {} if heartbeat_s is None else {
                "heartbeat_interval": heartbeat_s, "grace_period": 3 * heartbeat_s,
                _RETRY_ARG: _Retry(max_retry=MAX_RETRY)}
            return RDBStorage(url, engine_kwargs=kwargs, **heartbeat)

    with storage_lock(url):
        return _retry_race(connect, url)


def _connect_args(spec: StorageUrl) -> dict:
    if spec.backend == "sqlite":
        return {"timeout": 60}  # several workers: wait for the write lock rather than fail
    if spec.backend == "postgresql":
        return {"connect_timeout": 15}  # an unreachable host fails instead of hanging
    return {}


def _retry_race(connect: Callable[[], BaseStorage], url: str) -> BaseStorage:
    """``connect()``, tried again after a known schema-creation race error; any other error is one TuneError."""
    for attempt in range(OPEN_ATTEMPTS):
        try:
            return connect()
        except Exception as err:  # sqlalchemy connects here; its first line names the problem (refused, auth, ...)
            if attempt + 1 < OPEN_ATTEMPTS and _RACE.search(str(err)):
                time.sleep(random.uniform(0.2, 1.0) * (attempt + 1))  # another process is creating the tables
                continue
            raise _unopenable(url, err) from None
    raise AssertionError("unreachable")


def _unopenable(url: str, err: BaseException) -> TuneError:
    return TuneError(f"storage {shown(url)} cannot be opened: {_first_line(err)}")


@contextmanager
def storage_lock(url: str, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
    """Hold a lock that every treewise process using ``url`` shares, across machines where the storage is a server.

    Held around a storage's first open and around creating a study and queuing its warm start, so workers
    started at once neither race to create the schema nor queue the warm start twice. The lock dies with its
    holder (a server session ends with its connection, an ``flock`` with its process, kill -9 included).
    """
    spec = parse_storage_url(url)
    if spec.backend in ("postgresql", "mysql"):
        with _server_lock(spec, wait_s):
            yield
        return
    assert spec.path is not None
    # Not FILE.lock: Optuna's journal backend takes that name for its own lock, and waits out its 30 s grace
    # period when it finds the file there.
    lock = FileLock(spec.path.with_name(spec.path.name + ".tune-lock"), f"storage {shown(url)}")
    try:
        _wait(lambda: _try_file_lock(lock), url, wait_s)
    except OSError as err:
        raise TuneError(f"storage {shown(url)}: cannot create its lock file {lock.path}: {err.strerror}") from None
    try:
        yield
    finally:
        lock.release()  # drops the flock


def _try_file_lock(lock: FileLock) -> bool:
    try:
        lock.acquire()
        return True
    except LockedError:
        return False


@contextmanager
def _server_lock(spec: StorageUrl, wait_s: float) -> Iterator[None]:
    from sqlalchemy import create_engine, text
    from sqlalchemy.pool import NullPool

    _check_driver(spec)
    if spec.backend == "postgresql":
        take, drop = text(f"SELECT pg_try_advisory_lock({LOCK_KEY})"), text(f"SELECT pg_advisory_unlock({LOCK_KEY})")
    else:
        take, drop = text("SELECT GET_LOCK('treewise-tune', 0)"), text("SELECT RELEASE_LOCK('treewise-tune')")
    engine = create_engine(spec.url, poolclass=NullPool, connect_args=_connect_args(spec))
    try:
        conn = engine.connect()
    except Exception as err:
        engine.dispose()
        raise _unopenable(spec.url, err) from None
    try:
        _wait(lambda: bool(conn.execute(take).scalar()), spec.url, wait_s)
        try:
            yield
        finally:
            conn.execute(drop)
    finally:
        conn.close()  # ends the session, and with it any lock it still holds
        engine.dispose()


def _wait(try_take: Callable[[], bool], url: str, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while not try_take():
        if time.monotonic() > deadline:
            raise TuneError(f"storage {shown(url)}: another treewise process has held its lock for over {wait_s:.0f} s "
                            "(a worker stuck while opening it?): stop that process, or retry")
        time.sleep(random.uniform(0.05, 0.25))


def _check_file(spec: StorageUrl, must_exist: bool) -> None:
    path = spec.path
    assert path is not None
    what = "journal file" if spec.kind == "journal" else "database"
    if path.is_dir():
        raise TuneError(f"storage {shown(spec.url)}: {path} is a folder, not a {what} file")
    if must_exist and not path.is_file():
        raise TuneError(f"storage {shown(spec.url)}: {what} {path} does not exist; pass the URL `treewise tune` used")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TuneError(f"storage {shown(spec.url)}: cannot create the folder {path.parent}: {err.strerror}") from None


def fail_stale_trials(study: optuna.Study) -> None:
    """Mark trials whose worker stopped beating FAIL (and re-queue them); a no-op without heartbeats."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def dashboard_command(url: str) -> str:
    """How to open ``url`` in optuna-dashboard (it takes a journal file as a plain path)."""
    return f"optuna-dashboard {url[len(JOURNAL):] if url.startswith(JOURNAL) else url}"
