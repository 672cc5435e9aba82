"""Few-row matrix products on CPU: the shape tree verification makes, and the one CPU BLAS handles worst.

``F.linear(x, W)`` computes ``x @ W.T``. With 2-64 rows of ``x`` and a large ``W``, MKL's sgemm on this
kind of x86 CPU takes 1.5-4x longer than the same product written ``(W @ x.T).T``, which streams ``W`` once
as the one-row matrix-vector product does (SmolLM2's 49,152 x 576 output layer, 2 threads: 46 vs 12 ms at
4 rows, 81 vs 36 ms at 16; a whole 30-layer forward of 4 tokens: 226 vs 132 ms, of 1 token: 130 ms either
way). Verifying a tree of a few nodes is therefore nearly as cheap as one decoding step, which is what
speculative decoding needs. One row keeps ``F.linear`` (a matrix-vector product either way), so plain
decoding runs the very kernel it ran before.

That holds on the CPU it was measured on, not on every one: another host of the same kind ran the few-row
``F.linear`` well (SmolLM2, a whole forward of 2 tokens: 35 ms stock against 70 ms swapped, 1 token 33 ms
either way), where the swap doubles what a small tree costs. So loading times the two products on the model's
largest weight first (``skinny_pays``) and swaps only where the swap is faster; ``$TREEWISE_LINEARS``
(``auto``, ``skinny``, ``stock``) overrides that choice.

The swap replaces modules through the public ``nn.Module`` API (as PyTorch's own quantisation does), keeps
each Parameter object (tied embeddings stay tied) and changes no model code.
"""

from __future__ import annotations

import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from treewise.decoder.errors import TreewiseError

__all__ = ["LINEARS_ENV", "SkinnyLinear", "choose_linears", "skinny_pays", "swap_linears", "use_skinny_linears"]

LINEARS_ENV = "TREEWISE_LINEARS"


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


def skinny_pays(model: nn.Module, rows: tuple[int, ...] = (2, 4), rounds: int = 5, margin: float = 0.9) -> bool:
    """Whether ``(W @ x.T).T`` beats ``F.linear(x, W)`` on this CPU for a few rows, timed on ``model``'s largest
    linear weight (the output layer of a language model, most of a small model's few-row time) in alternating
    rounds after one warm-up; the swap must win by ``margin`` on the median."""
    weights = [m.weight for m in model.modules() if type(m) in (nn.Linear, SkinnyLinear)]
    if not weights or weights[0].device.type != "cpu":
        return False
    w = max(weights, key=lambda p: p.numel())
    times: dict[bool, list[float]] = {False: [], True: []}
    gen = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        for r in rows:
            x = torch.randn(r, w.shape[1], dtype=w.dtype, generator=gen)  # its own generator: a user's seed stays
            for i in range(rounds + 1):
                for skinny in (i % 2 == 0, i % 2 == 1):  # alternate which kind runs first
                    t0 = time.perf_counter()
                    torch.matmul(w, x.T).T if skinny else F.linear(x, w)
                    if i > 0:
                        times[skinny].append(time.perf_counter() - t0)
    return statistics.median(times[True]) < margin * statistics.median(times[False])


def choose_linears(model: nn.Module) -> bool:
    """Swap in ``SkinnyLinear`` where it pays on this CPU (``$TREEWISE_LINEARS``: ``auto``, the default, times it;
    ``skinny`` or ``stock`` decide); returns whether the model now uses it."""
    choice = os.environ.get(LINEARS_ENV, "auto").strip().lower()
    if choice not in ("auto", "skinny", "stock"):
        raise TreewiseError(f"${LINEARS_ENV}={choice!r} is not a choice: set it to auto, skinny or stock, or unset it")
    if choice == "skinny" or (choice == "auto" and skinny_pays(model)):
        use_skinny_linears(model)
        return True
    swap_linears(model, nn.Linear)
    return False
