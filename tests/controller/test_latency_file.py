"""A latency profile file that is garbage is named with its fix, also behind `LearnedTree.default()` (the
`--tree learned` path, where it used to end in a pydantic traceback)."""

from __future__ import annotations

import pytest

from controller.latency import LatencyError, LatencyProfile


@pytest.mark.parametrize(("content", "needle"), [
    ("{", "Invalid JSON"), ('{"sizes": [1]}', "target_ms: Field required"), ("\xff", "Invalid JSON"), ("", "")])
def test_garbage_profile_is_named(tmp_path, content, needle) -> None:
    path = tmp_path / "latency.json"
    path.write_text(content, encoding="latin-1")
    with pytest.raises(LatencyError, match=f"{path}: not a latency profile \\(.*{needle}.*treewise latency --out"):
        LatencyProfile.read(path)


def test_round_trip(tmp_path) -> None:
    profile = LatencyProfile.flat()
    path = tmp_path / "latency.json"
    path.write_text(profile.model_dump_json())
    assert LatencyProfile.read(path) == profile
