"""What a decoding step works on: a request's state (``Request``), its settings (``Run``) and the pair
(``StepCore``: the models and what is known about them: attention layouts, context, EOS ids, token types).
The stages of a step, which the solo loop (engine) and the batched loop (batch) share, are ``decoder.loop.stages``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from treewise.decoder.cache.arena import ArenaCache
from treewise.decoder.candidates.merge import Proposer
from treewise.decoder.capability import attention_layout
from treewise.decoder.chat import chat_ids
from treewise.decoder.draft import DraftResult
from treewise.decoder.errors import TreewiseError
from treewise.decoder.feature_draft import FeatureDraft
from treewise.decoder.kernels.mapped import output_vocab
from treewise.decoder.loading import check_pair
from treewise.decoder.policy import TreePolicy
from treewise.decoder.records.nodelog import NodeLogWriter
from treewise.decoder.records.results import FinishReason, GenerationResult, GenerationStats
from treewise.decoder.tokentypes import token_type_table
from treewise.decoder.verify import Acceptance, DraftMode, Sampling, Verifier, verify


@dataclass
class Request:
    """Mutable state of one generation."""

    seq: torch.Tensor  # [L] prompt + generated tokens; the last one is pending (not in the target cache)
    prompt_len: int
    max_new_tokens: int
    target_cache: DynamicCache | ArenaCache = field(default_factory=ArenaCache)
    draft_cache: DynamicCache | ArenaCache = field(default_factory=ArenaCache)
    generated: list[int] = field(default_factory=list)
    tried: int = 0
    accepted: int = 0
    prev_accepted: int = -1
    finish: FinishReason | None = None
    features: TargetFeatures | None = None  # what a feature draft reads (None for a standalone draft)
    _buffer: torch.Tensor | None = None  # [capacity] tokens; ``seq`` is a prefix view of it once extended

    @property
    def running_accept_rate(self) -> float:
        return self.accepted / self.tried if self.tried else float("nan")

    def extend(self, tokens: list[int]) -> None:
        """Append committed tokens in place: ``seq`` becomes a longer view of one preallocated buffer."""
        n, k = self.seq.numel(), len(tokens)
        if self._buffer is None or n + k > self._buffer.numel():
            capacity = max(self.prompt_len + self.max_new_tokens + 1, 2 * (n + k))
            self._buffer = torch.zeros(capacity, dtype=torch.long, device=self.seq.device)
            self._buffer[:n] = self.seq
        # Writes past ``seq``: views handed out earlier stay valid.
        if self._buffer.device.type == "cpu":
            self._buffer.numpy()[n : n + k] = tokens  # a numpy slice write: no torch op
        else:
            self._buffer[n : n + k] = torch.tensor(tokens, dtype=torch.long, device=self._buffer.device)
        self.seq = self._buffer[: n + k]


@dataclass
class TargetFeatures:
    """The target's feature (last hidden state after its final norm) at each position its cache holds, in order:
    a feature draft's input (``decoder.feature_draft``). Grown in place like ``Request.seq``."""

    _buffer: torch.Tensor | None = None
    count: int = 0

    def add(self, rows: torch.Tensor) -> None:
        """Append ``rows`` [k, H], the features of the next k positions."""
        n, k = self.count, rows.shape[0]
        if self._buffer is None or n + k > self._buffer.shape[0]:
            grown = rows.new_empty((max(64, 2 * (n + k)), rows.shape[1]))
            if self._buffer is not None:
                grown[:n] = self._buffer[:n]
            self._buffer = grown
        self._buffer[n : n + k] = rows
        self.count = n + k

    def view(self) -> torch.Tensor:
        """[count, H]; a view, valid until the next ``add``."""
        if self._buffer is None:
            return torch.zeros(0, 0)
        return self._buffer[: self.count]


@dataclass(frozen=True)
class TargetForward:
    logits: torch.Tensor  # [n, V] at the tree's nodes
    seconds: float  # feed, mask and forward
    model_s: float  # the stock model call alone
    features: torch.Tensor | None = None  # [n, H] the target's feature at each tree node (a feature draft's)


@dataclass(frozen=True)
class Run:
    """Per-request settings of the loop."""

    policy: TreePolicy
    sampling: Sampling
    draft_mode: DraftMode
    generator: torch.Generator | None
    domain: str
    prompt_id: str
    run_id: str
    log: NodeLogWriter | None
    stream: Callable[[list[int]], None] | None = None
    proposer: Proposer | None = field(init=False, default=None)  # the policy, when it proposes free candidates

    def __post_init__(self) -> None:
        object.__setattr__(self, "proposer", self.policy if isinstance(self.policy, Proposer) else None)


class StepCore:
    """A target/draft pair and the per-step stages both decode loops use."""

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 verifier: Verifier = verify, allow_unverified: bool = False, chat: bool = False) -> None:
        check_pair(target, draft)
        # A feature draft reads the target's features: the target forward returns them, the draft never
        # keeps a tree slot (it re-reads accepted tokens with the target's own features, as EAGLE does).
        self.reads_features = isinstance(draft, FeatureDraft)
        # Refuse what cannot be decoded exactly (recurrent state, flash kernels, ...) before any decoding.
        self.target_layout = attention_layout(target, allow_unverified)
        self.draft_layout = attention_layout(draft.model if isinstance(draft, FeatureDraft) else draft,
                                             allow_unverified)
        self.target, self.draft, self.tokenizer = target.eval(), draft.eval(), tokenizer
        self.verifier = verifier
        self.chat = chat  # text prompts become a chat user turn (decoder.chat.chat_ids); token ids stay as given
        self.device = next(target.parameters()).device
        # Looked up once: ``model.dtype`` and ``next(model.parameters())`` walk the module tree on every call.
        self.target_dtype, self.draft_dtype = target.dtype, draft.dtype
        self.vocab = output_vocab(target)
        self.context = _context_length(target)
        self.target_layers, self.draft_layers = _layer_count(target), _layer_count(draft)  # sizes their arenas
        eos = target.generation_config.eos_token_id  # what model.generate stops on
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self.token_types = token_type_table(tokenizer, self.vocab)  # [V] each token's type code

    @property
    def draft_lag(self) -> int:
        """How many positions the draft cache runs behind the sequence (``Drafter``: a feature draft's one)."""
        return 1 if self.reads_features else 0

    def _result(self, req: Request, stats: GenerationStats, policy: str) -> GenerationResult:
        text = self.tokenizer.decode(req.generated, skip_special_tokens=True)
        return GenerationResult(text, list(req.generated), req.seq[: req.prompt_len].tolist(), req.finish, stats,
                                policy)

    def _encode(self, prompt: str | list[int], max_new_tokens: int) -> list[int]:
        if max_new_tokens < 1:
            raise TreewiseError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if isinstance(prompt, str):
            if not prompt:
                raise TreewiseError("the prompt is empty: pass at least one character or token id")
            ids = chat_ids(self.tokenizer, prompt) if self.chat else self.tokenizer(prompt).input_ids
        else:
            ids = [int(i) for i in prompt]
        if not ids:
            raise TreewiseError("the prompt encodes to no tokens: pass a non-empty prompt")
        if len(ids) >= self.context:
            raise TreewiseError(
                f"the prompt has {len(ids)} tokens but the target's context is {self.context}: "
                "shorten the prompt to leave room for new tokens"
            )
        if max(ids) >= self.vocab or min(ids) < 0:
            raise TreewiseError(f"prompt token ids must lie in [0, {self.vocab}); got {min(ids)}..{max(ids)}")
        return ids

    def _encode_batch(self, prompts: list[str] | list[list[int]], max_new_tokens: int | list[int]) -> list[list[int]]:
        if not prompts:
            raise TreewiseError("a batch needs at least one prompt; got an empty list")
        if len({isinstance(p, str) for p in prompts}) > 1:
            raise TreewiseError("prompts mix strings and token-id lists: pass all strings or all lists of ids")
        encoded = []
        for i, prompt in enumerate(prompts):
            try:
                limit = max_new_tokens[i] if isinstance(max_new_tokens, list) else max_new_tokens
                encoded.append(self._encode(prompt, limit))
            except TreewiseError as err:
                raise TreewiseError(f"prompt {i}: {err}") from None
        return encoded

    def _pad_id(self) -> int | None:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else (min(self.eos_ids) if self.eos_ids else None)


def _layer_count(model: PreTrainedModel) -> int:
    layers = getattr(model.config.get_text_config(decoder=True), "num_hidden_layers", None)
    return layers if isinstance(layers, int) and layers > 0 else 1


def _context_length(model: PreTrainedModel) -> int:
    cfg = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1 << 30


def target_keep(acc: Acceptance, emitted: list[int]) -> list[int]:
    """Tree nodes the target cache keeps: the root and the emitted accepted nodes (the bonus is never cached)."""
    return acc.path[: len(emitted)]


def draft_keep(dr: DraftResult, acc: Acceptance, emitted: list[int]) -> list[int]:
    """Pending draft slots to keep: the fed nodes of the emitted accepted path (a prefix of it)."""
    fed = dr.fed_slot.tolist()
    slots: list[int] = []
    for node in acc.path[1 : len(emitted)]:
        if fed[node] < 0:  # a leaf: it and what follows were never fed to the draft
            break
        slots.append(fed[node])
    return slots


def looked_up(dr: DraftResult, acc: Acceptance) -> int:
    """Accepted nodes a lookup proposed (source ``lookup`` or ``both``, decoder.candidates.merge)."""
    cols = dr.candidates.columns
    if "source" not in cols or acc.accepted == 0:
        return 0
    source = np.zeros(dr.tree.size, dtype=np.int8)
    kept = cols["tree_index"] >= 0
    source[cols["tree_index"][kept]] = cols["source"][kept]
    return int(np.count_nonzero(source[acc.path[1:]]))
