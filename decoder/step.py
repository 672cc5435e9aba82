"""The stages of one decoding step that a solo loop (engine) and a batched loop (batch) share.

``StepCore`` holds the pair and what is known about it (attention layouts, context, EOS ids, token types);
its methods build the target's tree feed, verify-side bookkeeping (emit, settle) and cache compaction.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from .arena import ArenaCache
from .capability import attention_layout
from .chat import chat_ids
from .draft import DraftContext, DraftResult
from .errors import TreewiseError
from .feature_draft import FeatureDraft
from .kvcache import Feed, SoloCache
from .loading import check_pair
from .logrows import RowMeta, step_rows
from .mapped import output_vocab
from .merge import Proposer, merge_lookup
from .nodelog import NodeLogWriter
from .policy import StepOutcome, TreePolicy
from .results import FinishReason, GenerationResult, GenerationStats
from .tokentypes import token_type_table
from .tree import DraftTree, chain_then_tree
from .verify import Acceptance, DraftMode, Sampling, Verifier, verify


@dataclass
class _Request:
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
    a feature draft's input (``decoder.feature_draft``). Grown in place like ``_Request.seq``."""

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
class _Run:
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
        self._token_types = token_type_table(tokenizer, self.vocab)

    def _result(self, req: _Request, stats: GenerationStats) -> GenerationResult:
        text = self.tokenizer.decode(req.generated, skip_special_tokens=True)
        return GenerationResult(text, list(req.generated), req.seq[: req.prompt_len].tolist(), req.finish, stats)

    def _settle(self, req: _Request, run: _Run, ctx: DraftContext, dr: DraftResult, logits: torch.Tensor,
                acc: Acceptance, forward_ms: float = float("nan")) -> tuple[list[int], dict[str, np.ndarray] | None]:
        """After verification: emit tokens, stream them, tell the policy; the step's node-log rows if logging."""
        emitted = self._emit(req, dr.tree, acc)
        rows = None
        if run.log is not None:
            meta = RowMeta(run.run_id, run.prompt_id, run.domain, ctx.step, ctx.position, req.prompt_len,
                           ctx.running_accept_rate, ctx.prev_accepted, run.sampling.temperature)
            rows = step_rows(dr.candidates, acc, logits, self._token_types, meta)
        if run.stream is not None:
            run.stream(emitted)
        on_path = set(acc.path)
        tried = sum(1 for parent in dr.tree.parents.tolist()[1:] if parent in on_path)  # no torch slice op
        run.policy.observe(StepOutcome(ctx.step, dr.tree.size - 1, acc.accepted, tried, tuple(acc.path[1:]),
                                       forward_ms, dr.extra, looked_up(dr, acc) if run.proposer else 0))
        req.tried, req.accepted, req.prev_accepted = req.tried + tried, req.accepted + acc.accepted, acc.accepted
        return emitted, rows

    @staticmethod
    def _propose(req: _Request, run: _Run, ctx: DraftContext) -> None:
        """Before drafting: a proposing policy looks up the step's free candidates."""
        if run.proposer is not None:
            run.proposer.propose(req.seq.numpy() if req.seq.is_cpu else req.seq.cpu().numpy(), ctx)

    @staticmethod
    def _merged(run: _Run, ctx: DraftContext, dr: DraftResult) -> DraftResult:
        """After drafting: the proposing policy's free candidates merged into the drafted tree."""
        if run.proposer is None:
            return dr
        return merge_lookup(dr, run.proposer.proposals(dr), run.draft_mode, ctx.max_depth)

    @staticmethod
    def _ended(req: _Request, run: _Run) -> None:
        if run.proposer is not None:
            run.proposer.end(req.seq.cpu().numpy())

    def _context(self, req: _Request, step: int, run: _Run, batch: int = 1) -> DraftContext:
        room = self.context - req.seq.numel() - 1  # positions left after the bonus token
        max_depth = max(0, min(req.max_new_tokens - len(req.generated) - 1, room))
        # Draft entropies cost a pass over the vocabulary: only for node logs and policies that read them.
        entropy = run.log is not None or getattr(run.policy, "reads_draft_entropy", True)
        return DraftContext(step, len(req.generated), req.prompt_len, run.domain, max_depth,
                            req.running_accept_rate, req.prev_accepted, self._token_types, entropy, batch)

    def _target_forward(self, req: _Request, tree: DraftTree) -> TargetForward:
        """One stock forward over the uncached committed tokens plus the tree; logits [n, V] at tree nodes."""
        t0 = time.perf_counter()
        feed = self._tree_feed(req, tree, req.target_cache.get_seq_length())
        cache = self._target_cache(req)
        out = cache.run(self.target, feed, hidden=self.reads_features)
        tree_feats = self._chain_features(req, out.features, feed.commit)
        return TargetForward(out.logits.float(), time.perf_counter() - t0, cache.model_s, tree_feats)

    def _prefill_features(self, req: _Request) -> None:
        """For a feature draft: the target reads the prompt but its last token first, so the first step drafts."""
        n = req.seq.numel() - 1
        if req.features is None or n < 1 or req.target_cache.get_seq_length() > 0:
            return
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        chain = Feed(req.seq[:n], torch.arange(n, device=self.device), mask, commit=n, keep=1, causal=True)
        req.features.add(self._target_cache(req).run(self.target, chain, hidden=True).features)  # type: ignore[arg-type]

    @staticmethod
    def _chain_features(req: _Request, features: torch.Tensor | None, chain: int) -> torch.Tensor | None:
        """A target forward's features: the committed chain's join the request's, the tree's [n, H] come back."""
        if features is None or req.features is None:
            return None
        req.features.add(features[:chain])
        return features[chain:]

    @staticmethod
    def _kept_features(req: _Request, tree_features: torch.Tensor | None, kept: list[int]) -> None:
        """The features of the tree nodes the target cache keeps (``target_keep``) join the request's."""
        if tree_features is not None and req.features is not None and kept:
            req.features.add(tree_features[torch.tensor(kept)] if len(kept) > 1 else tree_features[kept[0]][None])

    def _draft_keep(self, dr: DraftResult, acc: Acceptance, emitted: list[int]) -> list[int]:
        """Pending draft slots to keep: none for a feature draft (its tree slots read guessed features)."""
        return [] if self.reads_features else draft_keep(dr, acc, emitted)

    @property
    def draft_lag(self) -> int:
        """How many positions the draft cache runs behind the sequence (``Drafter``: a feature draft's one)."""
        return 1 if self.reads_features else 0

    def _tree_feed(self, req: _Request, tree: DraftTree, cached: int) -> Feed:
        """The committed tokens not yet in the target cache (a causal chain), then the tree under its mask."""
        root_pos = req.seq.numel() - 1
        if cached == root_pos:  # every step but the first: only the tree is new
            tokens, pos = tree.tokens, tree.position_ids(root_pos)
            if self.device.type != "cpu":  # a no-op move still costs a dispatch on the CPU
                tokens, pos = tokens.to(self.device), pos.to(self.device)
            return Feed(tokens, pos, tree.ancestor_mask, keep=tree.size, causal=tree.size == 1)
        chain = req.seq[cached:-1]  # committed tokens before the root not yet in the cache
        c = chain.numel()
        pos = torch.cat([torch.arange(cached, cached + c, device=self.device),
                         tree.position_ids(root_pos).to(self.device)])  # [c + n]
        vis = chain_then_tree(c, tree.ancestor_mask)
        return Feed(torch.cat([chain, tree.tokens.to(self.device)]), pos, vis, commit=c, keep=tree.size,
                    causal=tree.size == 1)

    def _target_cache(self, req: _Request) -> SoloCache:
        return SoloCache(req.target_cache, self.target_layout, self.target_dtype)

    def _emit(self, req: _Request, tree: DraftTree, acc: Acceptance) -> list[int]:
        """Accepted tokens plus the bonus, cut at EOS, max_new_tokens and the context length."""
        tokens = tree.tokens.tolist()  # a list lookup per accepted node: cheaper than a torch index op
        proposed = [tokens[i] for i in acc.path[1:]] + [acc.bonus]
        emitted: list[int] = []
        for token in proposed:
            emitted.append(token)
            req.generated.append(token)
            if token in self.eos_ids:
                req.finish = "eos"
            elif len(req.generated) >= req.max_new_tokens:
                req.finish = "length"
            elif req.seq.numel() + len(emitted) >= self.context:
                req.finish = "context"
            if req.finish is not None:
                break
        return emitted

    def _commit(self, req: _Request, dr: DraftResult, fwd: TargetForward, acc: Acceptance,
                emitted: list[int]) -> None:
        """Keep only the emitted part of the accepted path in both caches; extend the sequence.

        Invariant after each step: the target cache holds every token of ``seq`` but the last (pending) one
        (and ``req.features`` the target's feature at each of them).
        """
        committed = req.seq.numel()  # the root is the last committed token; the tree's nodes are pending
        kept = target_keep(acc, emitted)
        SoloCache(req.target_cache, self.target_layout, self.target_dtype, committed - 1).compact(kept)
        self._kept_features(req, fwd.features, kept)
        drafted = committed - self.draft_lag
        if req.draft_cache.get_seq_length() >= drafted:  # the draft caught up this step
            SoloCache(req.draft_cache, self.draft_layout, self.draft_dtype, drafted).compact(
                self._draft_keep(dr, acc, emitted))
        req.extend(emitted)

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
    """Accepted nodes a lookup proposed (source ``lookup`` or ``both``, decoder.merge)."""
    cols = dr.candidates.columns
    if "source" not in cols or acc.accepted == 0:
        return 0
    source = np.zeros(dr.tree.size, dtype=np.int8)
    kept = cols["tree_index"] >= 0
    source[cols["tree_index"][kept]] = cols["source"][kept]
    return int(np.count_nonzero(source[acc.path[1:]]))
