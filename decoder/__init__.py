"""Lossless tree speculative decoding for any pair of Hugging Face causal LMs sharing a tokenizer."""

from treewise.decoder.cache.arena import ArenaCache
from treewise.decoder.candidates.lookup import LookupConfig, LookupIndex, LookupSource, LookupTree, SuffixStore
from treewise.decoder.candidates.merge import Proposer, merge_lookup
from treewise.decoder.loop.engine import DEFAULTS, DecodeConfig, TreeDecoder
from treewise.decoder.records.nodelog import (
    FEATURE_COLUMNS,
    LABEL_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    TOKEN_TYPES,
    NodeLogError,
    NodeLogWriter,
    read_node_logs,
)
from treewise.decoder.records.results import GenerationResult, GenerationStats, StageTimes, StepStats

from .draft import DraftContext, DraftResult, draft_tree
from .errors import TreewiseError
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
