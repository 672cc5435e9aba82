"""``treewise latency --linears-ab``: the target's forward with torch's ``nn.Linear`` against the decoder's
``SkinnyLinear`` (decoder/kernels/linears.py), timed in turns so that a slow spell of the machine hits both alike;
with ``--decode N``, also whole decodes of N test prompts per domain, the two kinds alternating by prompt."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from rich.table import Table
from torch import nn
from transformers import PreTrainedModel

from treewise.controller.latency import SIZES, time_forwards
from treewise.decoder import TreeDecoder
from treewise.decoder.kernels.linears import SkinnyLinear, swap_linears


@dataclass(frozen=True)
class LinearsAB:
    sizes: tuple[int, ...]
    stock_ms: list[float]  # median over rounds of each round's median, nn.Linear
    skinny_ms: list[float]  # the same with SkinnyLinear
    context: int
    rounds: int


def measure_linears(model: PreTrainedModel, context: int = 128, rounds: int = 6, repeats: int = 5) -> LinearsAB:
    """Alternate the two kinds ``rounds`` times, ``repeats`` timed forwards per size each; ``model`` ends as it was
    loaded on CPU (SkinnyLinear)."""
    runs: dict[type[nn.Linear], list[list[float]]] = {nn.Linear: [], SkinnyLinear: []}
    try:
        for _ in range(rounds):
            for kind, times in runs.items():
                swap_linears(model, kind)
                times.append(time_forwards(model, context, SIZES, repeats))
    finally:
        swap_linears(model, SkinnyLinear)
    med = {kind: [statistics.median(r[i] for r in t) for i in range(len(SIZES))] for kind, t in runs.items()}
    return LinearsAB(SIZES, med[nn.Linear], med[SkinnyLinear], context, rounds)


def linears_table(ab: LinearsAB) -> Table:
    table = Table(title=f"target forward, ms (context {ab.context}, {ab.rounds} alternating rounds): nn.Linear "
                        "against SkinnyLinear")
    for col in ("tokens", "nn.Linear", "SkinnyLinear", "ratio", "nn.Linear / its 1 token",
                "SkinnyLinear / its 1 token"):
        table.add_column(col, justify="right")
    for n, a, b in zip(ab.sizes, ab.stock_ms, ab.skinny_ms, strict=True):
        table.add_row(str(n), f"{a:.1f}", f"{b:.1f}", f"{b / a:.2f}", f"{a / ab.stock_ms[0]:.2f}",
                      f"{b / ab.skinny_ms[0]:.2f}")
    return table


@dataclass(frozen=True)
class LinearsDecodeAB:
    prompts: int
    max_new_tokens: int
    tree: str
    stock_tokens_per_s: float  # all prompts' tokens over their time, nn.Linear
    skinny_tokens_per_s: float
    ratio_median: float  # median over prompts of stock time / skinny time (> 1: SkinnyLinear faster)
    ratio_range: tuple[float, float]
    mismatches: int  # prompts whose two outputs differ


def measure_linears_decode(dec: TreeDecoder, prompts: list[str], tree: str, max_new_tokens: int,
                           pair: str | None = None) -> LinearsDecodeAB:
    """Decode every prompt with both kinds of linear layer in both models, the order alternating by prompt,
    with tree spec ``tree``; the models end as loaded (SkinnyLinear)."""
    from treewise.studies.shared.treespec import build_tree

    kinds = (nn.Linear, SkinnyLinear)
    time_s = {k: [] for k in kinds}
    tokens = {k: 0 for k in kinds}
    mismatches = 0
    try:
        for i, prompt in enumerate(prompts):
            ids = {}
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                for model in (dec.target, dec.draft):
                    swap_linears(model, kind)
                out = dec.generate(prompt, max_new_tokens=max_new_tokens, tree=build_tree(tree, pair))
                time_s[kind].append(out.stats.total_s)
                tokens[kind] += len(out.token_ids)
                ids[kind] = out.token_ids
            mismatches += ids[nn.Linear] != ids[SkinnyLinear]
    finally:
        for model in (dec.target, dec.draft):
            swap_linears(model, SkinnyLinear)
    ratios = [a / b for a, b in zip(time_s[nn.Linear], time_s[SkinnyLinear], strict=True)]
    return LinearsDecodeAB(len(prompts), max_new_tokens, tree, tokens[nn.Linear] / sum(time_s[nn.Linear]),
                           tokens[SkinnyLinear] / sum(time_s[SkinnyLinear]), statistics.median(ratios),
                           (min(ratios), max(ratios)), mismatches)
