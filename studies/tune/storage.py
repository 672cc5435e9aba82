"""Optuna storage URLs for ``treewise tune``: checked before anything connects, opened with heartbeats.

:func:`parse_storage_url` is pure (no file, driver or network touched) and turns any bad URL into a one-line
:class:`TuneError`; :func:`open_storage` then checks the file or driver and connects. RDB storages (SQLite,
PostgreSQL, MySQL) get a heartbeat: a trial whose worker stops beating (killed, machine lost) is marked FAIL
by the next worker that starts a trial or finalises, and re-queued once more for another worker to run.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from treewise.decoder import TreewiseError

try:  # Optuna >= 4.9 renamed the retry callback and its RDBStorage argument
    from optuna.storages import RetryHeartbeatStaleTrialCallback as _Retry

    _RETRY_ARG = "heartbeat_stale_trial_callback"
except ImportError:  # pragma: no cover - older Optuna
    from optuna.storages import RetryFailedTrialCallback as _Retry

    _RETRY_ARG = "failed_trial_callback"

JOURNAL = "journal://"
BACKENDS = ("sqlite", "postgresql", "mysql")
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
    kwargs: dict = {}
    if spec.backend == "sqlite":
        kwargs["connect_args"] = {"timeout": 60}  # several workers: wait for the write lock rather than fail
    elif spec.backend == "postgresql":
        kwargs["connect_args"] = {"connect_timeout": 15}  # an unreachable host fails instead of hanging
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats are "experimental"
            heartbeat = {} if heartbeat_s is None else {
                "heartbeat_interval": heartbeat_s, "grace_period": 3 * heartbeat_s,
                _RETRY_ARG: _Retry(max_retry=MAX_RETRY)}
            return RDBStorage(url, engine_kwargs=kwargs, **heartbeat)
    except Exception as err:  # sqlalchemy connects here; its first line names the problem (refused, auth, ...)
        raise TuneError(f"storage {shown(url)} cannot be opened: {_first_line(err)}") from None


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
