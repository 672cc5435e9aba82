"""TreeDecoder: draft -> verify -> accept -> cache update, one step per target forward."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict
from transformers import PreTrainedModel

from treewise.decoder.cache.arena import ArenaCache
from treewise.decoder.draft import draft_tree
from treewise.decoder.errors import TreewiseError
from treewise.decoder.feature_draft import FeatureDraft
from treewise.decoder.loading import load_pair
from treewise.decoder.policy import RequestInfo, StaticTree, TreePolicy
from treewise.decoder.records.nodelog import NodeLogWriter
from treewise.decoder.records.results import (
    PLAIN_STEP,
    FinishReason,
    GenerationResult,
    GenerationStats,
    StageTimes,
    StepStats,
)
from treewise.decoder.verify import DraftMode, Sampling, VerifyInput

from . import stages
from .batch import decode_batch, fresh_policy
from .step import Request, Run, StepCore, TargetFeatures

__all__ = ["DEFAULTS", "DecodeConfig", "Request", "Run", "TreeDecoder", "policy_name"]

_TREE_ROOM = 64  # cache positions past prompt + new tokens for one step's tree


class DecodeConfig(BaseModel):
    """Defaults of a generation; the CLI reads its defaults from here."""

    model_config = ConfigDict(frozen=True)

    max_new_tokens: int = 128
    temperature: float = 0.0
    width: int = 2
    depth: int = 4
    draft_mode: DraftMode = "topk"


DEFAULTS = DecodeConfig()


def policy_name(policy: TreePolicy) -> str:
    """What a result reports as its policy: the policy's ``name`` where it has one, else its class name."""
    name = getattr(policy, "name", None)
    return name if isinstance(name, str) and name else type(policy).__name__


class TreeDecoder(StepCore):
    """Lossless tree speculative decoding for a target/draft pair of Hugging Face causal LMs.

    ``generate`` and ``generate_batch`` without ``tree=`` decode with ``default_policy`` (``with_policy`` sets
    it; ``treewise.load`` sets a named pair's shipped one) and ``domain`` defaults to ``default_domain``."""

    # A frozen StaticTree holds no per-request state, so one instance can be every decoder's fallback.
    default_policy: TreePolicy = StaticTree(DEFAULTS.width, DEFAULTS.depth)
    default_policy_name: str = f"static:width={DEFAULTS.width},depth={DEFAULTS.depth}"
    default_domain: str = "unknown"

    def with_policy(self, policy: TreePolicy, name: str | None = None, domain: str | None = None) -> TreeDecoder:
        """Make ``policy`` what ``generate`` runs without ``tree=`` (``name``: what results report, default its
        class name; ``domain``: the default domain, e.g. "auto" for a policy that classifies prompts)."""
        self.default_policy, self.default_policy_name = policy, name or policy_name(policy)
        if domain is not None:
            self.default_domain = domain
        return self

    @classmethod
    def from_pretrained(cls, target: str | Path, draft: str | Path, device: str | None = None,
                        dtype: str | torch.dtype | None = None, trust_remote_code: bool = False,
                        allow_unverified: bool = False, chat: bool = False,
                        precision: str | None = None) -> TreeDecoder:
        """Load both models and the shared tokenizer (CUDA + bf16 when present, else CPU + float32); ``chat``:
        text prompts are framed by the target's chat template as a user turn (``decoder.chat.chat_ids``);
        ``precision``: "exact" (float32) or "fast" (bfloat16 where the hardware has it), instead of ``dtype``."""
        t, d, tok = load_pair(target, draft, device=device, dtype=dtype, trust_remote_code=trust_remote_code,
                              precision=precision)
        return cls(t, d, tok, allow_unverified=allow_unverified, chat=chat)

    @torch.inference_mode()
    def generate(self, prompt: str | list[int], max_new_tokens: int = DEFAULTS.max_new_tokens,
                 tree: TreePolicy | None = None, temperature: float = DEFAULTS.temperature,
                 top_k: int | None = None, top_p: float | None = None, seed: int | None = None,
                 domain: str | None = None, prompt_id: str = "", run_id: str = "",
                 log: NodeLogWriter | None = None, draft_mode: DraftMode = DEFAULTS.draft_mode,
                 stream: Callable[[list[int]], None] | None = None) -> GenerationResult:
        """Decode ``prompt``; ``stream`` (if given) receives each step's new token ids as they are accepted.

        ``tree`` None: the decoder's ``default_policy``; ``domain`` None: its ``default_domain``."""
        sampling = Sampling(temperature, top_k, top_p)
        policy, name = self._policy(tree)
        req = self._new_request(self._encode(prompt, max_new_tokens), max_new_tokens)
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        run = Run(policy, sampling, draft_mode, gen, domain or self.default_domain, prompt_id, run_id, log, stream)
        return self._result(req, self._loop(req, run), name)

    @torch.inference_mode()
    def generate_batch(self, prompts: list[str] | list[list[int]],
                       max_new_tokens: int | list[int] = DEFAULTS.max_new_tokens, tree: TreePolicy | None = None,
                       temperature: float = DEFAULTS.temperature, top_k: int | None = None,
                       top_p: float | None = None, seed: int | list[int | None] | None = None,
                       domain: str | list[str] | None = None, prompt_ids: list[str] | None = None, run_id: str = "",
                       log: NodeLogWriter | list[NodeLogWriter | None] | None = None,
                       draft_mode: DraftMode = DEFAULTS.draft_mode, max_batch: int | None = None,
                       on_finish: Callable[[int, GenerationResult], None] | None = None) -> list[GenerationResult]:
        """Decode many prompts together, one shared target forward per step; row i equals ``generate(prompts[i])``.

        Each row gets its own copy of ``tree`` (policies keep per-request state), its own sampler (``seed``:
        one for every row, or one per row), its own stop condition (``max_new_tokens``: one, or one per row).
        ``max_batch``: at most that many rows decode at once; the others wait and join as rows finish
        (continuous batching; None: all at once). ``log`` (one writer, or one per row) receives each row's node
        rows when that row ends, in its step order; ``on_finish(i, result)`` is called as row i ends.
        """
        n = len(prompts)
        seeds = seed if isinstance(seed, list) else [seed] * n
        domains = domain if isinstance(domain, list) else [domain or self.default_domain] * n
        ids = prompt_ids if prompt_ids is not None else [""] * n
        logs = log if isinstance(log, list) else [log] * n
        limits = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * n
        if not len(seeds) == len(domains) == len(ids) == len(logs) == len(limits) == n:
            raise TreewiseError(f"seed, domain, prompt_ids, log and max_new_tokens lists must have one entry per "
                                f"prompt ({n})")
        if max_batch is not None and max_batch < 1:
            raise TreewiseError(f"max_batch must be >= 1 (or None: every row at once), got {max_batch}")
        encoded = self._encode_batch(prompts, limits)
        policy, name = self._policy(tree)
        sampling = Sampling(temperature, top_k, top_p)
        reqs = [self._new_request(e, m) for e, m in zip(encoded, limits, strict=True)]
        runs = [Run(fresh_policy(policy), sampling, draft_mode,
                     torch.Generator().manual_seed(s) if s is not None else None, d, pid, run_id, lg)
                for s, d, pid, lg in zip(seeds, domains, ids, logs, strict=True)]
        done = None if on_finish is None else lambda i, st: on_finish(i, self._result(reqs[i], st, name))
        stats = decode_batch(self, reqs, runs, max_batch, done)
        return [self._result(r, st, name) for r, st in zip(reqs, stats, strict=True)]

    def _policy(self, tree: TreePolicy | None) -> tuple[TreePolicy, str]:
        if tree is None:
            return self.default_policy, self.default_policy_name
        return tree, policy_name(tree)

    def _new_request(self, ids: list[int], max_new_tokens: int) -> Request:
        room = min(self.context, len(ids) + max_new_tokens) + _TREE_ROOM  # the arena seldom has to grow
        return Request(seq=torch.tensor(ids, device=self.device), prompt_len=len(ids), max_new_tokens=max_new_tokens,
                        target_cache=ArenaCache(self.target_layers, room),
                        draft_cache=ArenaCache(self.draft_layers, room),
                        features=TargetFeatures() if self.reads_features else None)

    def _loop(self, req: Request, run: Run) -> GenerationStats:
        """The decode loop: draft -> verify -> accept -> cache update until a stop condition."""
        text = self.tokenizer.decode(req.seq.tolist(), skip_special_tokens=True)
        run.policy.start(RequestInfo(run.domain, req.prompt_len, req.max_new_tokens, run.sampling.temperature, text))
        stats = GenerationStats()
        start = time.perf_counter()
        stages.prefill_features(self, req)
        while req.finish is None:
            stats.steps.append(self._step(req, run, len(stats.steps)))
        stats.total_s = time.perf_counter() - start
        stages.ended(req, run)
        if run.log is not None:
            run.log.end_request()
        return stats

    def _step(self, req: Request, run: Run, step: int) -> StepStats:
        """One step: draft -> verify -> accept -> cache update, timed by stage."""
        t0 = time.perf_counter()
        ctx = stages.context(self, req, step, run)
        stages.propose(req, run, ctx)
        feats = None if req.features is None else req.features.view()
        dr = stages.merged(run, ctx, draft_tree(self.draft, req.draft_cache, req.seq, run.policy, ctx, run.sampling,
                                               run.draft_mode, self.vocab, run.generator, self.draft_layout,
                                               self.draft_dtype, feats))
        t1 = time.perf_counter()
        fwd = stages.target_forward(self, req, dr.tree)
        t2 = time.perf_counter()
        acc = self.verifier(VerifyInput(dr.tree, fwd.logits, run.sampling, run.draft_mode, dr.draft_probs,
                                        run.generator, dr.fixed_from if dr.extra else None))
        t3 = time.perf_counter()
        emitted, rows = stages.settle(self, req, run, ctx, dr, fwd.logits, acc, 1e3 * (dr.model_s + fwd.model_s))
        if rows is not None:
            run.log.add_step(rows)  # type: ignore[union-attr]
        t4 = time.perf_counter()
        stages.commit(self, req, dr, fwd, acc, emitted)
        t5 = time.perf_counter()
        times = StageTimes(draft_model=dr.model_s, target_model=fwd.model_s,
                            masks=dr.forward_s - dr.model_s + fwd.seconds - fwd.model_s,
                            drafting=t1 - t0 - dr.forward_s - dr.policy_s, policy=dr.policy_s, verify=t3 - t2,
                            settle=t4 - t3, commit=t5 - t4, total=t5 - t0)
        models = dr.model_s + fwd.model_s
        return StepStats(drafted=dr.candidates.size, verified=dr.tree.size - 1, accepted=acc.accepted,
                         emitted=len(emitted), draft_forwards=dr.forwards, draft_s=dr.model_s, verify_s=fwd.model_s,
                         other_s=t5 - t0 - models, policy_s=dr.policy_s, stages=times)

    @torch.inference_mode()
    def generate_plain(self, prompt: str | list[int], max_new_tokens: int = DEFAULTS.max_new_tokens,
                       assistant: PreTrainedModel | None = None, prompt_lookup: int | None = None) -> GenerationResult:
        """The target's own greedy decoding through ``model.generate``: the reference and the baseline.

        With ``assistant`` (usually ``self.draft``) it is Hugging Face's assisted generation instead, with
        ``prompt_lookup`` its prompt lookup decoding (that many candidate tokens copied from the prompt); the
        target calls of either are not observable: its stats then hold the wall time only.
        """
        if isinstance(assistant, FeatureDraft):
            raise TreewiseError("Hugging Face assisted generation runs a standalone causal LM as its assistant, not a "
                                "feature draft: pass a standalone draft (e.g. data/models/smollm2-draft)")
        ids = self._encode(prompt, max_new_tokens)
        inp = torch.tensor([ids], device=self.device)
        room = self.context - len(ids)  # the same limit generate() stops at (finish="context")
        start = time.perf_counter()
        out = self.target.generate(inp, attention_mask=torch.ones_like(inp), do_sample=False,
                                   max_new_tokens=min(max_new_tokens, room), pad_token_id=self._pad_id(),
                                   assistant_model=assistant, prompt_lookup_num_tokens=prompt_lookup)
        elapsed = time.perf_counter() - start
        new = out[0, len(ids):].tolist()
        finish: FinishReason = "eos" if new and new[-1] in self.eos_ids else (
            "length" if len(new) >= max_new_tokens else "context")
        hidden = assistant is not None or prompt_lookup is not None
        steps = [] if hidden else [PLAIN_STEP] * len(new)
        stats = GenerationStats(steps=steps, total_s=elapsed)
        name = "plain" if not hidden else ("prompt_lookup" if assistant is None else "assisted")
        return GenerationResult(self.tokenizer.decode(new, skip_special_tokens=True), new, ids, finish, stats, name)

    @torch.inference_mode()
    def generate_plain_batch(self, prompts: list[str] | list[list[int]],
                             max_new_tokens: int = DEFAULTS.max_new_tokens) -> list[GenerationResult]:
        """The target's own greedy decoding of many prompts in one ``model.generate`` (left padding): the
        batched baseline. Each row is cut at its EOS; stats hold the batch's wall time, shared by every row."""
        encoded = self._encode_batch(prompts, max_new_tokens)
        width = max(len(e) for e in encoded)
        pad = self._pad_id() or 0
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded], device=self.device)  # [B, width]
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=self.device)
        room = self.context - width  # the longest row's room, as generate() would stop it
        start = time.perf_counter()
        out = self.target.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=min(max_new_tokens, room),
                                   pad_token_id=pad)
        elapsed = time.perf_counter() - start
        results = []
        for e, row in zip(encoded, out[:, width:].tolist(), strict=True):
            end = next((i + 1 for i, t in enumerate(row) if t in self.eos_ids), len(row))
            new = row[:end]
            finish: FinishReason = "eos" if new and new[-1] in self.eos_ids else (
                "length" if len(new) >= max_new_tokens else "context")
            stats = GenerationStats(steps=[PLAIN_STEP] * len(new), total_s=elapsed)
            results.append(GenerationResult(self.tokenizer.decode(new, skip_special_tokens=True), new, e, finish,
                                            stats, "plain"))
        return results
