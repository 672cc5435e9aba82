"""``SweepConfig``: every default of ``treewise sweep`` (tau per verified node at equal budgets); light, so the
CLI reads its defaults without importing torch."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from treewise.studies.shared.paths import data_dir

SweepPolicy = Literal["confidence", "rerank", "learned", "learned_fill"]

POLICY_HELP: dict[str, str] = {
    "confidence": "ConfidenceTree(budget=N): EAGLE-2, the best N drafted nodes by draft path probability",
    "rerank": "LearnedRerank(budget=N): ConfidenceTree's drafted tree, the best N nodes by predicted path value",
    "learned": "LearnedTree capped at N nodes (every domain), its threshold and latency cost rules as shipped",
    "learned_fill": "LearnedTree capped at N nodes with threshold 0 and cost rules off: it fills the budget",
}


class SweepConfig(BaseModel):
    """A sweep over verified-node budgets: each policy capped at each budget, against plain decoding."""

    model_config = ConfigDict(extra="forbid")

    suite: Path = Field(default_factory=lambda: data_dir() / "prompts")
    split: str = "test"
    domains: list[str] | None = None
    per_domain: int = Field(3, ge=0)  # prompts per domain (0 = all)
    max_new_tokens: int = Field(64, ge=1)
    repeats: int = Field(1, ge=1)  # interleaved repeats: tokens/s is their median (tau does not move)
    budgets: list[int] = Field(default_factory=lambda: [4, 8, 16, 32])
    policies: list[SweepPolicy] = Field(default_factory=lambda: ["confidence", "rerank", "learned", "learned_fill"])
    max_depth: int = Field(6, ge=1)  # deepest level, every policy
    top_k: int = Field(4, ge=1)  # confidence/rerank: nodes expanded per level and children each; learned: max_width
    online: bool = True  # learned policies: the per-request online correction of the predictor
    predictor: Path | None = None  # default: the pair's predictor (controller.pairs.pair_files)
    pair: str | None = None  # a controller.pairs name; None: $TREEWISE_PAIR, else the real pair (smollm2)
    target: str | None = None  # default: the pair's target
    draft: str | None = None
    # Least tau gain of the learned selection over the confidence tree, by budget (budgets not named: 0).
    target_gain: dict[int, float] = Field(default_factory=lambda: {8: 0.05, 16: 0.05})
    baseline: SweepPolicy = "confidence"
    learned_selection: SweepPolicy = "rerank"  # the policy the targets are stated for

    @field_validator("budgets")
    @classmethod
    def _budgets(cls, v: list[int]) -> list[int]:
        if not v or min(v) < 1:
            raise ValueError(f"budgets must be >= 1, got {v}")
        return sorted(set(v))

    @field_validator("policies")
    @classmethod
    def _policies(cls, v: list[SweepPolicy]) -> list[SweepPolicy]:
        if not v:
            raise ValueError("at least one policy")
        return list(dict.fromkeys(v))
