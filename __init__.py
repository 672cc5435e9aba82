"""treewise: domain-aware tree speculative decoding for Hugging Face causal LMs.

The documented API, one import away::

    import treewise
    dec = treewise.load()  # the real pair, its shipped policy
    out = dec.generate("Name three primary colors.")

    from treewise import TreeDecoder, StaticTree, LearnedTree

The four stages install as ``treewise.decoder``, ``treewise.predictor``, ``treewise.controller`` and
``treewise.studies`` (each imports only those before it). Names resolve on first use, so ``import treewise``
and the ``treewise`` command stay light: torch loads when a decoder name is first touched.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.2.0"

# Public name -> the subpackage that defines it.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(
        ("TreeDecoder", "DecodeConfig", "GenerationResult", "GenerationStats", "StepStats", "StaticTree", "Chain",
         "NoDraft", "TreePolicy", "Frontier", "LevelPlan", "RequestInfo", "StepOutcome", "Candidates", "DraftTree",
         "NodeLogWriter", "read_node_logs", "TreewiseError", "verify", "verify_greedy"), "treewise.decoder"),
    **dict.fromkeys(("AcceptancePredictor", "PredictorConfig", "train"), "treewise.predictor"),
    **dict.fromkeys(
        ("LearnedTree", "BudgetedTree", "ConfidenceTree", "DynamicChain", "LearnedRerank", "DomainBudget",
         "BudgetsFile", "LatencyProfile", "DomainClassifier", "load_budgets"), "treewise.controller"),
    "data_dir": "treewise.decoder.paths",
    "load": "treewise.studies.shared.pairs",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'treewise' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # resolved once
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
