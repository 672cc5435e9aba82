"""The host profile: which host kind a cost curve belongs to, when a shipped one counts, the cache per host, and
the refusal of a noisy probe (all without a clock: probes are scripted where noise is the point)."""

from __future__ import annotations

from pathlib import Path

import pytest

from treewise.controller import LatencyProfile
from treewise.controller.host import NOISE, HostInfo, host_info, host_profile, probe_until_steady, spread
from treewise.controller.latency import pair_key
from treewise.decoder import TreeDecoder

XEON = "model name\t: Intel(R) Xeon(R) Platinum 8481C\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
EPYC = "model name\t: AMD EPYC 7B13\nflags\t\t: fpu sse2 avx2 fma\n"


def test_host_info_names_the_cpu_and_the_flags_that_change_kernels() -> None:
    xeon, epyc = host_info(XEON), host_info(EPYC)
    assert xeon.cpu == "Intel(R) Xeon(R) Platinum 8481C" and xeon.flags == ("avx2", "avx512f", "avx512_bf16",
                                                                            "amx_bf16", "amx_tile")
    assert epyc.flags == ("avx2",) and xeon.key != epyc.key
    assert host_info("").cpu  # no /proc/cpuinfo: the platform's name still stands


@pytest.fixture()
def dec(tiny_pair_dir: Path) -> TreeDecoder:
    return TreeDecoder.from_pretrained(tiny_pair_dir / "target", tiny_pair_dir / "draft")


def _shipped(dec: TreeDecoder, tmp_path: Path, host: str) -> Path:
    path = tmp_path / "latency.json"
    path.write_text(LatencyProfile.flat(5.0).model_copy(update={"key": pair_key(dec.target, dec.draft),
                                                                 "host": host}).model_dump_json())
    return path


def test_a_shipped_curve_counts_only_on_the_host_kind_it_was_measured_on(dec: TreeDecoder, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import treewise.controller.host as host_module

    # The probe's own timing is measure_latency's (tests/controller/test_latency*.py); here it is steady.
    monkeypatch.setattr(host_module, "measure_latency", lambda *a, **k: _curve(1.0))
    here = _shipped(dec, tmp_path, host_info().key)
    found = host_profile(dec, tmp_path / "cache", here)
    assert found.source == "shipped" and found.profile.target_ms[0] == 5.0
    elsewhere = _shipped(dec, tmp_path, host_info(EPYC if "EPYC" not in host_info().cpu else XEON).key)
    measured = host_profile(dec, tmp_path / "cache", elsewhere)
    assert measured.source == "measured" and measured.profile.host == host_info().key
    assert measured.profile.target_ms == _curve(1.0).target_ms and measured.path is not None
    assert measured.path.exists() and pair_key(dec.target, dec.draft) in measured.path.name
    again = host_profile(dec, tmp_path / "cache", elsewhere)
    assert again.source == "cached" and again.profile == measured.profile
    assert host_profile(dec, tmp_path / "cache", elsewhere, remeasure=True).source == "measured"
    assert "host: " in again.line() and "cached" in again.line()


def _curve(scale: float) -> LatencyProfile:
    return LatencyProfile.flat(20.0 * scale, 5.0 * scale)  # milliseconds of a real pair's forwards


def test_a_noisy_probe_is_refused_and_a_steady_one_kept() -> None:
    host = HostInfo("cpu", ("avx2",), 2)
    assert spread(_curve(1.0), _curve(1.0 + NOISE / 2)) <= NOISE < spread(_curve(1.0), _curve(1.0 + 2 * NOISE))
    noisy = iter([_curve(1.0), _curve(1.5), _curve(1.0)])
    assert probe_until_steady(lambda: next(noisy), host) is None
    settling = iter([_curve(1.5), _curve(1.0), _curve(1.02)])
    kept = probe_until_steady(lambda: next(settling), host)
    assert kept is not None and kept.target_ms == _curve(1.02).target_ms and kept.host == host.key


def test_a_noisy_probe_falls_back_to_the_shipped_curve_and_says_why(dec: TreeDecoder, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import treewise.controller.host as host_module

    calls = iter(range(100))
    monkeypatch.setattr(host_module, "measure_latency", lambda *a, **k: _curve(1.0 + next(calls)))  # never steady
    shipped = _shipped(dec, tmp_path, "another host")
    found = host_profile(dec, tmp_path / "cache", shipped)
    assert found.source == "fallback" and found.profile.target_ms[0] == 5.0 and "remeasure" in found.note
    assert not (tmp_path / "cache").exists()  # a noisy probe is not cached
