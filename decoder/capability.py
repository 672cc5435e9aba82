"""What treewise can decode exactly: each layer's attention kind, and a refusal for everything else.

Tree verification feeds a 4-D mask and explicit position ids to the stock model, and cache compaction
drops the rows of rejected nodes. That is exact only for attention layers whose visibility a mask can
express (full causal, sliding window) and whose cache is a list of per-token rows. Recurrent, state-space
and linear-attention layers keep a running state that cannot be cut back to an accepted path, and fused
kernels (flash attention) ignore a custom mask: those are refused at construction with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import PreTrainedModel

from .errors import TreewiseError
from .tree import tree_attention_mask

FULL, SLIDING = "full_attention", "sliding_attention"
MASKABLE_KERNELS = ("sdpa", "eager")

# model_type -> class, for the architectures the CI matrix decodes exactly (tests/decoder/test_architectures.py
# builds each from this table, and a test checks README's table against it). "window" marks the ones also
# tested with a sliding window shorter than the prompt.
VERIFIED: dict[str, tuple[str, bool]] = {
    "llama": ("LlamaForCausalLM", False),
    "mistral": ("MistralForCausalLM", True),
    "mixtral": ("MixtralForCausalLM", True),
    "qwen2": ("Qwen2ForCausalLM", True),
    "qwen3": ("Qwen3ForCausalLM", True),
    "gemma": ("GemmaForCausalLM", False),
    "gemma2": ("Gemma2ForCausalLM", True),
    "gemma3_text": ("Gemma3ForCausalLM", True),
    "phi": ("PhiForCausalLM", False),
    "phi3": ("Phi3ForCausalLM", True),
    "starcoder2": ("Starcoder2ForCausalLM", True),
    "gpt_neox": ("GPTNeoXForCausalLM", False),
    "gpt2": ("GPT2LMHeadModel", False),
    "opt": ("OPTForCausalLM", False),
    "falcon": ("FalconForCausalLM", False),
    "stablelm": ("StableLmForCausalLM", False),
    "olmo": ("OlmoForCausalLM", False),
    "olmo2": ("Olmo2ForCausalLM", False),
    "cohere": ("CohereForCausalLM", False),
    "granite": ("GraniteForCausalLM", False),
}


@dataclass(frozen=True)
class AttentionLayout:
    """The attention kinds of a model's layers and how it takes one mask per kind."""

    kinds: tuple[str, ...]  # distinct layer kinds, each FULL or SLIDING
    window: int | None  # sliding window in positions (None when no layer slides)

    def mask(self, visible_new: torch.Tensor, past_len: int, positions: torch.Tensor | None,
             dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
        """Additive mask(s) [1, 1, q, past_len + t] for one forward: one tensor, or one per layer kind.

        ``visible_new`` [q, t] says which uncached slots each query sees; ``positions`` [t] are those
        slots' position ids (see ``tree_attention_mask``).
        """
        if len(self.kinds) == 1 and self.kinds[0] == FULL:  # the common case: one mask, no window
            return tree_attention_mask(visible_new, past_len, dtype, positions)
        masks = {kind: tree_attention_mask(visible_new, past_len, dtype, positions,
                                           self.window if kind == SLIDING else None) for kind in self.kinds}
        if len(masks) == 1:
            return next(iter(masks.values()))  # stock models apply a lone 4-D mask to every layer
        return masks  # models with mixed layers take a dict keyed by layer kind

    def batch_mask(self, visible: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor,
                   dtype: torch.dtype) -> torch.Tensor | dict[str, torch.Tensor]:
        """Additive masks [B, 1, q, K] from explicit visibility [B, q, K] and positions [B, q], [B, K]."""
        masks = {}
        for kind in self.kinds:
            vis = visible
            if kind == SLIDING and self.window is not None:
                vis = vis & ((q_pos[:, :, None] - k_pos[:, None, :]) < self.window)
            masks[kind] = torch.zeros(vis.shape, dtype=dtype, device=vis.device).masked_fill_(
                ~vis, torch.finfo(dtype).min)[:, None]
        return next(iter(masks.values())) if len(masks) == 1 else masks


def attention_layout(model: PreTrainedModel, allow_unverified: bool = False) -> AttentionLayout:
    """The model's attention layout, or a TreewiseError naming the class and why it cannot be decoded exactly."""
    name = type(model).__name__
    cfg = model.config.get_text_config()
    if getattr(model.config, "is_encoder_decoder", False):
        raise TreewiseError(f"{name} is an encoder-decoder model: treewise decodes decoder-only causal LMs")
    if getattr(model, "_is_stateful", False) or not _default_cache_ok(model):
        raise TreewiseError(f"{name} keeps a recurrent or custom cache state that cannot be cut back to an "
                            "accepted tree path: treewise refuses it rather than decode it wrongly")
    kernel = getattr(model.config, "_attn_implementation", None) or "eager"
    if kernel not in MASKABLE_KERNELS:
        raise TreewiseError(f"{name} runs attn_implementation={kernel!r}, which ignores treewise's 4-D tree mask: "
                            "load it with attn_implementation='sdpa' (or 'eager')")
    layer_types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if layer_types:
        kinds = tuple(dict.fromkeys(layer_types))
    else:  # no per-layer list: a set window slides every layer (Mistral, Mixtral, Phi-3, Starcoder2)
        kinds = (SLIDING,) if window is not None else (FULL,)
    other = [k for k in kinds if k not in (FULL, SLIDING)]
    if other:
        raise TreewiseError(f"{name} has {', '.join(other)} layers: their state or mask cannot be restricted to a "
                            "tree path, so treewise refuses this model rather than decode it wrongly")
    if SLIDING in kinds and not (isinstance(window, int) and window > 0):
        raise TreewiseError(f"{name} has sliding-attention layers but no positive config.sliding_window ({window!r})")
    # A model class may declare the verified architecture it only wraps (decoder/kernels/mapped.py: a Llama on
    # mapped ids).
    if getattr(model.config, "verified_as", model.config.model_type) not in VERIFIED and not allow_unverified:
        raise TreewiseError(
            f"{name} (model_type {model.config.model_type!r}) is not in treewise's verified architectures "
            f"({', '.join(sorted(VERIFIED))}): pass allow_unverified=True to decode it anyway, and compare its "
            "output with generate_plain before trusting it"
        )
    return AttentionLayout(kinds, window if SLIDING in kinds else None)


def _default_cache_ok(model: PreTrainedModel) -> bool:
    check = getattr(type(model), "_supports_default_dynamic_cache", None)
    return bool(check()) if callable(check) else True
