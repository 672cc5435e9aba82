"""Storage URLs of `treewise tune`: any text is either accepted as what it says or refused in one line that
names the problem and the URL forms that work; a missing driver is named as SQLAlchemy asks for it."""

import sqlite3
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from treewise.studies.cli import app
from treewise.studies.tune.storage import TuneError, open_storage, parse_storage_url, safe_url

_NAME = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_", min_size=1, max_size=12)
_PATH = st.lists(_NAME, min_size=1, max_size=4).map("/".join)
_SCHEMES = st.sampled_from(["sqlite://", "sqlite:///", "postgresql://", "postgresql+psycopg://", "mysql://",
                            "mysql+pymysql://", "journal://", "journal:///", "oracle://", "http://", ""])


def _one_line_refusal(url: str) -> None:
    """``url`` is refused with a single-line TuneError that quotes it, or accepted; nothing else escapes."""
    try:
        spec = parse_storage_url(url)
    except TuneError as err:
        message = str(err)
        assert "\n" not in message and message.startswith(f"storage {repr(safe_url(url))}: ")
        assert "sqlite:///PATH" in message  # the forms that work are named
        return
    assert spec.url == url and spec.kind in ("journal", "rdb")
    assert spec.backend in ("journal", "sqlite", "postgresql", "mysql")


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=60))
def test_any_text_is_accepted_or_refused_in_one_line(url: str) -> None:
    _one_line_refusal(url)


@settings(max_examples=300, deadline=None)
@given(_SCHEMES, st.text(max_size=40))
def test_any_text_after_a_scheme_is_accepted_or_refused_in_one_line(scheme: str, rest: str) -> None:
    _one_line_refusal(scheme + rest)


@settings(max_examples=100, deadline=None)
@given(_PATH, st.booleans())
def test_sqlite_and_journal_urls_name_their_file(path: str, absolute: bool) -> None:
    path = ("/" if absolute else "") + path + ".db"
    spec = parse_storage_url(f"sqlite:///{path}")
    assert (spec.kind, spec.backend, spec.driver, spec.path) == ("rdb", "sqlite", "pysqlite", Path(path))
    spec = parse_storage_url(f"journal://{path}")
    assert (spec.kind, spec.path) == ("journal", Path(path))


@settings(max_examples=100, deadline=None)
@given(_NAME, _NAME, st.integers(1, 65535) | st.none(), _NAME)
def test_postgresql_urls_parse_to_their_parts_and_the_psycopg_driver(user: str, host: str, port: int | None,
                                                                     db: str) -> None:
    url = f"postgresql://{user}@{host}{'' if port is None else f':{port}'}/{db}"
    spec = parse_storage_url(url)
    assert (spec.backend, spec.driver, spec.host, spec.port, spec.path) == ("postgresql", "psycopg", host, port, None)


@settings(max_examples=100, deadline=None)
@given(_NAME, st.text(alphabet=st.characters(blacklist_characters="@/", blacklist_categories=("Cs",)), min_size=6,
                      max_size=20), _NAME)
def test_a_password_is_never_shown(user: str, password: str, host: str) -> None:
    url = f"postgresql://{user}:{password}@{host}:1/db"
    assert safe_url(url) == f"postgresql://{user}:***@{host}:1/db"
    try:
        parse_storage_url(url)
    except TuneError as err:
        assert password not in str(err).replace(f"{user}:***@{host}", "")


@settings(max_examples=50, deadline=None)
@given(st.integers(65536, 10**7) | st.just(0))
def test_a_port_out_of_range_is_refused(port: int) -> None:
    with pytest.raises(TuneError, match=f"port {port} is outside 1..65535"):
        parse_storage_url(f"postgresql://u@h:{port}/db")


@pytest.mark.parametrize(("url", "message"), [
    ("", "empty URL"),
    ("sqlite:///runs/tune.db\n", "control characters"),
    (" sqlite:///runs/tune.db", "leading/trailing spaces"),
    ("runs/tune.db", r"not a URL \(no scheme://\)"),
    ("sqlite://", "in-memory SQLite database keeps nothing"),
    ("sqlite:///:memory:", "in-memory SQLite database keeps nothing"),
    ("journal://", "needs a file path"),
    ("postgres://u@h/db", "unsupported database 'postgres'"),  # SQLAlchemy knows only postgresql://
    ("oracle://u@h/db", "unsupported database 'oracle'"),
    ("postgresql://u@h:abc/db", "not a valid database URL"),
    ("postgresql+nosuch://u@h/db", "SQLAlchemy has no driver 'postgresql\\+nosuch'"),
])
def test_bad_urls_are_refused_before_connecting(url: str, message: str) -> None:
    with pytest.raises(TuneError, match=message):
        open_storage(url)


def test_a_missing_driver_is_the_one_sqlalchemy_asks_for(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if psycopg were not installed
    with pytest.raises(TuneError) as err:
        open_storage("postgresql://u@127.0.0.1:1/db")
    assert "with the psycopg driver, which is not installed" in str(err.value)
    assert 'pip install -e ".[postgres]"' in str(err.value) and "psycopg2" not in str(err.value)
    monkeypatch.setitem(sys.modules, "pymysql", None)
    with pytest.raises(TuneError, match="with the pymysql driver, which is not installed: pip install pymysql"):
        open_storage("mysql+pymysql://u@127.0.0.1:1/db")


def test_an_unreachable_server_is_one_line_without_the_password() -> None:
    pytest.importorskip("psycopg", reason="psycopg (the postgres extra) is not installed")
    with pytest.raises(TuneError) as err:
        open_storage("postgresql://u:s3cret@127.0.0.1:1/db")  # nothing listens on port 1
    message = str(err.value)
    assert message.startswith("storage 'postgresql://u:***@127.0.0.1:1/db' cannot be opened: ")
    assert "Connection refused" in message and "\n" not in message and "s3cret" not in message


def test_files_that_are_not_storages(tmp_path) -> None:
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(TuneError, match="is a folder, not a database file"):
        open_storage(f"sqlite:///{tmp_path / 'dir.db'}")
    with pytest.raises(TuneError, match="is a folder, not a journal file"):
        open_storage(f"journal:///{tmp_path / 'dir.db'}")
    (tmp_path / "junk.db").write_bytes(b"this is not a database" * 100)
    with pytest.raises(TuneError, match="cannot be opened: .*file is not a database"):
        open_storage(f"sqlite:///{tmp_path / 'junk.db'}")
    with pytest.raises(TuneError, match="does not exist; pass the URL `treewise tune` used"):
        open_storage(f"sqlite:///{tmp_path / 'missing.db'}", must_exist=True)
    assert not (tmp_path / "missing.db").exists()  # a read-only lookup creates nothing
    open_storage(f"sqlite:///{tmp_path / 'new' / 'tune.db'}")  # a new file and its folder are fine
    assert sqlite3.connect(tmp_path / "new" / "tune.db").execute("select count(*) from studies").fetchone() == (0,)


def test_cli_reports_a_bad_url_in_one_line_before_loading_models(tmp_path) -> None:
    res = CliRunner().invoke(app, ["tune", "--storage", "postgres://u@h/db", "--trials", "1",
                                   "--target", str(tmp_path / "no-such-model")])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "unsupported database 'postgres'" in " ".join(res.output.split())
    assert "Traceback" not in res.output
    res = CliRunner().invoke(app, ["report", "--storage", "sqlite://"])
    assert res.exit_code == 2 and "in-memory SQLite database keeps nothing" in " ".join(res.output.split())
