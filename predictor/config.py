"""Every hyper-parameter of the acceptance predictor, in one validated place (the only copy of defaults)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from treewise.decoder.records.nodelog import FEATURE_COLUMNS

from .derived import DERIVED_COLUMNS

LabelKind = Literal["hard", "soft"]
CalibrationKind = Literal["none", "isotonic"]
SplitBy = Literal["prompt_id", "request"]

# Where `treewise train` writes and the controller loads the default predictor.
DEFAULT_MODEL_DIR = Path("data/predictor")

# Node-log columns that identify a row rather than describe it: never features. token_id is not one of them:
# a BPE vocabulary numbers its tokens in merge order, so the id is a frequency rank (rare tokens are drafted
# worse); the real pair's predictor reads it (data/smollm2/predictor/config.json, docs/predictor.md).
ID_COLUMNS: tuple[str, ...] = ("run_id", "prompt_id", "step", "node_id", "parent_id")

# prompt_len is left out: templates of one source share a prompt length, so it can only identify sources
# (on the source-held-out split, adding it back made no measurable difference; docs/predictor.md).
DEFAULT_FEATURES: tuple[str, ...] = (
    "domain",
    "depth",
    "sibling_rank",
    "draft_logprob",
    "draft_entropy",
    "draft_margin",
    "path_logprob",
    "parent_draft_prob",
    "token_type",
    "position",
    "running_accept_rate",
    "prev_accepted",
    "temperature",
    "recent_accepted",
    "recent_accept_rate",
    "parent_margin",
    "parent_entropy",
    "source",
    "lookup_prob",
    "lookup_count",
    "match_len",
)

# Groups dropped together in the ablation study (each is one question: does this information help?).
# A group none of whose features the model uses is added instead (``+group`` in the tables).
FEATURE_GROUPS: dict[str, tuple[str, ...]] = {
    "running_acceptance": ("running_accept_rate", "prev_accepted"),
    "recent_acceptance": ("recent_accepted", "recent_accept_rate"),
    "parent": ("parent_margin", "parent_entropy"),
    "domain": ("domain",),
    "entropy_margin": ("draft_entropy", "draft_margin"),
    "position": ("position",),
    "prompt_len": ("prompt_len",),
    "path": ("path_logprob", "parent_draft_prob"),
    "token_type": ("token_type",),
    "token_id": ("token_id",),
    "lookup": ("source", "lookup_prob", "lookup_count", "match_len"),
}


class LightGBMParams(BaseModel):
    """LightGBM booster parameters. Few, small trees on purpose: predict cost grows with trees x rows
    (on the acc-w2d3 logs, 59 trees of 15 leaves scored test AUC 0.942, 231 trees 0.944)."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float = Field(0.2, gt=0, le=1)
    num_leaves: int = Field(15, ge=2)
    max_depth: int = Field(6, ge=-1)
    min_data_in_leaf: int = Field(50, ge=1)
    feature_fraction: float = Field(0.9, gt=0, le=1)
    bagging_fraction: float = Field(0.8, gt=0, le=1)
    bagging_freq: int = Field(1, ge=0)
    lambda_l2: float = Field(1.0, ge=0)
    cat_smooth: float = Field(10.0, ge=0)
    num_threads: int = Field(1, ge=0)  # 1: the decoder's torch threads own the CPU
    extra: dict[str, Any] = Field(default_factory=dict)  # any other LightGBM parameter, passed through

    def to_lightgbm(self, objective: str, seed: int) -> dict[str, Any]:
        params = self.model_dump(exclude={"extra"})
        params.update(
            objective=objective,
            metric=["binary_logloss" if objective == "binary" else "cross_entropy"],
            seed=seed,
            deterministic=True,
            force_row_wise=True,
            verbosity=-1,
        )
        params.update(self.extra)
        return params


class PredictorConfig(BaseModel):
    """Training configuration; saved next to the model so a study can retrain it on the same split."""

    model_config = ConfigDict(extra="forbid")

    features: list[str] = Field(default_factory=lambda: list(DEFAULT_FEATURES))
    label: LabelKind = "hard"
    calibration: CalibrationKind = "isotonic"
    lightgbm: LightGBMParams = Field(default_factory=LightGBMParams)
    num_boost_round: int = Field(100, ge=1)  # a cap on trees: the runtime cost of predict_batch
    early_stopping_rounds: int = Field(20, ge=0)  # 0 disables early stopping
    train_fraction: float = Field(0.7, gt=0, lt=1)
    valid_fraction: float = Field(0.15, gt=0, lt=1)  # the rest of the prompts are the test split
    split_by: SplitBy = "prompt_id"  # prompt_id keeps one prompt on one side even across runs
    seed: int = 0

    @field_validator("features")
    @classmethod
    def _known_features(cls, names: list[str]) -> list[str]:
        allowed = [n for n in FEATURE_COLUMNS if n not in ID_COLUMNS] + list(DERIVED_COLUMNS)
        unknown = [n for n in names if n not in allowed]
        if unknown:
            raise ValueError(f"unknown features {unknown}: choose among {allowed}")
        if len(set(names)) != len(names) or not names:
            raise ValueError("features must be a non-empty list without duplicates")
        return names

    @model_validator(mode="after")
    def _fractions(self) -> PredictorConfig:
        if self.train_fraction + self.valid_fraction >= 1:
            raise ValueError("train_fraction + valid_fraction must leave prompts for the test split (< 1)")
        return self

    @property
    def objective(self) -> str:
        # The binary objective rounds labels to 0/1; cross_entropy accepts probabilities in [0, 1].
        return "binary" if self.label == "hard" else "cross_entropy"

    def without(self, dropped: tuple[str, ...]) -> PredictorConfig:
        """A copy with some features removed (ablation)."""
        return self.model_copy(update={"features": [f for f in self.features if f not in dropped]})

    def with_features(self, added: tuple[str, ...]) -> PredictorConfig:
        """A copy with some features appended (ablation of a group the model does not use)."""
        return self.model_copy(update={"features": self.features + [f for f in added if f not in self.features]})
