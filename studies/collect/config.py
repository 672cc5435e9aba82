"""Defaults of `treewise collect` (the CLI reads its option defaults from here); light, no torch."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from treewise.studies.shared.paths import data_dir


class CollectConfig(BaseModel):
    """Defaults of `treewise collect` (the CLI reads its option defaults from here)."""

    model_config = ConfigDict(extra="forbid")

    out: Path
    suite: Path = Field(default_factory=lambda: data_dir() / "prompts")
    split: str = "all"
    domains: list[str] | None = None
    tree: str = "static:width=2,depth=3"
    max_new_tokens: int = Field(128, ge=1)
    temperature: float = Field(0.0, ge=0.0)
    seed: int = 0
    shard: str = "1/1"
    pair: str | None = None  # a controller.pairs name; None: $TREEWISE_PAIR, else the real pair (smollm2)
    target: Path | None = None  # default: the pair's target (plan_collect fills it in)
    draft: Path | None = None  # default: the pair's draft
    device: str | None = None
    batch_size: int = Field(1, ge=1)  # prompts decoded together (generate_batch); node rows are the same
    check_greedy: bool = True  # greedy runs: decode each prompt with plain target greedy too
