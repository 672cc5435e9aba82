"""`treewise demo`: a model pair decodes test prompts per domain, tree vs plain target decoding.

Every tree output is compared with the target's own greedy output (``generate_plain``, Hugging Face's
``model.generate``) of the same prompt, framed the same way (a chat pair frames prompts by its chat template).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from pydantic import BaseModel, computed_field

from treewise.controller import priced_by
from treewise.decoder import TreeDecoder, TreePolicy, TreewiseError
from treewise.studies.shared.pairs import ResolvedPair, host_curve, load_pair_decoder, parameter_count
from treewise.studies.shared.paths import data_dir
from treewise.studies.shared.suites import Prompt, load_suite
from treewise.studies.shared.treespec import build_tree

from .config import DemoConfig


class DemoRow(BaseModel):
    domain: str
    prompt_id: str
    new_tokens: int
    tau: float
    tokens_per_s: float
    plain_tokens_per_s: float
    same_as_plain: bool  # the tree's tokens equal the target's own greedy tokens
    text: str

    @computed_field  # type: ignore[prop-decorator]
    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.plain_tokens_per_s if self.plain_tokens_per_s else 0.0


class DemoResult(BaseModel):
    """What `treewise demo --json` writes: the pair, its sizes, the tree, and one row per prompt."""

    pair: str
    target: str
    draft: str
    target_params: int
    draft_params: int
    chat: bool  # prompts framed by the target's chat template as a user turn
    tree: str
    max_new_tokens: int
    borrowed: list[str]  # the pair's data files borrowed from another pair (controller.pairs.pair_files)
    rows: list[DemoRow]
    precision: str = "exact"  # exact: float32; fast: bfloat16, "same as plain" then against plain bf16 greedy
    host: str = ""  # the host and where the cost curve the policy priced trees by came from (controller.host)


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


def demo_rows(dec: TreeDecoder, prompts: list[Prompt], cfg: DemoConfig, tree: TreePolicy) -> list[DemoRow]:
    """Each prompt with ``tree`` and plainly (after one warm-up of each: first calls pay one-off costs)."""
    torch.set_num_threads(cfg.threads)
    dec.generate(prompts[0].prompt, max_new_tokens=8, tree=tree)
    dec.generate_plain(prompts[0].prompt, max_new_tokens=8)
    rows: list[DemoRow] = []
    for p in prompts:
        out = dec.generate(p.prompt, max_new_tokens=cfg.max_new_tokens, tree=tree, domain=p.domain)
        plain = dec.generate_plain(p.prompt, max_new_tokens=cfg.max_new_tokens)
        rows.append(DemoRow(domain=p.domain, prompt_id=p.id, new_tokens=out.stats.new_tokens, tau=out.stats.tau,
                            tokens_per_s=out.stats.tokens_per_s, plain_tokens_per_s=plain.stats.tokens_per_s,
                            same_as_plain=out.token_ids == plain.token_ids, text=out.text))
    return rows


def run_pair_demo(cfg: DemoConfig, pair: ResolvedPair, suite: Path | None = None) -> DemoResult:
    """The demo on a resolved pair (``studies.shared.pairs.resolve_pair``): the first ``per_domain`` test prompts
    of each domain of ``suite`` (default: the shipped prompts)."""
    prompts = pick_prompts(load_suite(suite or data_dir() / "prompts", split="test"), cfg.per_domain)
    if not prompts:
        raise TreewiseError(f"no test prompts in {suite or data_dir() / 'prompts'}: pass a suite with a test split")
    spec = cfg.tree_for(pair.name)
    tree = build_tree(spec, pair.name)  # a bad spec fails before the models load
    dec = load_pair_decoder(pair, device="cpu", precision=cfg.precision)
    host = ""
    if cfg.host:  # the cost curve of this host kind, measured on first use
        found = host_curve(dec, pair)
        tree, host = priced_by(tree, found.profile), found.line()
    rows = demo_rows(dec, prompts, cfg, tree)
    return DemoResult(pair=pair.name, target=pair.target, draft=pair.draft, target_params=parameter_count(dec.target),
                      draft_params=parameter_count(dec.draft), chat=pair.chat,
                      tree=spec, max_new_tokens=cfg.max_new_tokens,
                      borrowed=list(pair.files.borrowed), rows=rows, host=host,
                      precision=cfg.precision)


def run_demo(cfg: DemoConfig, data: Path | None = None) -> list[DemoRow]:
    """The embedded (micro) pair under ``data`` (default: the shipped data), as `treewise pair-report` runs it."""
    data = data or data_dir()
    models = data / "models"
    if not (models / "target" / "config.json").exists():
        raise TreewiseError(f"no model pair under {models}: run `treewise train-pair` or set TREEWISE_DATA")
    dec = TreeDecoder.from_pretrained(models / "target", models / "draft", device="cpu")
    prompts = pick_prompts(load_suite(data / "prompts", split="test"), cfg.per_domain)
    return demo_rows(dec, prompts, cfg, build_tree(cfg.tree_for("micro"), "micro"))
