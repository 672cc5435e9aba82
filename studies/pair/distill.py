"""Distil a small draft for a real target from the target's own answers (``treewise pair teacher``).

The draft is a ``MappedLlamaForCausalLM``: a stock Llama of a few layers at the target's width, initialised
from the target's first layers, final norm and embedding rows, whose vocabulary is the K tokens the target
says most often in the training answers plus one ``other`` row (decoder/kernels/mapped.py says why the head is cut).
It learns the target's distribution, not its samples: the loss at every answer token is the cross-entropy
against the target's top-k probabilities (DistillSpec, arXiv 2310.08461), the mass on unkept tokens going to
``other``, so the draft's probabilities of kept tokens stay calibrated.

Prompts whose id hashes into the held-out share never train (neither the weights nor the choice of kept
tokens); their answers give the figures of the model card: coverage of the kept vocabulary and top-1
agreement with the target per domain. Training is time-budgeted and checkpoints (model, optimiser, position
in the epoch) atomically, so a kill -9 loses at most the steps since the last checkpoint.
"""

from __future__ import annotations

import json
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, GenerationConfig, LlamaForCausalLM

from treewise.decoder.errors import TreewiseError
from treewise.decoder.kernels.mapped import MappedLlamaConfig, MappedLlamaForCausalLM
from treewise.decoder.records.atomic import atomic_dir, atomic_path, write_bytes_atomic

from .config import DistillConfig
from .train import lr_at, restore_checkpoint, save_checkpoint

DRAFT_FILES = ("config.json", "generation_config.json", "model.safetensors", "training.json", "README.md")


@dataclass(frozen=True)
class Example:
    key: str
    domain: str
    ids: np.ndarray  # [n] prompt then answer, target ids
    start: int  # index of the first answer token
    topk_ids: np.ndarray  # [L, k] target ids of the teacher's top k at each answer token
    topk_p: np.ndarray  # [L, k] their probabilities (softmax over the k)

    @property
    def answer(self) -> np.ndarray:
        return self.ids[self.start:]


@dataclass(frozen=True)
class DistillProgress:
    step: int
    elapsed_s: float
    budget_s: float
    loss: float


def heldout(key: str, every: int) -> bool:
    """Held out by prompt id, so the greedy and the sampled answers of one prompt fall on one side."""
    return zlib.crc32(key.split("/")[0].encode()) % every == 0


def load_teacher(folder: Path) -> list[Example]:
    shards = sorted(folder.glob("shard-*.npz"))
    if not shards:
        raise TreewiseError(f"no teacher shards in {folder}: run `treewise pair teacher --out {folder}` first")
    examples: list[Example] = []
    for shard in shards:
        z = np.load(shard)
        logits = z["topk_logits"].astype(np.float32)
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        at = 0
        for i, (plen, alen) in enumerate(zip(z["prompt_len"], z["answer_len"], strict=True)):
            prompt = z["prompt_ids"][at:at + plen]
            at += plen
            ids = np.concatenate([prompt, z["answer_ids"][i, :alen]]).astype(np.int64)
            examples.append(Example(str(z["keys"][i]), str(z["domains"][i]), ids, int(plen),
                                    z["topk_ids"][i, :alen].astype(np.int64), probs[i, :alen]))
    return examples


def kept_tokens(train: list[Example], k: int, always: list[int]) -> np.ndarray:
    """The k target ids said most often in the training answers (``always``, e.g. end of turn, included)."""
    counts = np.bincount(np.concatenate([e.answer for e in train]), minlength=1).astype(np.float64)
    counts = np.pad(counts, (0, max(0, max(always, default=0) + 1 - counts.size)))
    counts[always] = np.inf
    order = np.argsort(-counts, kind="stable")
    return np.sort(order[:k])


def build_draft(target: LlamaForCausalLM, layers: int, to_target: np.ndarray,
                from_layers: tuple[int, ...] | None = None) -> MappedLlamaForCausalLM:
    """The target's layers ``from_layers`` (default: its first ``layers``), final norm and kept embedding rows
    (``other``: the mean of the rest)."""
    tc = target.config
    picked = tuple(from_layers) if from_layers else tuple(range(layers))
    if len(picked) != layers or not all(0 <= i < tc.num_hidden_layers for i in picked):
        raise TreewiseError(f"--init-layers {','.join(map(str, picked))}: give {layers} layer indices of the "
                            f"target's 0..{tc.num_hidden_layers - 1}, one per draft layer")
    vocab = int(tc.vocab_size)
    cfg = MappedLlamaConfig(
        target_vocab_size=vocab, vocab_size=len(to_target) + 1, hidden_size=tc.hidden_size,
        intermediate_size=tc.intermediate_size, num_hidden_layers=layers, num_attention_heads=tc.num_attention_heads,
        num_key_value_heads=tc.num_key_value_heads, head_dim=getattr(tc, "head_dim", None),
        rms_norm_eps=tc.rms_norm_eps, rope_parameters=getattr(tc, "rope_parameters", None),
        max_position_embeddings=tc.max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=tc.pad_token_id)
    draft = MappedLlamaForCausalLM(cfg)
    draft.set_map(torch.from_numpy(to_target))
    emb = target.get_input_embeddings().weight.detach().float()
    rest = torch.ones(vocab, dtype=torch.bool)
    rest[torch.from_numpy(to_target)] = False
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(torch.cat([emb[torch.from_numpy(to_target)], emb[rest].mean(0, True)]))
        for i, j in enumerate(picked):
            draft.model.layers[i].load_state_dict(target.model.layers[j].state_dict())
        draft.model.norm.load_state_dict(target.model.norm.state_dict())
    draft.tie_weights()
    return draft


def _batches(examples: list[Example], batch_tokens: int, rng: np.random.Generator) -> list[list[int]]:
    """Indices grouped by length (little padding), groups in a random order."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].ids))
    groups, cur, width = [], [], 0
    for i in order:
        n = len(examples[i].ids) - 1
        if cur and max(width, n) * (len(cur) + 1) > batch_tokens:
            groups.append(cur)
            cur, width = [], 0
        cur.append(i)
        width = max(width, n)
    if cur:
        groups.append(cur)
    rng.shuffle(groups)
    return groups


def _loss(draft: MappedLlamaForCausalLM, batch: list[Example]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Soft cross-entropy against the teacher's top-k at every answer token [N]; also the draft's top-1 (target ids)
    and the teacher's."""
    width = max(len(e.ids) for e in batch) - 1
    ids = torch.zeros(len(batch), width, dtype=torch.long)
    mask = torch.zeros(len(batch), width, dtype=torch.long)
    scored = torch.zeros(len(batch), width, dtype=torch.bool)
    for r, e in enumerate(batch):
        n = len(e.ids) - 1
        ids[r, :n], mask[r, :n] = torch.from_numpy(e.ids[:-1]), 1
        scored[r, e.start - 1:n] = True  # position t predicts token t + 1: the answer's tokens
    hidden = draft.model(input_ids=draft.draft_ids(ids), attention_mask=mask).last_hidden_state[scored]
    logq = torch.log_softmax(draft.lm_head(hidden).float(), -1)
    teacher_ids = torch.from_numpy(np.concatenate([e.topk_ids for e in batch]))
    teacher_p = torch.from_numpy(np.concatenate([e.topk_p for e in batch]))
    loss = -(teacher_p * logq.gather(-1, draft.draft_ids(teacher_ids))).sum(-1)
    guess = draft.to_target[logq[:, :-1].argmax(-1)]  # ``other`` is never drafted
    return loss, guess, teacher_ids[:, 0]


def train_draft(cfg: DistillConfig, on_progress: Callable[[DistillProgress], None] | None = None) -> dict:
    """Train until the budget is spent (resuming from work/), then evaluate and export; returns the card data."""
    torch.set_num_threads(cfg.threads)
    cfg.work.mkdir(parents=True, exist_ok=True)
    examples = load_teacher(cfg.teacher)
    train = [e for e in examples if not heldout(e.key, cfg.heldout_every)]
    held = [e for e in examples if heldout(e.key, cfg.heldout_every)]
    if cfg.target is None:
        raise TreewiseError("train_draft needs the target folder: pass target= (`treewise pair fetch` converts one)")
    target = AutoModelForCausalLM.from_pretrained(cfg.target, dtype=torch.float32)
    eos = [int(t) for t in np.atleast_1d(target.generation_config.eos_token_id)]
    draft = build_draft(target, cfg.layers, kept_tokens(train, cfg.vocab, eos), cfg.init_layers)
    del target
    opt = torch.optim.AdamW(draft.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt = cfg.work / "draft.pt"
    state = restore_checkpoint(ckpt, draft, opt, torch.device("cpu"), "train-draft") if ckpt.exists() else {
        "step": 0, "epoch": 0, "at": 0, "elapsed": 0.0, "loss": float("nan"), "tokens": 0}
    budget = cfg.minutes * 60
    t0, last = time.monotonic() - state["elapsed"], time.monotonic()
    draft.train()
    while state["elapsed"] < budget:
        groups = _batches(train, cfg.batch_tokens, np.random.default_rng(cfg.seed + state["epoch"]))
        while state["at"] < len(groups) and state["elapsed"] < budget:
            for group in opt.param_groups:
                group["lr"] = lr_at(state["elapsed"] / budget, cfg.lr)
            batch = [train[i] for i in groups[state["at"]]]
            loss = _loss(draft, batch)[0].mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
            ema = loss.item() if state["step"] == 0 else 0.98 * state["loss"] + 0.02 * loss.item()
            state.update(step=state["step"] + 1, at=state["at"] + 1, loss=ema, elapsed=time.monotonic() - t0,
                         tokens=state["tokens"] + sum(len(e.answer) for e in batch))
            if on_progress:
                on_progress(DistillProgress(state["step"], state["elapsed"], budget, ema))
            if time.monotonic() - last > cfg.checkpoint_every_s:
                if state["elapsed"] - state.get("selected_at", 0.0) > cfg.select_every_s:
                    _select(draft, held, cfg, state)
                save_checkpoint(ckpt, draft, opt, state)
                last = time.monotonic()
        if state["at"] >= len(groups):
            state.update(epoch=state["epoch"] + 1, at=0)
    save_checkpoint(ckpt, draft, opt, state)
    best = _select(draft, held, cfg, state)
    draft.load_state_dict(best["model"])
    draft.eval()
    card = {"teacher_answers": len(examples), "train_answers": len(train), "heldout_answers": len(held),
            "train_answer_tokens": int(sum(len(e.answer) for e in train)), "layers": cfg.layers,
            "init_layers": list(cfg.init_layers or range(cfg.layers)), "lr": cfg.lr,
            "kept_tokens": cfg.vocab, "steps": state["step"], "epochs": state["epoch"],
            "cpu_minutes": round(state["elapsed"] / 60, 1), "threads": cfg.threads, "final_loss": state["loss"],
            "selected_step": best["step"], "selections": state.get("selections", []),
            "heldout": evaluate(draft, held, cfg.batch_tokens)}
    export_draft(draft, card, cfg.out)
    return card


def _select(draft: MappedLlamaForCausalLM, held: list[Example], cfg: DistillConfig, state: dict) -> dict:
    """Score the weights on the held-out answers and keep them in best.pt if no earlier weights scored lower.

    best.pt holds its own loss, written before the checkpoint that records the scoring, so a kill between the two
    never lets worse weights replace better ones; the export takes best.pt (early stopping: with a few hundred
    thousand answer tokens a one-layer draft starts to memorise them within the budget)."""
    path = cfg.work / "best.pt"
    best = torch.load(path, weights_only=True) if path.exists() else {"loss": float("inf"), "step": -1}
    if best["step"] == state["step"]:
        return best
    draft.eval()
    loss = heldout_loss(draft, held, cfg.batch_tokens) if held else 0.0
    draft.train()
    state["selected_at"] = state["elapsed"]
    state.setdefault("selections", []).append([state["step"], round(state["elapsed"] / 60, 1), round(loss, 4)])
    if loss < best["loss"] or "model" not in best:
        best = {"loss": loss, "step": state["step"], "model": {k: v.detach().clone() for k, v in
                                                               draft.state_dict().items()}}
        with atomic_path(path) as tmp:
            torch.save(best, tmp)
    return best


@torch.no_grad()
def heldout_loss(draft: MappedLlamaForCausalLM, held: list[Example], batch_tokens: int) -> float:
    """Mean soft cross-entropy over every held-out answer token."""
    total, n = 0.0, 0
    for group in _batches(held, batch_tokens, np.random.default_rng(0)):
        loss = _loss(draft, [held[i] for i in group])[0]
        total, n = total + float(loss.sum()), n + loss.numel()
    return total / max(n, 1)


@torch.no_grad()
def evaluate(draft: MappedLlamaForCausalLM, held: list[Example], batch_tokens: int) -> dict:
    """Per domain on held-out answers: loss, coverage of the kept tokens, top-1 agreement with the target."""
    kept = set(draft.to_target.tolist())
    rows: dict[str, list[float]] = {}
    for group in _batches(held, batch_tokens, np.random.default_rng(0)):
        batch = [held[i] for i in group]
        loss, guess, top1 = _loss(draft, batch)
        for e in batch:
            rows.setdefault(e.domain, [0.0, 0.0, 0.0, 0.0])
        at = 0
        for e in batch:
            n = len(e.answer)
            r = rows[e.domain]
            r[0] += float(loss[at:at + n].sum())
            r[1] += sum(t in kept for t in e.answer.tolist())
            r[2] += float((guess[at:at + n] == top1[at:at + n]).sum())
            r[3] += n
            at += n
    return {d: {"tokens": int(r[3]), "loss": round(r[0] / r[3], 4), "coverage": round(r[1] / r[3], 4),
                "top1_agreement": round(r[2] / r[3], 4)} for d, r in sorted(rows.items())}


def export_draft(draft: MappedLlamaForCausalLM, card: dict, out: Path) -> None:
    """bf16 weights (the tied head not stored twice) with a float32 config, atomically as a whole folder."""
    with atomic_dir(out, DRAFT_FILES) as stage:
        draft.config.dtype = "float32"
        draft.config.save_pretrained(stage)
        gen = GenerationConfig(eos_token_id=draft.config.eos_token_id, pad_token_id=draft.config.pad_token_id,
                               do_sample=False)
        gen.save_pretrained(stage)
        weights = {k: (v.detach().to(torch.bfloat16) if v.is_floating_point() else v.detach()).contiguous()
                   for k, v in draft.state_dict().items() if k != "lm_head.weight"}
        save_file(weights, stage / "model.safetensors", metadata={"format": "pt"})
        write_bytes_atomic(stage / "training.json", json.dumps(card, indent=1).encode())
        write_bytes_atomic(stage / "README.md", render_card(card).encode())


def render_card(card: dict) -> str:
    """The model card: what the draft is, what it was trained on and how it scores on held-out answers."""
    lines = [
        "# SmolLM2-135M-Instruct draft, distilled by treewise", "",
        "A `MappedLlamaForCausalLM` (treewise/decoder/kernels/mapped.py): "
        f"{card['layers']} Llama layers at the target's "
        f"width, initialised from the target's layers {card['init_layers']} (and its final norm and embedding "
        f"rows), with a vocabulary of the {card['kept_tokens']} "
        "target tokens most frequent in the training answers plus one `other` row; it reads and writes target "
        "ids, and never drafts a token it does not keep (output stays exact).", "",
        f"- Data: the target's own answers (greedy, and sampled at T=0.8 where the teacher ran with "
        f"`--sampled`) to the train and tune splits of the teacher's prompt suites (`treewise pair teacher`; "
        f"docs/real-pair.md names the suites), {card['teacher_answers']} answers; {card['train_answers']} train "
        f"({card['train_answer_tokens']} answer tokens), {card['heldout_answers']} held out by prompt id. "
        "The test split of data/prompts is never seen.",
        "- Loss: cross-entropy against the target's top-32 probabilities at every answer token (mass on unkept "
        "tokens goes to `other`).",
        f"- Training: {card['steps']} steps, {card['epochs']} full epochs, {card['cpu_minutes']} minutes on "
        f"{card['threads']} CPU threads; final loss (moving average) {card['final_loss']:.3f}. The weights are "
        f"those of step {card.get('selected_step', card['steps'])}, the lowest held-out loss of "
        f"{len(card.get('selections', [])) or 1} scorings during training (early stopping), so the held-out "
        "figures below are slightly optimistic.",
        "- Reproduce: `treewise pair teacher` then `treewise pair train-draft`.", "",
        "| held-out domain | answer tokens | loss | kept-vocabulary coverage | top-1 agreement with target |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {d} | {r['tokens']} | {r['loss']:.3f} | {r['coverage']:.3f} | {r['top1_agreement']:.3f} |"
              for d, r in card["heldout"].items()]
    return "\n".join(lines) + "\n"
