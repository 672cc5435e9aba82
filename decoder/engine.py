"""TreeDecoder: draft -> verify -> accept -> cache update, one step per target forward."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from .batch import decode_batch, fresh_policy
from .capability import attention_layout
from .draft import DraftContext, DraftResult, draft_tree
from .errors import TreewiseError
from .kvcache import Feed, SoloCache, draft_keep, target_keep
from .loading import check_pair, load_pair
from .logrows import RowMeta, step_rows
from .nodelog import NodeLogWriter
from .policy import RequestInfo, StaticTree, StepOutcome, TreePolicy
from .results import FinishReason, GenerationResult, GenerationStats, StepStats
from .tokentypes import token_type_table
from .tree import DraftTree, chain_then_tree
from .verify import Acceptance, DraftMode, Sampling, Verifier, VerifyInput, verify


class DecodeConfig(BaseModel):
    """Defaults of a generation; the CLI reads its defaults from here."""

    model_config = ConfigDict(frozen=True)

    max_new_tokens: int = 128
    temperature: float = 0.0
    width: int = 2
    depth: int = 4
    draft_mode: DraftMode = "topk"


DEFAULTS = DecodeConfig()


@dataclass
class _Request:
    """Mutable state of one generation."""

    seq: torch.Tensor  # [L] prompt + generated tokens; the last one is pending (not in the target cache)
    prompt_len: int
    max_new_tokens: int
    target_cache: DynamicCache = field(default_factory=DynamicCache)
    draft_cache: DynamicCache = field(default_factory=DynamicCache)
    generated: list[int] = field(default_factory=list)
    tried: int = 0
    accepted: int = 0
    prev_accepted: int = -1
    finish: FinishReason | None = None

    @property
    def running_accept_rate(self) -> float:
        return self.accepted / self.tried if self.tried else float("nan")


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


class TreeDecoder:
    """Lossless tree speculative decoding for a target/draft pair of Hugging Face causal LMs."""

    def __init__(self, target: PreTrainedModel, draft: PreTrainedModel, tokenizer: PreTrainedTokenizerBase,
                 verifier: Verifier = verify, allow_unverified: bool = False) -> None:
        check_pair(target, draft)
        # Refuse what cannot be decoded exactly (recurrent state, flash kernels, ...) before any decoding.
        self.target_layout = attention_layout(target, allow_unverified)
        self.draft_layout = attention_layout(draft, allow_unverified)
        self.target, self.draft, self.tokenizer = target.eval(), draft.eval(), tokenizer
        self.verifier = verifier
        self.device = next(target.parameters()).device
        self.vocab = int(target.get_output_embeddings().weight.shape[0])
        self.context = _context_length(target)
        eos = target.generation_config.eos_token_id  # what model.generate stops on
        self.eos_ids = frozenset([eos] if isinstance(eos, int) else (eos or []))
        self._token_types = token_type_table(tokenizer, self.vocab)

    @classmethod
    def from_pretrained(cls, target: str | Path, draft: str | Path, device: str | None = None,
                        dtype: str | torch.dtype | None = None, trust_remote_code: bool = False,
                        allow_unverified: bool = False) -> TreeDecoder:
        """Load both models and the shared tokenizer (CUDA + bf16 when present, else CPU + float32)."""
        t, d, tok = load_pair(target, draft, device=device, dtype=dtype, trust_remote_code=trust_remote_code)
        return cls(t, d, tok, allow_unverified=allow_unverified)

    @torch.inference_mode()
    def generate(self, prompt: str | list[int], max_new_tokens: int = DEFAULTS.max_new_tokens,
                 tree: TreePolicy | None = None, temperature: float = DEFAULTS.temperature,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 domain: str = "unknown", prompt_id: str = "", run_id: str = "",
                 log: NodeLogWriter | None = None, draft_mode: DraftMode = DEFAULTS.draft_mode,
                 stream: Callable[[list[int]], None] | None = None) -> GenerationResult:
        """Decode ``prompt``; ``stream`` (if given) receives each step's new token ids as they are accepted."""
        sampling = Sampling(temperature, top_k, top_p)
        policy = tree if tree is not None else StaticTree(DEFAULTS.width, DEFAULTS.depth)
        req = self._new_request(self._encode(prompt, max_new_tokens), max_new_tokens)
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        run = _Run(policy, sampling, draft_mode, gen, domain, prompt_id, run_id, log, stream)
        return self._result(req, self._loop(req, run))

    @torch.inference_mode()
    def generate_batch(self, prompts: list[str] | list[list[int]], max_new_tokens: int = DEFAULTS.max_new_tokens,
                       tree: TreePolicy | None = None, temperature: float = DEFAULTS.temperature,
                       top_k: int | None = None, top_p: float | None = None,
                       seed: int | list[int | None] | None = None, domain: str | list[str] = "unknown",
                       prompt_ids: list[str] | None = None, run_id: str = "", log: NodeLogWriter | None = None,
                       draft_mode: DraftMode = DEFAULTS.draft_mode) -> list[GenerationResult]:
        """Decode many prompts together, one shared target forward per step; row i equals ``generate(prompts[i])``.

        Each row gets its own copy of ``tree`` (policies keep per-request state), its own sampler (``seed``:
        one for every row, or one per row) and its own stop condition; finished rows leave the batch.
        """
        if not prompts:
            raise TreewiseError("generate_batch needs at least one prompt; got an empty list")
        if len({isinstance(p, str) for p in prompts}) > 1:
            raise TreewiseError("prompts mix strings and token-id lists: pass all strings or all lists of ids")
        n = len(prompts)
        seeds = seed if isinstance(seed, list) else [seed] * n
        domains = domain if isinstance(domain, list) else [domain] * n
        ids = prompt_ids if prompt_ids is not None else [""] * n
        if not len(seeds) == len(domains) == len(ids) == n:
            raise TreewiseError(f"seed, domain and prompt_ids lists must have one entry per prompt ({n})")
        encoded = []
        for i, prompt in enumerate(prompts):
            try:
                encoded.append(self._encode(prompt, max_new_tokens))
            except TreewiseError as err:
                raise TreewiseError(f"prompt {i}: {err}") from None
        policy = tree if tree is not None else StaticTree(DEFAULTS.width, DEFAULTS.depth)
        sampling = Sampling(temperature, top_k, top_p)
        reqs = [self._new_request(e, max_new_tokens) for e in encoded]
        runs = [_Run(fresh_policy(policy), sampling, draft_mode,
                     torch.Generator().manual_seed(s) if s is not None else None, d, pid, run_id, log)
                for s, d, pid in zip(seeds, domains, ids, strict=True)]
        stats = decode_batch(self, reqs, runs)
        return [self._result(r, st) for r, st in zip(reqs, stats, strict=True)]

    def _result(self, req: _Request, stats: GenerationStats) -> GenerationResult:
        text = self.tokenizer.decode(req.generated, skip_special_tokens=True)
        return GenerationResult(text, list(req.generated), req.seq[: req.prompt_len].tolist(), req.finish, stats)

    def _new_request(self, ids: list[int], max_new_tokens: int) -> _Request:
        return _Request(seq=torch.tensor(ids, device=self.device), prompt_len=len(ids), max_new_tokens=max_new_tokens)

    def _loop(self, req: _Request, run: _Run) -> GenerationStats:
        """The decode loop: draft -> verify -> accept -> cache update until a stop condition."""
        text = self.tokenizer.decode(req.seq.tolist(), skip_special_tokens=True)
        run.policy.start(RequestInfo(run.domain, req.prompt_len, req.max_new_tokens, run.sampling.temperature, text))
        stats = GenerationStats()
        start = time.perf_counter()
        while req.finish is None:
            t0 = time.perf_counter()
            ctx = self._context(req, len(stats.steps), run.domain)
            dr = draft_tree(self.draft, req.draft_cache, req.seq, run.policy, ctx, run.sampling, run.draft_mode,
                            self.vocab, run.generator, self.draft_layout)
            logits, verify_s = self._target_forward(req, dr.tree)
            acc = self.verifier(VerifyInput(dr.tree, logits, run.sampling, run.draft_mode, dr.draft_probs,
                                            run.generator))
            emitted, rows = self._settle(req, run, ctx, dr, logits, acc)
            if rows is not None:
                run.log.add_step(rows)
            self._commit(req, dr, acc, emitted)
            other = time.perf_counter() - t0 - dr.forward_s - verify_s
            stats.steps.append(StepStats(dr.candidates.size, dr.tree.size - 1, acc.accepted, len(emitted),
                                         dr.forwards, dr.forward_s, verify_s, other, dr.policy_s))
        stats.total_s = time.perf_counter() - start
        if run.log is not None:
            run.log.end_request()
        return stats

    def _settle(self, req: _Request, run: _Run, ctx: DraftContext, dr: DraftResult, logits: torch.Tensor,
                acc: Acceptance) -> tuple[list[int], dict[str, np.ndarray] | None]:
        """After verification: emit tokens, stream them, tell the policy; the step's node-log rows if logging."""
        emitted = self._emit(req, dr.tree, acc)
        rows = None
        if run.log is not None:
            meta = RowMeta(run.run_id, run.prompt_id, run.domain, ctx.step, ctx.position, req.prompt_len,
                           ctx.running_accept_rate, ctx.prev_accepted, run.sampling.temperature)
            rows = step_rows(dr.candidates, acc, logits.argmax(-1), self._token_types, meta)
        if run.stream is not None:
            run.stream(emitted)
        tried = int(torch.isin(dr.tree.parents[1:], torch.tensor(acc.path)).sum())
        run.policy.observe(StepOutcome(ctx.step, dr.tree.size - 1, acc.accepted, tried))
        req.tried, req.accepted, req.prev_accepted = req.tried + tried, req.accepted + acc.accepted, acc.accepted
        return emitted, rows

    @torch.inference_mode()
    def generate_plain(self, prompt: str | list[int], max_new_tokens: int = DEFAULTS.max_new_tokens,
                       assistant: PreTrainedModel | None = None) -> GenerationResult:
        """The target's own greedy decoding through ``model.generate``: the reference and the baseline.

        With ``assistant`` (usually ``self.draft``) it is Hugging Face's assisted generation instead, whose
        target calls are not observable: its stats then hold the wall time only.
        """
        ids = self._encode(prompt, max_new_tokens)
        inp = torch.tensor([ids], device=self.device)
        room = self.context - len(ids)  # the same limit generate() stops at (finish="context")
        start = time.perf_counter()
        out = self.target.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                   max_new_tokens=min(max_new_tokens, room), pad_token_id=self._pad_id(),
                                   assistant_model=assistant)
        elapsed = time.perf_counter() - start
        new = out[0, len(ids):].tolist()
        finish: FinishReason = "eos" if new and new[-1] in self.eos_ids else (
            "length" if len(new) >= max_new_tokens else "context")
        steps = [] if assistant is not None else [StepStats(0, 0, 0, 1, 0, 0.0, 0.0, 0.0)] * len(new)
        stats = GenerationStats(steps=steps, total_s=elapsed)
        return GenerationResult(self.tokenizer.decode(new, skip_special_tokens=True), new, ids, finish, stats)

    # -- stages ------------------------------------------------------------------------------------

    def _context(self, req: _Request, step: int, domain: str) -> DraftContext:
        room = self.context - req.seq.numel() - 1  # positions left after the bonus token
        max_depth = max(0, min(req.max_new_tokens - len(req.generated) - 1, room))
        return DraftContext(step, len(req.generated), req.prompt_len, domain, max_depth,
                            req.running_accept_rate, req.prev_accepted, self._token_types)

    def _target_forward(self, req: _Request, tree: DraftTree) -> tuple[torch.Tensor, float]:
        """One stock forward over the uncached committed tokens plus the tree; logits [n, V] at tree nodes."""
        t0 = time.perf_counter()
        feed = self._tree_feed(req, tree, req.target_cache.get_seq_length())
        logits = self._target_cache(req).forward(self.target, feed).float()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return logits, time.perf_counter() - t0

    def _tree_feed(self, req: _Request, tree: DraftTree, cached: int) -> Feed:
        """The committed tokens not yet in the target cache (a causal chain), then the tree under its mask."""
        chain = req.seq[cached:-1]  # committed tokens before the root not yet in the cache
        c = chain.numel()
        root_pos = req.seq.numel() - 1
        pos = torch.cat([torch.arange(cached, cached + c, device=self.device),
                         tree.position_ids(root_pos).to(self.device)])  # [c + n]
        vis = chain_then_tree(c, tree.ancestor_mask)
        return Feed(torch.cat([chain, tree.tokens.to(self.device)]), pos, vis, commit=c, keep=tree.size)

    def _target_cache(self, req: _Request) -> SoloCache:
        return SoloCache(req.target_cache, self.target_layout, next(self.target.parameters()).dtype)

    def _emit(self, req: _Request, tree: DraftTree, acc: Acceptance) -> list[int]:
        """Accepted tokens plus the bonus, cut at EOS, max_new_tokens and the context length."""
        proposed = tree.tokens[acc.path[1:]].tolist() + [acc.bonus]
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

    def _commit(self, req: _Request, dr: DraftResult, acc: Acceptance, emitted: list[int]) -> None:
        """Keep only the emitted part of the accepted path in both caches; extend the sequence.

        Invariant after each step: the target cache holds every token of ``seq`` but the last (pending) one.
        """
        committed = req.seq.numel()  # the root is the last committed token; the tree's nodes are pending
        SoloCache(req.target_cache, self.target_layout, self.target.dtype, committed - 1).compact(
            target_keep(acc, emitted))
        if req.draft_cache.get_seq_length() >= committed:  # the draft caught up this step
            SoloCache(req.draft_cache, self.draft_layout, self.draft.dtype, committed).compact(
                draft_keep(dr, acc, emitted))
        req.seq = torch.cat([req.seq, torch.tensor(emitted, dtype=req.seq.dtype, device=self.device)])

    # -- helpers -----------------------------------------------------------------------------------

    def _encode(self, prompt: str | list[int], max_new_tokens: int) -> list[int]:
        if max_new_tokens < 1:
            raise TreewiseError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if isinstance(prompt, str):
            if not prompt:
                raise TreewiseError("the prompt is empty: pass at least one character or token id")
            ids = self.tokenizer(prompt).input_ids
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

    def _pad_id(self) -> int | None:
        pad = self.tokenizer.pad_token_id
        return pad if pad is not None else (min(self.eos_ids) if self.eos_ids else None)


def _context_length(model: PreTrainedModel) -> int:
    cfg = model.config
    for name in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(cfg, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 1 << 30
