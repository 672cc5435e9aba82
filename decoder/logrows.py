"""Node-log rows of one step: pre-verification features plus labels from the verify pass."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from .nodelog import TOKEN_TYPES
from .policy import Candidates
from .verify import Acceptance


@dataclass(frozen=True)
class RowMeta:
    run_id: str
    prompt_id: str
    domain: str
    step: int
    position: int  # tokens generated before this step
    prompt_len: int
    running_accept_rate: float
    prev_accepted: int
    temperature: float


def step_rows(cand: Candidates, acc: Acceptance, target_argmax: torch.Tensor, token_types: np.ndarray,
              meta: RowMeta) -> dict[str, np.ndarray]:
    """One row per drafted candidate; ``target_argmax`` is [n] over tree nodes."""
    m = cand.size
    parent_tree = torch.zeros(m, dtype=torch.long)
    has_parent = cand.parent >= 0
    parent_tree[has_parent] = cand.tree_index[cand.parent[has_parent]]
    tokens = cand.tokens
    on_path = torch.zeros(acc.target_probs.shape[0], dtype=torch.bool)
    on_path[acc.path] = True
    kept = cand.tree_index >= 0
    path_hit = torch.zeros(m, dtype=torch.bool)
    path_hit[kept] = on_path[cand.tree_index[kept]]
    accept_prob = torch.full((m,), float("nan"))
    accept_prob[kept] = acc.accept_prob[cand.tree_index[kept]].float()
    target_prob = acc.target_probs[parent_tree.to(acc.target_probs.device), tokens.to(acc.target_probs.device)]
    tok_np = tokens.numpy()
    type_names = np.asarray(TOKEN_TYPES, dtype=object)
    full = np.full
    return {
        "run_id": full(m, meta.run_id, dtype=object),
        "prompt_id": full(m, meta.prompt_id, dtype=object),
        "domain": full(m, meta.domain, dtype=object),
        "step": full(m, meta.step, dtype=np.int32),
        "node_id": np.arange(m, dtype=np.int32),
        "parent_id": cand.parent.numpy().astype(np.int32),
        "depth": cand.depth.numpy().astype(np.int16),
        "sibling_rank": cand.sibling_rank.numpy().astype(np.int16),
        "token_id": tok_np.astype(np.int32),
        "token_type": type_names[token_types[tok_np]] if m else np.zeros(0, dtype=object),
        "draft_logprob": cand.draft_logprob.numpy().astype(np.float32),
        "draft_entropy": cand.draft_entropy.numpy().astype(np.float32),
        "draft_margin": cand.draft_margin.numpy().astype(np.float32),
        "path_logprob": cand.path_logprob.numpy().astype(np.float32),
        "parent_draft_prob": cand.parent_draft_prob.numpy().astype(np.float32),
        "position": (meta.position + cand.depth.numpy() - 1).astype(np.int32),
        "prompt_len": full(m, meta.prompt_len, dtype=np.int32),
        "running_accept_rate": full(m, meta.running_accept_rate, dtype=np.float32),
        "prev_accepted": full(m, meta.prev_accepted, dtype=np.int16),
        "temperature": full(m, meta.temperature, dtype=np.float32),
        "verified": kept.numpy(),
        "target_prob": target_prob.float().cpu().numpy(),
        "target_argmax_match": (tokens == target_argmax.cpu()[parent_tree]).numpy(),
        "on_accepted_path": path_hit.numpy(),
        "accept_prob": accept_prob.numpy().astype(np.float32),
    }
