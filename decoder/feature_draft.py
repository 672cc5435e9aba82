"""A draft that reads the target: one decoder layer fed the target's own hidden states (EAGLE-1, arXiv 2401.15077).

At a position the draft's input is the target's last hidden state there (after its final norm: what its head
reads) beside the embedding of the token that follows, joined by ``fc``; one decoder layer of the target's own
architecture (transformers' ``LlamaModel`` with one layer, fed ``inputs_embeds``, so masks, rotary positions and
the cache are the stock ones) and the target's final norm give the draft's guess of the target's next hidden
state, and the kept rows of the target's head (FR-Spec, arXiv 2502.14856: the K tokens the target says most
often, the cut the standalone draft uses, ``to_target``) its next-token logits. Below a tree's first level a
node's feature is the draft's own guess at its parent, so training feeds the draft its own features too
(HASS, arXiv 2408.15766).

The input embedding and the head are the target's (frozen, not saved): ``load`` attaches them from the target
the draft was trained for, so the saved draft holds only ``fc``, the layer, the norm and ``to_target``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from transformers import LlamaConfig, LlamaModel, PreTrainedModel

from treewise.decoder.records.atomic import atomic_path, write_bytes_atomic

from .errors import TreewiseError

CONFIG = "feature_draft.json"
WEIGHTS = "feature_draft.safetensors"
KIND = "treewise-feature-draft"


@dataclass(frozen=True)
class FeatureStep:
    """One draft forward: per input slot, the guessed feature of the next position and its logits over the
    kept tokens (``to_target`` names them)."""

    features: torch.Tensor  # [B, T, H] after the final norm
    logits: torch.Tensor  # [B, T, K]


class FeatureDraft(torch.nn.Module):
    def __init__(self, config: LlamaConfig, to_target: torch.Tensor, target_vocab_size: int) -> None:
        super().__init__()
        if config.num_hidden_layers != 1:
            raise ValueError("a feature draft has one decoder layer")
        self.config, self.target_vocab_size = config, target_vocab_size
        hidden = config.hidden_size
        self.fc = torch.nn.Linear(2 * hidden, hidden, bias=True)
        # Inputs arrive as embeddings: the inner model's own table is a stub.
        self.model = LlamaModel(LlamaConfig(**{**config.to_dict(), "vocab_size": 1, "pad_token_id": None}))
        self.register_buffer("to_target", torch.as_tensor(to_target, dtype=torch.long).clone())
        # The target's embedding (shared, not copied) and its head's kept rows, set by ``attach``; never saved.
        self.register_buffer("embed", torch.zeros(0, hidden), persistent=False)
        self.register_buffer("head", torch.zeros(0, hidden), persistent=False)

    @classmethod
    def from_target(cls, target: PreTrainedModel, to_target: torch.Tensor) -> FeatureDraft:
        """A new draft shaped like ``target``'s layers (a Llama target's own config; another architecture's widths
        and heads in a Llama layer), its norm copied from the target's final norm where the shapes agree."""
        draft = cls(_layer_config(target), to_target, target.config.get_text_config(decoder=True).vocab_size)
        norm = getattr(target.base_model, "norm", None)
        weight = getattr(norm, "weight", None)
        if isinstance(weight, torch.Tensor) and weight.shape == draft.model.norm.weight.shape:
            with torch.no_grad():
                draft.model.norm.weight.copy_(weight)
        return draft.attach(target)

    def attach(self, target: PreTrainedModel) -> FeatureDraft:
        """Read inputs through ``target``'s embedding and logits through the kept rows of its head."""
        if target.config.vocab_size != self.target_vocab_size or target.config.hidden_size != self.config.hidden_size:
            raise TreewiseError(f"this feature draft was trained for a target of vocabulary {self.target_vocab_size} "
                                f"and width {self.config.hidden_size}, not {target.config.vocab_size} and "
                                f"{target.config.hidden_size}: load it with the target it was trained for")
        self.embed = target.get_input_embeddings().weight.detach()
        self.head = target.get_output_embeddings().weight.detach()[self.to_target].clone()
        return self

    @property
    def kept(self) -> int:
        return int(self.to_target.numel())

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def forward(self, tokens: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, cache: object | None = None,
                logits_to_keep: int = 0) -> FeatureStep:
        """``tokens`` [B, T] (target ids): the token after each slot's ``features`` [B, T, H]. ``logits_to_keep``:
        logits of the last that many slots only (0: all); features come back for every slot."""
        if not self.embed.numel():
            raise TreewiseError("the feature draft has no target attached: load it with FeatureDraft.load(folder, "
                                "target)")
        emb = F.embedding(tokens, self.embed)
        x = self.fc(torch.cat([emb.to(features.dtype), features], dim=-1))
        out = self.model(inputs_embeds=x, attention_mask=attention_mask, position_ids=position_ids, cache=cache,
                         use_cache=cache is not None)
        h = out.last_hidden_state
        read = h[:, -logits_to_keep:] if logits_to_keep else h
        return FeatureStep(h, F.linear(read, self.head.to(h.dtype)))

    def target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Kept-token logits [..., K] as rows over the target's vocabulary, -inf at every token not kept."""
        full = logits.new_full((*logits.shape[:-1], self.target_vocab_size), float("-inf"))
        full[..., self.to_target] = logits
        return full

    def save(self, folder: Path, card: dict | None = None) -> None:
        """``fc``, the layer, the norm and ``to_target`` (the target's embedding and head are not the draft's)."""
        folder.mkdir(parents=True, exist_ok=True)
        weights = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        with atomic_path(folder / WEIGHTS) as tmp:
            save_file(weights, str(tmp))
        meta = {"kind": KIND, "target_vocab_size": self.target_vocab_size, "config": self.config.to_dict(),
                **({"card": card} if card else {})}
        write_bytes_atomic(folder / CONFIG, json.dumps(meta, indent=1).encode())

    @classmethod
    def load(cls, folder: Path, target: PreTrainedModel) -> FeatureDraft:
        path = Path(folder) / CONFIG
        if not path.is_file():
            raise TreewiseError(f"{folder} holds no feature draft ({CONFIG} is missing): train one with "
                                "`treewise pair train-draft --kind feature`")
        meta = json.loads(path.read_text())
        if meta.get("kind") != KIND:
            raise TreewiseError(f"{path} is not a treewise feature draft")
        weights = load_file(str(Path(folder) / WEIGHTS))
        draft = cls(LlamaConfig(**meta["config"]), weights["to_target"], meta["target_vocab_size"])
        draft.load_state_dict(weights)
        return draft.attach(target).eval()


def _layer_config(target: PreTrainedModel) -> LlamaConfig:
    """One Llama decoder layer as wide as ``target``'s: its own config for a Llama target."""
    cfg = target.config.get_text_config(decoder=True)
    if cfg.model_type == "llama":
        return LlamaConfig(**{**cfg.to_dict(), "num_hidden_layers": 1, "architectures": None})
    heads = cfg.num_attention_heads
    return LlamaConfig(hidden_size=cfg.hidden_size, intermediate_size=getattr(cfg, "intermediate_size", None)
                       or 4 * cfg.hidden_size, num_hidden_layers=1, num_attention_heads=heads,
                       num_key_value_heads=getattr(cfg, "num_key_value_heads", None) or heads,
                       head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // heads,
                       max_position_embeddings=getattr(cfg, "max_position_embeddings", 2048),
                       rms_norm_eps=getattr(cfg, "rms_norm_eps", 1e-6), vocab_size=cfg.vocab_size)
