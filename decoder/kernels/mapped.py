"""A draft whose vocabulary is a subset of its target's: a stock Llama on its own ids, read and written in the target's.

On a small target the output layer decides a draft's cost (SmolLM2's tied 49,152 x 576 head is a fifth of the
target's compute), so the draft keeps only the K tokens the target says most often (FR-Spec, arXiv 2502.14856)
plus one row, ``other``, that stands for every token it does not keep. ``to_target[i]`` is the target id of
draft id i. Input ids in the target's vocabulary become draft ids (an unkept token reads as ``other``), and
logits come back as a full target-vocabulary row with -inf at every unkept token and at ``other``: an unkept
token is never drafted, and since verification reads only the target's logits, output stays exact (a draft
probability of zero is an ordinary draft distribution to speculative sampling).

It is a registered Hugging Face model class (``AutoModelForCausalLM.from_pretrained`` loads its folder once
``treewise.decoder`` is imported), so the decoder, ``generate`` and Hugging Face's assisted generation all run
it as they run any causal LM; only ``forward`` differs from ``LlamaForCausalLM``.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM


class MappedLlamaConfig(LlamaConfig):
    """``vocab_size`` counts the draft's own rows (K kept tokens + ``other``); ``target_vocab_size`` the target's."""

    model_type = "treewise_mapped_llama"
    verified_as = "llama"  # attention and cache are Llama's; tests/decoder/test_mapped.py checks exact output

    def __init__(self, target_vocab_size: int = 0, **kwargs: Any) -> None:
        self.target_vocab_size = target_vocab_size
        super().__init__(**kwargs)

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> LlamaConfig:
        """What ``generate`` sees: a copy whose ``vocab_size`` is the width of the logits (the target's), so
        assisted generation pairs this draft with its target as models of one tokenizer, which they are."""
        view = copy.copy(super().get_text_config(decoder=decoder, encoder=encoder))
        view.vocab_size = self.target_vocab_size or self.vocab_size
        return view


class MappedLlamaForCausalLM(LlamaForCausalLM):
    config_class = MappedLlamaConfig
    config: MappedLlamaConfig

    def __init__(self, config: MappedLlamaConfig) -> None:
        super().__init__(config)
        kept = config.vocab_size - 1
        # Saved with the weights: which target token each kept draft row is (filled by the trainer).
        self.register_buffer("to_target", torch.arange(kept, dtype=torch.long))
        # Its inverse is derived, not saved: rebuilt whenever ``to_target`` changes (loaded, moved, set).
        self._inverse: tuple[tuple, torch.Tensor] | None = None

    @property
    def other_id(self) -> int:
        return self.config.vocab_size - 1

    def set_map(self, to_target: torch.Tensor) -> None:
        """Which target token each of the K kept rows stands for (distinct ids below ``target_vocab_size``)."""
        ids = torch.as_tensor(to_target, dtype=torch.long).to(self.to_target.device)
        if ids.numel() != self.other_id or ids.unique().numel() != ids.numel():
            raise ValueError(f"the map needs {self.other_id} distinct target ids, got {ids.numel()} "
                             f"({ids.unique().numel()} distinct)")
        if int(ids.min()) < 0 or int(ids.max()) >= self.config.target_vocab_size:
            raise ValueError(f"target ids must lie in [0, {self.config.target_vocab_size})")
        with torch.no_grad():
            self.to_target.copy_(ids)

    @property
    def to_draft(self) -> torch.Tensor:
        """[target vocabulary] draft id of every target token (``other`` where the draft keeps none)."""
        ids = self.to_target
        key = (ids.device, ids.data_ptr(), ids._version)
        if self._inverse is None or self._inverse[0] != key:
            table = torch.full((self.config.target_vocab_size,), self.other_id, dtype=torch.long, device=ids.device)
            table[ids] = torch.arange(self.other_id, device=ids.device)
            self._inverse = (key, table)
        return self._inverse[1]

    def draft_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Target ids -> draft ids (an unkept token reads as ``other``)."""
        return self.to_draft[input_ids]

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., K + 1] draft logits -> [..., target vocabulary], -inf where the draft keeps no row."""
        full = logits.new_full((*logits.shape[:-1], self.config.target_vocab_size), float("-inf"))
        full[..., self.to_target] = logits[..., : self.other_id]
        return full

    def forward(self, input_ids: torch.Tensor | None = None, **kwargs: Any) -> Any:
        if kwargs.get("labels") is not None:
            raise ValueError("MappedLlamaForCausalLM takes no labels: train on draft ids through .model and "
                             ".lm_head, the way treewise pair train-draft does")
        out = super().forward(input_ids=None if input_ids is None else self.draft_ids(input_ids), **kwargs)
        out.logits = self.to_target_logits(out.logits)
        return out


AutoConfig.register(MappedLlamaConfig.model_type, MappedLlamaConfig, exist_ok=True)
AutoModelForCausalLM.register(MappedLlamaConfig, MappedLlamaForCausalLM, exist_ok=True)


def output_vocab(model: Any) -> int:
    """The vocabulary a model's logits cover: the target's for a mapped draft, else its output layer's rows."""
    mapped = getattr(model.config, "target_vocab_size", 0) or getattr(model, "target_vocab_size", 0)  # feature draft
    return int(mapped) if mapped else int(model.get_output_embeddings().weight.shape[0])
