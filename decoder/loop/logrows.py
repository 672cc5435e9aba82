"""Node-log rows of one step: pre-verification features plus labels from the verify pass."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from treewise.decoder.policy import Candidates, candidate_features
from treewise.decoder.records.nodelog import TOKEN_TYPES, feature_columns
from treewise.decoder.verify import Acceptance, row_argmax


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


def step_rows(cand: Candidates, acc: Acceptance, target_logits: torch.Tensor, token_types: np.ndarray,
              meta: RowMeta) -> dict[str, np.ndarray]:
    """One row per drafted candidate; ``target_logits`` is [n, V] over tree nodes."""
    m = cand.size
    target_argmax = torch.from_numpy(row_argmax(target_logits))  # [n]
    # Greedy verification skips the softmax; the log's target_prob is the untempered distribution then.
    probs = acc.target_probs if acc.target_probs is not None else torch.softmax(target_logits.float(), dim=-1)
    parent_tree = torch.zeros(m, dtype=torch.long)
    has_parent = cand.parent >= 0
    parent_tree[has_parent] = cand.tree_index[cand.parent[has_parent]]
    tokens = cand.tokens
    on_path = torch.zeros(probs.shape[0], dtype=torch.bool)
    on_path[acc.path] = True
    kept = cand.tree_index >= 0
    path_hit = torch.zeros(m, dtype=torch.bool)
    path_hit[kept] = on_path[cand.tree_index[kept]]
    accept_prob = torch.full((m,), float("nan"))
    accept_prob[kept] = acc.accept_prob[cand.tree_index[kept]].float()
    target_prob = probs[parent_tree.to(probs.device), tokens.to(probs.device)]
    tok_np = tokens.numpy()
    type_names = np.asarray(TOKEN_TYPES, dtype=object)
    token_type = type_names[token_types[tok_np]] if m else np.zeros(0, dtype=object)
    ids = feature_columns(m, {"run_id": meta.run_id, "prompt_id": meta.prompt_id, "step": meta.step,
                              "node_id": np.arange(m), "parent_id": cand.parent.numpy()})
    features = candidate_features(cand, cand.depth.numpy(), token_type, domain=meta.domain, position=meta.position,
                                  prompt_len=meta.prompt_len, running_accept_rate=meta.running_accept_rate,
                                  prev_accepted=meta.prev_accepted, temperature=meta.temperature)
    return ids | features | {
        "verified": kept.numpy(),
        "target_prob": target_prob.float().cpu().numpy(),
        "target_argmax_match": (tokens == target_argmax.cpu()[parent_tree]).numpy(),
        "on_accepted_path": path_hit.numpy(),
        "accept_prob": accept_prob.numpy().astype(np.float32),
    }
