"""A latency profile file that is garbage is named with its fix, also behind `LearnedTree.default()` (the
`--tree learned` path, where it used to end in a pydantic traceback)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from treewise.controller import LearnedTree
from treewise.controller.latency import LatencyError, LatencyProfile
from treewise.decoder import TreewiseError

DATA = Path(__file__).resolve().parents[2] / "data"


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


def test_learned_default_names_a_garbage_shipped_profile(tmp_path, monkeypatch) -> None:
    shutil.copytree(DATA / "predictor", tmp_path / "predictor")
    (tmp_path / "latency.json").write_text("{")
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path))
    with pytest.raises(TreewiseError, match="latency.json: not a latency profile"):
        LearnedTree.default()


def test_a_dip_between_measured_sizes_never_makes_more_tokens_cheaper() -> None:
    sizes = [1, 2, 4, 8, 16, 32, 64]
    profile = LatencyProfile(sizes=sizes, target_ms=[4.4, 4.7, 4.86, 4.84, 5.7, 7.2, 10.1],
                             draft_ms=[0.4, 0.39, 0.45, 0.49, 0.57, 0.75, 1.1], context=128, device="cpu", threads=2)
    for time in (profile.target_time, profile.draft_time):
        costs = [time(n) for n in range(1, 80)]
        assert all(b >= a for a, b in zip(costs, costs[1:], strict=False))
    assert profile.target_time(8) == profile.target_time(4) == 4.86  # the dip is read as flat
    assert profile.target_time(1) == 4.4 and profile.target_time(16) == 5.7  # the rest as measured
    assert profile.target_ms[3] == 4.84  # the file keeps what was measured


def test_default_reads_the_pairs_own_files(tmp_path, monkeypatch) -> None:
    """`LearnedTree.default(pair=)`/`BudgetedTree.default(pair=)` read the named pair's latency profile; the real
    pair borrows the micro pair's until its own file exists."""
    from treewise.controller import BudgetedTree

    shutil.copytree(DATA / "predictor", tmp_path / "predictor")
    micro = LatencyProfile.flat()
    (tmp_path / "latency.json").write_text(micro.model_dump_json())
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path))
    assert LearnedTree.default(pair="smollm2").latency.target_ms == micro.target_ms  # borrowed
    own = micro.model_copy(update={"target_ms": [2 * t for t in micro.target_ms]})
    (tmp_path / "smollm2").mkdir()
    (tmp_path / "smollm2" / "latency.json").write_text(own.model_dump_json())
    assert LearnedTree.default(pair="smollm2").latency.target_ms == own.target_ms
    assert BudgetedTree.default(pair="smollm2").latency.target_ms == own.target_ms
    assert LearnedTree.default(pair="micro").latency.target_ms == micro.target_ms
    assert LearnedTree.default().latency.target_ms == micro.target_ms  # the tests' $TREEWISE_PAIR is micro


def test_load_or_measure_takes_any_named_pairs_shipped_profile_of_this_pair(tmp_path, monkeypatch,
                                                                             tiny_pair_dir) -> None:
    """The real pair's profile lives in data/smollm2/, not data/: tuning must read it, not measure its own."""
    from treewise.controller.host import host_info, load_or_measure
    from treewise.controller.latency import pair_key
    from treewise.decoder import TreeDecoder

    dec = TreeDecoder.from_pretrained(tiny_pair_dir / "target", tiny_pair_dir / "draft")
    shipped = LatencyProfile.flat().model_copy(update={"key": pair_key(dec.target, dec.draft),
                                                       "host": host_info().key})
    (tmp_path / "smollm2").mkdir()
    (tmp_path / "smollm2" / "latency.json").write_text(shipped.model_dump_json())
    (tmp_path / "latency.json").write_text(LatencyProfile.flat().model_dump_json())  # another pair's
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path))
    cache = tmp_path / "cache"
    assert load_or_measure(dec, cache) == shipped
    assert not cache.exists()  # nothing measured
