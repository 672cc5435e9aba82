"""Typed results of a generation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["eos", "length", "context"]


@dataclass(frozen=True)
class StageTimes:
    """Where one solo step's time went, in seconds; the model entries exclude building their masks."""

    draft_model: float = 0.0  # draft forwards (the stock model call)
    target_model: float = 0.0  # the target forward (the stock model call)
    masks: float = 0.0  # 4-D masks, position ids and feeds of both models
    drafting: float = 0.0  # children top-k, entropies, frontiers and the tree built from them
    policy: float = 0.0  # the policy's plan and finalize calls, its predictor included
    verify: float = 0.0  # the acceptance rule
    settle: float = 0.0  # emitting tokens, node-log rows, telling the policy
    commit: float = 0.0  # cache compaction and the sequence update
    total: float = 0.0  # the whole step

    @property
    def other(self) -> float:
        """Loop bookkeeping not in any stage above."""
        named = (self.draft_model + self.target_model + self.masks + self.drafting + self.policy + self.verify
                 + self.settle + self.commit)
        return max(0.0, self.total - named)


@dataclass(frozen=True, kw_only=True)
class StepStats:
    drafted: int  # candidates the draft proposed (pruned ones included)
    verified: int  # tree nodes sent to the target, root excluded
    accepted: int  # draft tokens accepted (the bonus token not counted)
    emitted: int  # tokens added to the output (accepted + bonus, cut at EOS / max_new_tokens)
    draft_forwards: int
    draft_s: float  # time in draft forwards (solo: the model calls alone)
    verify_s: float  # time in the target forward (solo: the model call alone)
    other_s: float  # everything else: policy, masks, verification, cache compaction, logging
    policy_s: float = 0.0  # the part of other_s spent in the tree policy (predictor included)
    stages: StageTimes | None = None  # the step split by stage (solo decoding)
    rows: int = 1  # rows decoded together in this step (batched decoding)


# A step of the target's own decoding (``generate_plain``): one token, no draft, times not observable per step.
PLAIN_STEP = StepStats(drafted=0, verified=0, accepted=0, emitted=1, draft_forwards=0, draft_s=0.0, verify_s=0.0,
                       other_s=0.0)


@dataclass
class GenerationStats:
    steps: list[StepStats] = field(default_factory=list)
    total_s: float = 0.0

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def new_tokens(self) -> int:
        return sum(s.emitted for s in self.steps)

    @property
    def drafted(self) -> int:
        return sum(s.drafted for s in self.steps)

    @property
    def verified(self) -> int:
        return sum(s.verified for s in self.steps)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.steps)

    @property
    def tau(self) -> float:
        """Mean tokens emitted per target call (vLLM convention: 1 + accepted / steps, before cuts)."""
        return 1.0 + self.accepted / self.n_steps if self.steps else 0.0

    @property
    def draft_s(self) -> float:
        return sum(s.draft_s for s in self.steps)

    @property
    def verify_s(self) -> float:
        return sum(s.verify_s for s in self.steps)

    @property
    def other_s(self) -> float:
        return sum(s.other_s for s in self.steps)

    @property
    def policy_s(self) -> float:
        return sum(s.policy_s for s in self.steps)

    @property
    def overhead_share(self) -> float:
        """Share of step time spent outside model forwards."""
        busy = self.draft_s + self.verify_s + self.other_s
        return self.other_s / busy if busy else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_s if self.total_s else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "new_tokens": self.new_tokens, "steps": self.n_steps, "tau": self.tau, "drafted": self.drafted,
            "verified": self.verified, "accepted": self.accepted, "draft_s": self.draft_s,
            "verify_s": self.verify_s, "other_s": self.other_s, "policy_s": self.policy_s, "total_s": self.total_s,
            "tokens_per_s": self.tokens_per_s, "overhead_share": self.overhead_share,
        }


@dataclass(frozen=True)
class GenerationResult:
    text: str  # new tokens only
    token_ids: list[int]  # new tokens only
    prompt_ids: list[int]
    finish_reason: FinishReason
    stats: GenerationStats
    policy: str = ""  # which policy decoded it: its spec or class name; "plain" for the target's own decoding
