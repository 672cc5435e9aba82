"""Defaults of `treewise study acceptance` (the CLI reads its option defaults from here); light, no numpy."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class StudyConfig(BaseModel):
    """Defaults of `treewise study acceptance` (the CLI reads its option defaults from here)."""

    model_config = ConfigDict(extra="forbid")

    bootstrap_reps: int = Field(1000, ge=0, description="bootstrap replicates (prompt resampling)")
    seed: int = Field(0, description="seed of the bootstrap and of the fold split")
    folds: int = Field(5, ge=1, description="prompt folds of the out-of-fold log-loss")
    entropy_bins: int = Field(10, ge=1, description="quantile bins of draft entropy for the acceptance curve")
