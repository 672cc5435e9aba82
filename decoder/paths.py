"""Where the shipped data lives: ``data/`` next to the packages, or $TREEWISE_DATA (every layer reads it)."""

from __future__ import annotations

import os
from pathlib import Path

from .errors import TreewiseError

PACKAGED = Path(__file__).resolve().parents[1] / "data"  # inside the installed package (a wheel) or the checkout


def data_dir() -> Path:
    """$TREEWISE_DATA when set (it must name an existing folder), else the ``data/`` installed with treewise."""
    env = os.environ.get("TREEWISE_DATA")
    if not env:
        return PACKAGED
    path = Path(env)
    if not path.is_dir():
        raise TreewiseError(
            f"TREEWISE_DATA={env!r} is not an existing folder: point TREEWISE_DATA at a folder laid out like "
            f"treewise's data/ (models/target, models/draft, predictor/, budgets.json, ...), or unset it to use "
            f"the data installed with treewise ({PACKAGED})")
    return path


def default_pair() -> tuple[Path, Path]:
    """The embedded target and draft folders."""
    models = data_dir() / "models"
    return models / "target", models / "draft"
