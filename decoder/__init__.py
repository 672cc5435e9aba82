"""Lossless tree speculative decoding for any pair of Hugging Face causal LMs sharing a tokenizer."""

from .arena import ArenaCache
from .draft import DraftContext, DraftResult, draft_tree
from .engine import DEFAULTS, DecodeConfig, TreeDecoder
from .errors import TreewiseError
from .lookup import LookupConfig, LookupIndex, LookupSource, LookupTree, SuffixStore
from .merge import Proposer, merge_lookup
from .nodelog import (
    FEATURE_COLUMNS,
    LABEL_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    TOKEN_TYPES,
    NodeLogError,
    NodeLogWriter,
    read_node_logs,
)
from .policy import (
    Candidates,
    Chain,
    Frontier,
    LevelPlan,
    NoDraft,
    RequestInfo,
    StaticTree,
    StepOutcome,
    TreePolicy,
    top_k_mask,
)
from .results import GenerationResult, GenerationStats, StageTimes, StepStats
from .tree import DraftTree, chain_then_tree, tree_attention_mask
from .verify import Acceptance, Sampling, Verifier, VerifyInput, verify, verify_greedy

__all__ = [
    "DEFAULTS", "FEATURE_COLUMNS", "LABEL_COLUMNS", "SCHEMA", "SCHEMA_VERSION", "TOKEN_TYPES", "Acceptance",
    "ArenaCache", "Candidates", "Chain", "DecodeConfig", "DraftContext", "DraftResult", "DraftTree", "Frontier",
    "GenerationResult", "GenerationStats", "LevelPlan", "LookupConfig", "LookupIndex", "LookupSource",
    "LookupTree", "NoDraft", "NodeLogError", "NodeLogWriter", "Proposer", "RequestInfo",
    "Sampling", "StageTimes", "StaticTree", "StepOutcome", "StepStats", "SuffixStore", "TreeDecoder", "TreePolicy",
    "TreewiseError",
    "Verifier", "VerifyInput", "chain_then_tree", "draft_tree", "merge_lookup", "read_node_logs", "top_k_mask",
    "tree_attention_mask", "verify", "verify_greedy",
]
