"""Few-row matrix products on CPU: the shape tree verification makes, and the one CPU BLAS handles worst.

``F.linear(x, W)`` computes ``x @ W.T``. With 2-64 rows of ``x`` and a large ``W``, MKL's sgemm on this
kind of x86 CPU takes 1.5-4x longer than the same product written ``(W @ x.T).T``, which streams ``W`` once
as the one-row matrix-vector product does (SmolLM2's 49,152 x 576 output layer, 2 threads: 46 vs 12 ms at
4 rows, 81 vs 36 ms at 16; a whole 30-layer forward of 4 tokens: 226 vs 132 ms, of 1 token: 130 ms either
way). Verifying a tree of a few nodes is therefore nearly as cheap as one decoding step, which is what
speculative decoding needs. One row keeps ``F.linear`` (a matrix-vector product either way), so plain
decoding runs the very kernel it ran before.

The swap replaces modules through the public ``nn.Module`` API (as PyTorch's own quantisation does), keeps
each Parameter object (tied embeddings stay tied) and changes no model code.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["SkinnyLinear", "swap_linears", "use_skinny_linears"]


class SkinnyLinear(nn.Linear):
    """``nn.Linear`` whose multi-row CPU product runs as ``(W @ x.T).T``; same weights, same state dict."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(x.shape[-1], 1)
        if rows <= 1 or x.device.type != "cpu":
            return F.linear(x, self.weight, self.bias)
        out = torch.matmul(self.weight, x.reshape(rows, x.shape[-1]).T).T.reshape(*x.shape[:-1], -1)
        return out if self.bias is None else out + self.bias


def use_skinny_linears(model: nn.Module) -> int:
    """Swap every plain ``nn.Linear`` of ``model`` for a ``SkinnyLinear`` sharing its parameters, in place.

    Returns how many were swapped. ``swap_linears(model, nn.Linear)`` undoes it (for an A/B on another CPU:
    ``treewise latency --linears-ab``).
    """
    return swap_linears(model, SkinnyLinear)


def swap_linears(model: nn.Module, kind: type[nn.Linear]) -> int:
    """Make every ``nn.Linear`` or ``SkinnyLinear`` of ``model`` a ``kind`` sharing its parameters, in place.

    Other subclasses of ``nn.Linear`` (quantised layers, adapters) are left alone. Returns how many changed.
    """
    swapped = 0
    for name, module in list(model.named_modules()):
        if type(module) not in (nn.Linear, SkinnyLinear) or type(module) is kind:
            continue
        new = kind(module.in_features, module.out_features, bias=module.bias is not None, device="meta")
        new.weight = module.weight  # the same Parameter objects: tied weights stay tied, nothing is copied
        new.bias = module.bias
        new.train(module.training)
        model.set_submodule(name, new)
        swapped += 1
    return swapped
