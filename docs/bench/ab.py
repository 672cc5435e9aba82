"""A/B bench: `treewise bench` at an earlier commit (A) against this checkout or another commit (B), interleaved.

    python docs/bench/ab.py 5f62665 --rounds 2 --out runs/ab/learned -- \
        --split test --per-domain 3 --no-hf --only learned --only static
    python docs/bench/ab.py 5f62665 --b 4b10fd6 --env TREEWISE_PAIR=smollm2 -- --per-domain 2 --no-hf

Each commit runs from a worktree of its own with a virtual environment of its own, built once by the commit's own
install (``pip install torch==2.13.0`` first, then ``pip install -e .``) and kept under ``--cache`` (a ``.ready``
file marks a finished build); B defaults to this checkout run by the interpreter that runs this script. The
benches then run one at a time in the order A, B, A, B, ... (``--rounds`` of each), so a host that drifts slows
both alike; each run's JSON is kept in ``--out`` (written whole, by rename), so a killed A/B resumes where it
stopped. Both sides read B's prompt suite (``--suite`` is added unless given) and the same environment
(``OMP_NUM_THREADS=2`` unless set, ``--env`` pairs; ``TREEWISE_PAIR`` picks a pair where the commit knows pairs;
before pairs existed the micro pair was the only one).

The table gives, per bench row, B/A of tokens/s (median over rounds) with its range over every A round against
every B round, B/A of the speedup over plain decoding (each side's own plain row, which cancels drift between
the runs), and each run's tau. Run it before a change to a policy, the step or the cost model is called done
(docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Side:
    name: str  # "A" or "B"
    label: str  # the commit (or "worktree")
    root: Path  # where `treewise bench` runs
    treewise: Path  # its entry point


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def build(rev: str, cache: Path, extras: str) -> tuple[str, Path]:
    """A worktree of ``rev`` with its own environment under ``cache`` (built once): its sha and folder."""
    sha = _git("rev-parse", "--verify", f"{rev}^{{commit}}")
    tree = cache / sha[:12]
    if (tree / ".ready").exists():
        return sha, tree
    if tree.exists():  # a build killed half-way: start it again
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)
        shutil.rmtree(tree, ignore_errors=True)
    cache.mkdir(parents=True, exist_ok=True)
    _git("worktree", "add", "--detach", str(tree), sha)
    pip = [str(tree / ".venv/bin/python"), "-m", "pip", "install", "-q"]
    for cmd in ([sys.executable, "-m", "venv", str(tree / ".venv")], [*pip, "torch==2.13.0"],
                [*pip, "-e", f".{extras}" if extras else "."]):
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, cwd=tree, check=True)
    (tree / ".ready").write_text(sha + "\n")
    return sha, tree


def run_bench(side: Side, args: list[str], out: Path, env: dict[str, str]) -> dict:
    """One bench run of ``side``, its JSON kept at ``out`` (an existing one is read back: resume)."""
    if not out.exists():
        tmp = out.with_suffix(".part.json")
        print(f"{side.name} ({side.label}) -> {out.name}", flush=True)
        subprocess.run([str(side.treewise), "bench", *args, "--json", str(tmp)], cwd=side.root, env=env, check=True)
        tmp.replace(out)
    return json.loads(out.read_text())


@dataclass(frozen=True)
class RowAB:
    row: str
    a_tokens_per_s: list[float]
    b_tokens_per_s: list[float]
    ratio: float  # median B over median A
    ratio_range: tuple[float, float]  # over every (A round, B round) pair
    speedup_ratio: float  # B's speedup over its plain row against A's, medians
    speedup_range: tuple[float, float]
    a_tau: list[float]
    b_tau: list[float]


def compare(a_runs: list[dict], b_runs: list[dict]) -> list[RowAB]:
    """Per row present on both sides: B against A (see the module docstring)."""
    rows = [r for r in b_runs[0]["policies"] if all(r in run["policies"] for run in a_runs + b_runs)]
    out = []
    for row in rows:
        a = [run["policies"][row] for run in a_runs]
        b = [run["policies"][row] for run in b_runs]
        at, bt = [m["tokens_per_s"] for m in a], [m["tokens_per_s"] for m in b]
        asp, bsp = [m["speedup"] for m in a], [m["speedup"] for m in b]
        out.append(RowAB(row, at, bt, statistics.median(bt) / statistics.median(at),
                         (min(bt) / max(at), max(bt) / min(at)), statistics.median(bsp) / statistics.median(asp),
                         (min(bsp) / max(asp), max(bsp) / min(asp)), [m["tau"] for m in a], [m["tau"] for m in b]))
    return out


def _table(rows: list[RowAB], a: Side, b: Side) -> str:
    head = f"B = {b.label} against A = {a.label}"
    lines = [head, f"{'row':<22} {'A tok/s':>16} {'B tok/s':>16} {'B/A':>6} {'range':>13} {'speedup B/A':>11} "
             f"{'range':>13}  tau A | tau B"]
    for r in rows:
        fmt = "/".join(f"{x:.0f}" for x in r.a_tokens_per_s), "/".join(f"{x:.0f}" for x in r.b_tokens_per_s)
        tau = " ".join(f"{x:.2f}" for x in r.a_tau) + " | " + " ".join(f"{x:.2f}" for x in r.b_tau)
        lines.append(f"{r.row:<22} {fmt[0]:>16} {fmt[1]:>16} {r.ratio:>6.3f} "
                     f"{r.ratio_range[0]:>6.3f}-{r.ratio_range[1]:<6.3f} {r.speedup_ratio:>11.3f} "
                     f"{r.speedup_range[0]:>6.3f}-{r.speedup_range[1]:<6.3f}  {tau}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    ours, bench_args = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a", help="the earlier commit (any git revision)")
    p.add_argument("--b", default=None, help="the other commit (default: this checkout as it is)")
    p.add_argument("--rounds", type=int, default=2, help="bench runs of each side, interleaved A, B, A, B")
    p.add_argument("--out", type=Path, default=None, help="folder for each run's JSON and the summary")
    p.add_argument("--cache", type=Path, default=Path.home() / ".cache/treewise/ab", help="worktrees and venvs")
    p.add_argument("--extras", default="", help="pip extras for built commits, e.g. [native]")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE for both sides (repeatable)")
    opts = p.parse_args(ours)
    a_sha, a_root = build(opts.a, opts.cache, opts.extras)
    a = Side("A", a_sha[:12], a_root, a_root / ".venv/bin/treewise")
    if opts.b is None:
        here = "worktree@" + _git("rev-parse", "--short=12", "HEAD")
        b = Side("B", here, ROOT, Path(sys.executable).parent / "treewise")
    else:
        b_sha, b_root = build(opts.b, opts.cache, opts.extras)
        b = Side("B", b_sha[:12], b_root, b_root / ".venv/bin/treewise")
    if "--suite" not in bench_args:
        bench_args = ["--suite", str(b.root / "data/prompts"), *bench_args]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    env.update(kv.split("=", 1) for kv in opts.env)
    out = opts.out or ROOT / "runs/ab" / f"{a.label}-{b.label}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps({"a": a.label, "b": b.label, "bench": bench_args}, indent=1) + "\n")
    runs: dict[str, list[dict]] = {"A": [], "B": []}
    for k in range(opts.rounds):
        for side in (a, b):
            runs[side.name].append(run_bench(side, bench_args, out / f"{side.name}{k}.json", env))
    rows = compare(runs["A"], runs["B"])
    (out / "summary.json").write_text(json.dumps({"a": a.label, "b": b.label, "bench": bench_args,
                                                  "rows": [r.__dict__ for r in rows]}, indent=1) + "\n")
    print(_table(rows, a, b))
    print(f"runs and summary.json in {out}")


if __name__ == "__main__":
    main()
