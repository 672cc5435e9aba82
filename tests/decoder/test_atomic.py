"""Atomic writes: create-if-absent leaves no temp file and never replaces another writer's file."""

from __future__ import annotations

from decoder.atomic import create_exclusive


def test_create_exclusive_first_writer_wins(tmp_path) -> None:
    path = tmp_path / "sub" / "manifest.json"
    assert create_exclusive(path, b"first")
    assert not create_exclusive(path, b"second")
    assert path.read_bytes() == b"first"
    assert [p.name for p in path.parent.iterdir()] == ["manifest.json"]  # no temp file left behind
    assert path.stat().st_mode & 0o777 == 0o644
