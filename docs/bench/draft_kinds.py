"""The real pair's two draft kinds side by side: the standalone draft and a feature draft folder, on the first
test prompt of code, dialogue, math and knowledge, 64 new tokens, chat framing, Chain(3) and StaticTree(2, 3),
each decode checked against the target's own greedy output (one process, same host, 2 threads).

    python docs/bench/draft_kinds.py data/models/smollm2-feature-draft
"""

import sys

import torch

from treewise.decoder import Chain, StaticTree, TreeDecoder
from treewise.decoder.paths import data_dir
from treewise.studies.shared.pairs import resolve_pair
from treewise.studies.shared.suites import load_suite


def main() -> None:
    torch.set_num_threads(2)
    pair = resolve_pair("smollm2")
    prompts = load_suite(data_dir() / "prompts", split="test")
    picked = [next(p for p in prompts if p.domain == d) for d in ("code", "dialogue", "math", "knowledge")]
    decoders = {"standalone": TreeDecoder.from_pretrained(pair.target, pair.draft, chat=True),
                "feature": TreeDecoder.from_pretrained(pair.target, sys.argv[1], chat=True)}
    for p in picked:
        plain = decoders["standalone"].generate_plain(p.prompt, 64)
        for kind, dec in decoders.items():
            for tree in (Chain(3), StaticTree(2, 3)):
                out = dec.generate(p.prompt, 64, tree=tree)
                speedup = out.stats.tokens_per_s / plain.stats.tokens_per_s
                print(f"{p.domain:10s} {kind:10s} {type(tree).__name__:10s} tau {out.stats.tau:.2f} {speedup:.2f}x "
                      f"exact={out.token_ids == plain.token_ids} plain {plain.stats.tokens_per_s:.1f} tok/s")


if __name__ == "__main__":
    main()
