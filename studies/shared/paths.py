"""Where the shipped data lives: ``data/`` next to the packages, or $TREEWISE_DATA.

The same rule as ``decoder.paths``, restated here because importing anything under ``decoder`` imports
torch, and the CLI reads these defaults before it knows whether a command will decode at all;
tests/studies/test_cli.py holds the two equal. One difference on purpose: ``decoder.paths.data_dir`` raises
when $TREEWISE_DATA names no folder, this copy does not, because the CLI evaluates its option defaults at import
and ``treewise --help`` must work whatever the variable says (a command that loads data then gets the error).
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    env = os.environ.get("TREEWISE_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "data"


def default_pair() -> tuple[Path, Path]:
    """The embedded target and draft folders."""
    models = data_dir() / "models"
    return models / "target", models / "draft"


# The model pairs of ``controller.pairs.PAIRS``, named here for ``--help`` (which imports no torch);
# tests/studies/test_cli.py holds the two equal.
PAIR_NAMES = ("smollm2", "micro")
# Each pair's shipped policy, a tree spec (studies.shared.treespec) sized for its cost curve: what `treewise demo`
# and `treewise.load` decode with (docs/real-pair.md says how each was chosen); ``OWN_PAIR_POLICY`` is theirs
# for a pair of the user's own, which ships no budgets or predictor: EAGLE-2's tree reads only the draft.
PAIR_POLICIES = {
    "smollm2": "budgeted",  # per domain, the family and size data/smollm2/budgets.json names
    "micro": "static:width=2,depth=3",  # the fastest tree in the micro card's shape search (Chain(2) close)
}
OWN_PAIR_POLICY = "confidence"
PAIR_HELP = ("model pair: smollm2 (the real pair: SmolLM2-135M-Instruct, fetched on first use, and its trained "
             "draft) or micro (the embedded test pair); --target/--draft override its folders "
             "[default: $TREEWISE_PAIR, else smollm2]")
