"""`treewise demo`: the embedded pair decodes two test prompts per domain, tree vs plain target decoding."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from treewise.decoder import StaticTree, TreeDecoder, TreePolicy, TreewiseError
from treewise.studies.shared.paths import data_dir
from treewise.studies.shared.suites import Prompt, load_suite

from .config import DemoConfig


@dataclass
class DemoRow:
    domain: str
    prompt_id: str
    new_tokens: int
    tau: float
    tokens_per_s: float
    plain_tokens_per_s: float
    same_as_plain: bool
    text: str

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s else 0.0


def pick_prompts(prompts: list[Prompt], per_domain: int) -> list[Prompt]:
    """Up to per_domain prompts per domain, each from a different source where the suite allows."""
    chosen: list[Prompt] = []
    for domain in dict.fromkeys(p.domain for p in prompts):
        mine = [p for p in prompts if p.domain == domain]
        by_source = {(p.source or "").split(":")[0]: p for p in reversed(mine)}  # first prompt of each source
        picked = list(by_source.values())[:per_domain]
        picked += [p for p in mine if p not in picked][: per_domain - len(picked)]
        chosen += picked
    return chosen


@dataclass
class TreeTrial:
    shape: str
    tau: float
    tokens_per_s: float
    speedup: float


def tree_search(
    dec: TreeDecoder,
    prompts: list[Prompt],
    shapes: dict[str, TreePolicy],
    max_new_tokens: int = 48,
) -> list[TreeTrial]:
    """tau and speed of each tree shape over the same prompts, against plain target decoding."""
    plain = [dec.generate_plain(p.prompt, max_new_tokens=max_new_tokens) for p in prompts]
    plain_s = sum(o.stats.total_s for o in plain)
    plain_tokens = sum(len(o.token_ids) for o in plain)
    trials = []
    for name, tree in shapes.items():
        outs = [dec.generate(p.prompt, max_new_tokens=max_new_tokens, tree=tree, domain=p.domain) for p in prompts]
        tokens = sum(o.stats.new_tokens for o in outs)
        steps = sum(o.stats.n_steps for o in outs)
        secs = sum(o.stats.total_s for o in outs)
        trials.append(TreeTrial(name, tokens / steps, tokens / secs, (tokens / secs) / (plain_tokens / plain_s)))
    return trials


def run_demo(cfg: DemoConfig, data: Path | None = None) -> list[DemoRow]:
    """Decode the first `per_domain` test prompts of each domain with a static tree and plainly."""
    data = data or data_dir()
    models = data / "models"
    if not (models / "target" / "config.json").exists():
        raise TreewiseError(f"no model pair under {models}: run `treewise train-pair` or set TREEWISE_DATA")
    torch.set_num_threads(cfg.threads)
    dec = TreeDecoder.from_pretrained(models / "target", models / "draft", device="cpu")
    tree = StaticTree(width=cfg.width, depth=cfg.depth)
    prompts = load_suite(data / "prompts", split="test")
    dec.generate(prompts[0].prompt, max_new_tokens=8, tree=tree)  # warm-up: first calls pay one-off costs
    dec.generate_plain(prompts[0].prompt, max_new_tokens=8)
    rows: list[DemoRow] = []
    for p in pick_prompts(prompts, cfg.per_domain):
        out = dec.generate(p.prompt, max_new_tokens=cfg.max_new_tokens, tree=tree, domain=p.domain)
        plain = dec.generate_plain(p.prompt, max_new_tokens=cfg.max_new_tokens)
        rows.append(
            DemoRow(
                p.domain,
                p.id,
                out.stats.new_tokens,
                out.stats.tau,
                out.stats.tokens_per_s,
                plain.stats.tokens_per_s,
                out.token_ids == plain.token_ids,
                out.text,
            )
        )
    return rows
