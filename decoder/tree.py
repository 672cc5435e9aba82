"""The draft tree as data: built once from ``parents`` into a frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from .errors import TreewiseError

_NUMPY_FLOATS = {torch.float32: np.float32, torch.float16: np.float16, torch.float64: np.float64}
_LOWEST = {t: np.finfo(n).min for t, n in _NUMPY_FLOATS.items()}  # np.finfo costs a few us a call


@dataclass(frozen=True)
class DraftTree:
    """A token tree rooted at the last committed token.

    Node 0 is the root (the pending token, already emitted); nodes are in topological order
    (``parents[i] < i``) so a node's ancestors always have smaller indices.
    """

    tokens: torch.Tensor  # [n] int64
    parents: torch.Tensor  # [n] int64, parents[0] == -1
    depth: torch.Tensor  # [n] int64, depth[0] == 0
    ancestor_mask: torch.Tensor  # [n, n] bool, [i, j] true iff j is i or an ancestor of i

    @classmethod
    def from_parents(cls, parents: list[int] | torch.Tensor, tokens: list[int] | torch.Tensor) -> DraftTree:
        parents_t = torch.as_tensor(parents, dtype=torch.long).cpu()
        tokens_t = torch.as_tensor(tokens, dtype=torch.long)
        n = parents_t.numel()
        if n == 0 or tokens_t.numel() != n:
            raise TreewiseError(f"a tree needs a root and one token per node (parents {n}, tokens {tokens_t.numel()})")
        # Python and numpy: a tree has a few dozen nodes, where each torch op's dispatch costs more than its work.
        plist = parents_t.tolist()
        if plist[0] != -1:
            raise TreewiseError("node 0 must be the root: parents[0] must be -1")
        dlist = [0] * n
        rows, cols = list(range(n)), list(range(n))  # the (node, ancestor-or-self) pairs of the mask
        for i in range(1, n):  # parents come first
            p = plist[i]
            if not 0 <= p < i:
                raise TreewiseError("parents must point to earlier nodes (topological order, parents[i] < i)")
            dlist[i] = dlist[p] + 1
            while p >= 0:  # about n * depth pairs: a few dozen, cheaper in Python than numpy calls per level
                rows.append(i)
                cols.append(p)
                p = plist[p]
        depth = np.asarray(dlist, dtype=np.int64)
        anc = np.zeros((n, n), dtype=bool)
        anc[rows, cols] = True
        depth_t = torch.from_numpy(depth)
        return cls(tokens=tokens_t, parents=parents_t,
                   depth=depth_t if tokens_t.device.type == "cpu" else depth_t.to(tokens_t.device),
                   ancestor_mask=torch.from_numpy(anc))

    @property
    def size(self) -> int:
        return int(self.parents.numel())

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())

    def position_ids(self, root_position: int) -> torch.Tensor:
        """[n] absolute positions: the root sits at ``root_position``, each node one past its parent."""
        return self.depth + root_position

    @cached_property
    def paths(self) -> list[list[int]]:
        """Root-to-leaf node index paths, one per leaf."""
        is_parent = torch.zeros(self.size, dtype=torch.bool)
        is_parent[self.parents[1:]] = True
        leaves = torch.nonzero(~is_parent).flatten().tolist()
        return [torch.nonzero(self.ancestor_mask[leaf]).flatten().tolist() for leaf in leaves]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to ``node`` inclusive (sorted = depth order)."""
        return torch.nonzero(self.ancestor_mask[node]).flatten().tolist()


def tree_attention_mask(visible_new: torch.Tensor, past_len: int, dtype: torch.dtype,
                        positions: torch.Tensor | None = None, window: int | None = None) -> torch.Tensor:
    """Additive 4-D mask [1, 1, q, past_len + t] for one forward over q new tokens.

    ``visible_new`` is [q, t] bool: which of the t uncached slots (the q new tokens are the last q)
    each query sees. Every one of the ``past_len`` cached positions is visible, unless ``window`` is set:
    then a query sees only keys less than ``window`` positions behind it, as a sliding-window layer does
    in sequential decoding. ``positions`` [t] are the uncached slots' position ids; cached slot i sits at
    position i (compaction keeps only the committed prefix), so the window counts along each node's path.
    """
    q, t = visible_new.shape
    if window is None and visible_new.device.type == "cpu" and dtype in _NUMPY_FLOATS:
        # The common case on CPU, in numpy: two array ops, cheaper than four torch ones (docs/performance.md).
        np_dtype, low = _NUMPY_FLOATS[dtype], _LOWEST[dtype]
        out = np.zeros((1, 1, q, past_len + t), dtype=np_dtype)
        np.copyto(out[0, 0, :, past_len:], low, where=~visible_new.numpy())
        return torch.from_numpy(out)
    if window is None:  # only the uncached slots can be hidden
        mask = torch.zeros(q, past_len + t, dtype=dtype, device=visible_new.device)
        mask[:, past_len:].masked_fill_(~visible_new, torch.finfo(dtype).min)
        return mask[None, None]
    visible = torch.ones(q, past_len + t, dtype=torch.bool, device=visible_new.device)  # [q, past + t]
    visible[:, past_len:] = visible_new
    if positions is None:
        raise TreewiseError("a sliding-window mask needs the position ids of the uncached slots")
    k_pos = torch.cat([torch.arange(past_len, device=positions.device), positions])  # [past + t]
    visible &= (positions[t - q:, None] - k_pos[None, :]) < window
    mask = torch.zeros(q, past_len + t, dtype=dtype, device=visible_new.device)
    return mask.masked_fill_(~visible, torch.finfo(dtype).min)[None, None]


def chain_then_tree(chain_len: int, ancestor_mask: torch.Tensor) -> torch.Tensor:
    """[c + n, c + n] visibility for ``chain_len`` committed-but-uncached tokens followed by a tree.

    The chain is causal; every tree node sees the whole chain plus its own ancestors.
    """
    n = ancestor_mask.shape[0]
    size = chain_len + n
    vis = torch.zeros(size, size, dtype=torch.bool, device=ancestor_mask.device)
    vis[:chain_len, :chain_len] = torch.ones(chain_len, chain_len, dtype=torch.bool, device=vis.device).tril()
    vis[chain_len:, :chain_len] = True
    vis[chain_len:, chain_len:] = ancestor_mask
    return vis
