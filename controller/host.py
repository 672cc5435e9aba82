"""The host a decoder runs on, and the cost curve measured there.

A tree step's price is a property of the host: on an AVX2 EPYC a tree of 8 costs about one plain step, on an
AVX-512 Xeon in float32 1.7 (docs/real-pair.md). So the profile LearnedTree, BudgetedTree and Hybrid price
trees by is the one measured on this host kind (CPU model and the ISA flags that change kernels, threads,
device, dtype and pair: ``HostInfo`` plus ``pair_key``): a shipped ``latency.json`` counts only where it was
measured on this host kind; otherwise the curve is measured on first use (a few seconds) and cached per host
in the user cache. A probe taken on a busy machine is caught by measuring twice: where the two disagree by
more than ``NOISE`` (the median over sizes of their relative difference), it measures again, and a third
disagreement falls back to the shipped file (``HostProfile.source`` says which, ``note`` why).
"""

from __future__ import annotations

import dataclasses
import json
import platform
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from treewise.decoder import TreeDecoder, TreePolicy
from treewise.decoder.loading import cpu_flags
from treewise.decoder.records.atomic import write_bytes_atomic

from .latency import LatencyProfile, measure_latency, pair_key
from .pairs import LATENCY, PAIRS

# The flags whose presence changes which kernels win (docs/real-pair.md, "The cost curve").
ISA_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_int8", "amx_tile")
NOISE = 0.15  # the largest spread between two probes that is trusted
JITTER_MS = 0.25  # a difference this small is dispatch jitter, whatever the forward's length


@dataclass(frozen=True)
class HostInfo:
    cpu: str
    flags: tuple[str, ...]  # the ``ISA_FLAGS`` the CPU has
    threads: int

    @property
    def key(self) -> str:
        return f"{self.cpu} [{' '.join(self.flags) or 'no avx2'}] x{self.threads}"


def host_info(cpuinfo: str | None = None) -> HostInfo:
    """This machine's CPU model and ISA flags (from /proc/cpuinfo where there is one) and torch's threads."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    model = next((line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if line.startswith("model name")),
                 "")
    cpu = model or platform.processor() or platform.machine() or "unknown CPU"
    present = cpu_flags(cpuinfo)
    return HostInfo(cpu, tuple(f for f in ISA_FLAGS if f in present), torch.get_num_threads())


@dataclass(frozen=True)
class HostProfile:
    profile: LatencyProfile
    source: str  # "shipped" (measured on this host kind), "cached", "measured", or "fallback" (a noisy probe)
    host: HostInfo
    path: Path | None = None  # the file it came from or went to
    note: str = ""

    def line(self) -> str:
        where = f" ({self.path})" if self.path else ""
        return f"host: {self.host.key}; cost curve {self.source}{where}" + (f": {self.note}" if self.note else "")


def host_profile(dec: TreeDecoder, cache_dir: Path, shipped: Path | None = None,
                 remeasure: bool = False) -> HostProfile:
    """The cost curve of ``dec``'s pair on this host: the shipped file where it was measured on this host kind,
    else the one cached for this host, else measured now (twice, to catch a busy machine) and cached."""
    host = host_info()
    key = pair_key(dec.target, dec.draft)
    if not remeasure and shipped is not None and shipped.exists():
        own = LatencyProfile.read(shipped)
        if own.key == key and own.host == host.key:
            return HostProfile(own, "shipped", host, shipped)
    path = Path(cache_dir) / f"latency-{key}-{_slug(host.key)}.json"
    if not remeasure and path.exists():
        return HostProfile(LatencyProfile.read(path), "cached", host, path)
    probe = probe_until_steady(lambda: measure_latency(dec.target, dec.draft, repeats=12), host)
    if probe is None:
        note = f"three probes disagreed by more than {NOISE:.0%} (a busy machine?); run `treewise host --remeasure`"
        if shipped is not None and shipped.exists():
            return HostProfile(LatencyProfile.read(shipped), "fallback", host, shipped, note)
        return HostProfile(LatencyProfile.flat(), "fallback", host, None, note + "; a flat curve stands in")
    write_bytes_atomic(path, json.dumps(probe.model_dump(), indent=1).encode())
    return HostProfile(probe, "measured", host, path)


def probe_until_steady(measure: Callable[[], LatencyProfile], host: HostInfo) -> LatencyProfile | None:
    """Two consecutive measurements that agree within ``NOISE`` (``spread``; the later one kept, named by
    ``host``), from at most three; None where none agree."""
    last = measure()
    for _ in range(2):
        again = measure()
        if spread(last, again) <= NOISE:
            return again.model_copy(update={"host": host.key})
        last = again
    return None


def spread(a: LatencyProfile, b: LatencyProfile) -> float:
    """The median over sizes (target's and draft's) of two profiles' relative difference beyond ``JITTER_MS``.
    A busy machine shifts every size; a quiet one moves single sizes, and sub-millisecond forwards by their
    dispatch jitter (the micro pair's 1 ms draft forwards: back-to-back probes differ by up to 16-43% at one
    size, 5-24% in the median)."""
    pairs = zip([*a.target_ms, *a.draft_ms], [*b.target_ms, *b.draft_ms], strict=True)
    return statistics.median(max(abs(x - y) - JITTER_MS, 0.0) / max(min(x, y), 1e-9) for x, y in pairs)


def _slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")[:80]


def load_or_measure(dec: TreeDecoder, cache_dir: str | Path) -> LatencyProfile:
    """The cost curve of this pair on this host (``host_profile``): the named pair's shipped ``latency.json``
    measured for this very pair (used on this host kind, the fallback of a noisy probe elsewhere), else the
    cached or freshly measured one."""
    key = pair_key(dec.target, dec.draft)
    shipped = (spec.own(LATENCY) for spec in PAIRS.values())
    mine = next((p for p in shipped if p.exists() and LatencyProfile.read(p).key == key), None)
    return host_profile(dec, Path(cache_dir), mine).profile


def priced_by(policy: TreePolicy, profile: LatencyProfile) -> TreePolicy:
    """``policy`` pricing its trees by ``profile`` (LearnedTree, BudgetedTree, Hybrid and what Hybrid wraps); a
    policy that reads no cost curve comes back as it is."""
    if not dataclasses.is_dataclass(policy) or isinstance(policy, type):
        return policy
    names = {f.name for f in dataclasses.fields(policy) if f.init}
    changes: dict[str, object] = {}
    if "latency" in names and policy.latency is not None:  # type: ignore[attr-defined]
        changes["latency"] = profile  # a policy built without a cost rule keeps none
    if "inner" in names:
        changes["inner"] = priced_by(policy.inner, profile)  # type: ignore[attr-defined]
    return dataclasses.replace(policy, **changes) if changes else policy  # type: ignore[type-var]
