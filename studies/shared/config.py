"""``BenchConfig``: the settings of a timed comparison, shared by bench and tune; light, so the CLI reads its
defaults without importing torch. ``given``: which options a command line or tree spec set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .paths import data_dir


def given(options: dict[str, Any]) -> dict[str, Any]:
    """The options (or tree-spec parameters) that were given, not left None: the rest keep their config's
    defaults."""
    return {k: v for k, v in options.items() if v is not None}


class BenchConfig(BaseModel):
    """Every default of ``treewise bench``; the CLI reads its defaults from here."""

    model_config = ConfigDict(extra="forbid")

    suite: Path = Field(default_factory=lambda: data_dir() / "prompts")
    split: str = "test"
    domains: list[str] | None = None
    per_domain: int = 3  # prompts per domain (0 = all)
    max_new_tokens: int = 64
    repeats: int = 3
    pair: str | None = None  # a controller.pairs name; None: $TREEWISE_PAIR, else the real pair (smollm2)
    target: str | None = None  # default: the pair's target
    draft: str | None = None  # default: the pair's draft
    # Tree rows: row name -> candidate specs; a row with several candidates reports its fastest one.
    trees: dict[str, list[str]] = Field(default_factory=lambda: {
        "chain": ["chain:length=4"],
        "static": ["static:width=2,depth=3", "static:width=3,depth=2", "static:branching=4-2-1-1"],
        "confidence": ["confidence:budget=16,max_depth=5,top_k=4"],
        "dynamic_chain": ["dynamic_chain"],
        "learned": ["learned"],  # with the per-request online correction (the default)
        "learned_no_online": ["learned:online=false"],  # the same without it
        "budgeted": ["budgeted"],  # the controller's default: per-domain family and size from data/budgets.json
    })
    # Compared rows (A, B): A's tokens/s over B's prompt by prompt, with a bootstrap interval (rows that ran).
    compare: list[tuple[str, str]] = Field(default_factory=lambda: [("learned", "learned_no_online")])
    # Rows of the batched bench (--batch-size): row name -> tree spec, each against batched plain decoding.
    # ``learned`` sizes trees for the batch's goodput: the batch grid's cost model, corrected by measured step
    # times; ``learned_fixed_cost`` prices trees by the solo profile alone, as if each row decoded alone.
    batch_trees: dict[str, str] = Field(default_factory=lambda: {
        "static": "static:width=2,depth=3", "learned_fixed_cost": "learned:batch_aware=false,measured=false",
        "learned": "learned"})
    # Rows of the batched bench that decode all prompts as one continuous batch of at most N rows.
    batch_continuous: dict[str, str] = Field(default_factory=lambda: {"learned_continuous": "learned"})
    hf_assisted: bool = True
    # HF assisted generation settings, set on the draft's generation_config (5.x leaves them unset).
    hf_num_assistant_tokens: int = 20
    hf_schedule: str = "constant"
    hf_confidence_threshold: float = 0.4
    # HF prompt lookup decoding (``prompt_lookup_num_tokens``): candidate tokens per step, 0 = no such row.
    hf_prompt_lookup: int = 0


class ProfileConfig(BaseModel):
    """Every default of ``treewise profile``; the CLI reads its defaults from here."""

    model_config = ConfigDict(extra="forbid")

    suite: Path = Field(default_factory=lambda: data_dir() / "prompts")
    split: str = "test"
    domains: list[str] | None = None
    per_domain: int = 2
    max_new_tokens: int = 64
    pair: str | None = None  # as BenchConfig.pair
    target: str | None = None
    draft: str | None = None
    trees: dict[str, str] = Field(default_factory=lambda: {
        "static": "static:width=2,depth=3",
        "confidence": "confidence:budget=16,max_depth=5,top_k=4",
        "learned": "learned",
    })
