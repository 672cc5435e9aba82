"""Where the shipped data lives: ``data/`` next to the packages, or $TREEWISE_DATA (every layer reads it)."""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    env = os.environ.get("TREEWISE_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[1] / "data"


def default_pair() -> tuple[Path, Path]:
    """The embedded target and draft folders."""
    models = data_dir() / "models"
    return models / "target", models / "draft"
