"""Atomic writes: create-if-absent leaves no temp file and never replaces another writer's file."""

from __future__ import annotations

from treewise.decoder.records.atomic import create_exclusive


def test_create_exclusive_first_writer_wins(tmp_path) -> None:
    path = tmp_path / "sub" / "manifest.json"
    assert create_exclusive(path, b"first")
    assert not create_exclusive(path, b"second")
    assert path.read_bytes() == b"first"
    assert [p.name for p in path.parent.iterdir()] == ["manifest.json"]  # no temp file left behind
    assert path.stat().st_mode & 0o777 == 0o644


def test_atomic_dir_replaces_owned_files_keeps_the_users(tmp_path) -> None:
    from treewise.decoder.records.atomic import atomic_dir

    out = tmp_path / "artifact"
    with atomic_dir(out, owned={"a", "b"}) as stage:
        (stage / "a").write_text("1")
        (stage / "b").write_text("1")
    (out / "mine").write_text("kept")
    with atomic_dir(out, owned={"a", "b"}) as stage:
        (stage / "a").write_text("2")  # this version has no "b": the old "b" must not come back
    assert sorted(p.name for p in out.iterdir()) == ["a", "mine"]
    assert (out / "a").read_text() == "2" and (out / "mine").read_text() == "kept"
    assert [p.name for p in tmp_path.iterdir()] == ["artifact"]


def test_atomic_dir_failure_keeps_the_old_folder(tmp_path) -> None:
    from treewise.decoder.records.atomic import atomic_dir

    out = tmp_path / "artifact"
    out.mkdir()
    (out / "a").write_text("old")
    try:
        with atomic_dir(out, owned={"a"}) as stage:
            (stage / "a").write_text("half")
            raise RuntimeError("disk full")
    except RuntimeError:
        pass
    assert (out / "a").read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["artifact"]


def test_recover_dir_undoes_or_finishes_an_interrupted_swap(tmp_path) -> None:
    from treewise.decoder.records.atomic import recover_dir

    out, old = tmp_path / "artifact", tmp_path / ".artifact.old-x1"
    old.mkdir()
    (old / "a").write_text("old")
    recover_dir(out, owned={"a"})  # killed after the old folder moved aside: it comes back
    assert (out / "a").read_text() == "old" and not old.exists()
    old.mkdir()
    (old / "a").write_text("older")
    (old / "mine").write_text("kept")
    recover_dir(out, owned={"a"})  # killed after the swap, while moving the user's files over
    assert (out / "a").read_text() == "old" and (out / "mine").read_text() == "kept" and not old.exists()
