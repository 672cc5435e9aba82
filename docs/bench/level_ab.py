"""LearnedTree with the previous level (lleaves forest in controller/fused.py, commit 5f62665) against today's
(numba forest in controller/level.py), and plain decoding, interleaved prompt by prompt in one process.

    git worktree add /tmp/old 5f62665
    python3 -m venv /tmp/oldvenv && /tmp/oldvenv/bin/pip install torch==2.13.0
    /tmp/oldvenv/bin/pip install "transformers>=5.24,<6" lightgbm lleaves==1.3.0 "llvmlite<0.45" "numba<0.62" \
        "numpy<2.3" optuna rich pydantic pyarrow matplotlib typer scipy
    /tmp/oldvenv/bin/pip install --no-deps -e .          # today's treewise beside the old top-level packages
    PYTHONPATH=/tmp/old OMP_NUM_THREADS=2 /tmp/oldvenv/bin/python docs/bench/level_ab.py /tmp/old 4 5 64 \
        docs/bench/latest-level-ab.json

Arguments: old checkout, prompts per domain (the last ones of each suite file), repeats, new tokens, JSON out.
"""

import json
import sys
import time
from pathlib import Path

import torch

from controller import LearnedTree as OldLearned  # the old checkout's top-level packages, on PYTHONPATH
from decoder import TreeDecoder as OldDecoder
from treewise import LearnedTree, TreeDecoder
from treewise.decoder.paths import data_dir


def main() -> None:
    torch.set_num_threads(2)
    old_root, per, repeats, new_tokens, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
        Path(sys.argv[5])
    pair = Path(old_root) / "data" / "models"
    old = OldDecoder.from_pretrained(target=str(pair / "target"), draft=str(pair / "draft"))
    new = TreeDecoder.from_pretrained(target=str(data_dir() / "models/target"), draft=str(data_dir() / "models/draft"))
    old_tree, new_tree = OldLearned.default(), LearnedTree.default()
    prompts = []
    for f in sorted((data_dir() / "prompts").glob("*.jsonl")):
        rows = [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
        prompts += [(r["domain"], r["prompt"]) for r in rows[-per:]]
    runs = {"old": lambda d, p: old.generate(p, max_new_tokens=new_tokens, tree=old_tree, domain=d),
            "new": lambda d, p: new.generate(p, max_new_tokens=new_tokens, tree=new_tree, domain=d),
            "plain": lambda d, p: new.generate_plain(p, max_new_tokens=new_tokens)}
    for d, p in prompts[:2]:  # warm-up: compiled kernels, caches
        for run in runs.values():
            run(d, p)
    tokens, seconds = dict.fromkeys(runs, 0), dict.fromkeys(runs, 0.0)
    mismatches = {"old-new": 0, "new-plain": 0}
    order = list(runs)
    for r in range(repeats):
        for i, (d, p) in enumerate(prompts):
            ids = {}
            shift = (i + r) % len(order)  # rotate which row runs first
            for name in order[shift:] + order[:shift]:
                t0 = time.perf_counter()
                result = runs[name](d, p)
                seconds[name] += time.perf_counter() - t0
                ids[name] = list(result.token_ids)
                tokens[name] += len(ids[name])
            mismatches["old-new"] += ids["old"] != ids["new"]
            mismatches["new-plain"] += ids["new"] != ids["plain"]
    rate = {k: tokens[k] / seconds[k] for k in runs}
    result = {"tokens_per_s": rate, "new_over_old": rate["new"] / rate["old"],
              "new_over_plain": rate["new"] / rate["plain"], "old_over_plain": rate["old"] / rate["plain"],
              "mismatches": mismatches, "decodes_per_row": repeats * len(prompts), "new_tokens": new_tokens,
              "tokens": tokens, "seconds": seconds}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
