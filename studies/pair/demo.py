"""`treewise demo`: the embedded pair decodes two test prompts per domain, tree vs plain target decoding."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import typer
from pydantic import BaseModel
from rich.console import Console
from rich.table import Table

from decoder import StaticTree, TreeDecoder, TreePolicy
from studies.shared.paths import data_dir
from studies.shared.suites import Prompt, load_suite


class DemoConfig(BaseModel):
    """Defaults of `treewise demo`."""

    per_domain: int = 2
    max_new_tokens: int = 48  # keeps the demo under a minute on 2 shared cores
    width: int = 2
    depth: int = 3  # StaticTree(2, 3): the fastest tree in the card's shape search (Chain(2) was close)
    threads: int = 2


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
        raise FileNotFoundError(f"no model pair under {models}: run `treewise train-pair` or set TREEWISE_DATA")
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


def demo_cmd(
    per_domain: int = typer.Option(DemoConfig().per_domain, help="Test prompts per domain."),
    max_new_tokens: int = typer.Option(DemoConfig().max_new_tokens, help="New tokens per prompt."),
    width: int = typer.Option(DemoConfig().width, help="Static tree width."),
    depth: int = typer.Option(DemoConfig().depth, help="Static tree depth."),
    threads: int = typer.Option(DemoConfig().threads, help="torch threads."),
) -> None:
    """Decode two test prompts per domain with the embedded pair: tree vs plain target decoding."""
    cfg = DemoConfig(per_domain=per_domain, max_new_tokens=max_new_tokens, width=width, depth=depth, threads=threads)
    console = Console()
    rows = run_demo(cfg)
    table = Table(title=f"treewise demo: StaticTree(width={width}, depth={depth}) vs target.generate")
    for name in ("domain", "new", "tau", "tok/s", "plain", "speedup"):
        table.add_column(name, no_wrap=True)
    table.add_column("text", no_wrap=True, overflow="ellipsis", max_width=20)
    for r in rows:
        table.add_row(
            r.domain,
            str(r.new_tokens),
            f"{r.tau:.2f}",
            f"{r.tokens_per_s:.0f}",
            f"{r.plain_tokens_per_s:.0f}",
            f"{r.speedup:.2f}x",
            repr(r.text[:40]),
        )
    console.print(table)
    tok = sum(r.new_tokens for r in rows)
    tree_s = sum(r.new_tokens / r.tokens_per_s for r in rows if r.tokens_per_s)
    plain_s = sum(r.new_tokens / r.plain_tokens_per_s for r in rows if r.plain_tokens_per_s)
    console.print(
        f"all: {tok} tokens, mean tau {sum(r.tau for r in rows) / len(rows):.2f}, "
        f"tree {tok / tree_s:.0f} tok/s vs plain {tok / plain_s:.0f} tok/s ({plain_s / tree_s:.2f}x); "
        f"tree output identical to plain greedy in {sum(r.same_as_plain for r in rows)}/{len(rows)} prompts"
    )
