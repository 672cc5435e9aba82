"""Adaptive tree policies on the decoder's TreePolicy protocol: learned pruning and widening under
per-domain budgets, plus the dynamic baselines (EAGLE-2's confidence tree, HF's dynamic chain)."""

from .budgeted import BudgetedTree, policy_from_budget, static_from_budget
from .budgets import BudgetError, BudgetsFile, DomainBudget, Provenance, load_budgets, save_budgets
from .domains import (
    DomainClassifier,
    DomainClassifierConfig,
    DomainClassifierError,
    DomainReport,
    DomainTraining,
    train_domain_classifier,
)
from .host import HostInfo, HostProfile, host_info, host_profile, load_or_measure, priced_by
from .hybrid import Hybrid
from .latency import LatencyProfile, measure_latency
from .learned import AcceptanceModel, LearnedTree
from .policies import ConfidenceTree, DynamicChain, refit_threshold
from .rerank import LearnedRerank

__all__ = [
    "AcceptanceModel", "BudgetError", "BudgetedTree", "BudgetsFile", "ConfidenceTree", "DomainBudget",
    "DomainClassifier", "DomainClassifierConfig", "DomainClassifierError", "DomainReport", "DomainTraining",
    "DynamicChain", "HostInfo", "HostProfile", "Hybrid", "LatencyProfile", "LearnedRerank", "LearnedTree", "Provenance",
    "host_info", "host_profile", "load_budgets", "load_or_measure", "priced_by",
    "measure_latency", "policy_from_budget", "refit_threshold", "save_budgets", "static_from_budget",
    "train_domain_classifier",
]
