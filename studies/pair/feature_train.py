"""Train a feature draft (decoder/feature_draft.py) on `treewise pair features` shards.

Each slot t of a conversation feeds the draft the target's feature at t and the token at t + 1; the draft is
scored against the target's feature at t + 1 (smooth L1, EAGLE-1's regression) and, where token t + 2 is an
assistant's, against the target's top-k distribution there, renormalised over the kept tokens (soft
cross-entropy). Training-time test (HASS, arXiv 2408.15766; EAGLE-3, arXiv 2503.01840): ``passes`` > 1 runs
the draft again on its own guesses, slot t reading the feature it guessed at slot t - 1, which is what a tree's
deeper levels read. Conversations whose key hashes into the held-out share never train; they give the card's
top-1 agreement per source (the evaluation on prompts no run saw is ``evaluate_features`` on a features folder
of the test split's teacher answers). Time-budgeted, checkpointed atomically (model, optimiser, position in
the epoch): a kill -9 loses at most the steps since the last checkpoint, and a rerun resumes.
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
import torch.nn.functional as F

from treewise.decoder.errors import TreewiseError
from treewise.decoder.feature_draft import FeatureDraft
from treewise.decoder.records.atomic import write_bytes_atomic

from .config import FeatureTrainConfig
from .train import lr_at, restore_checkpoint, save_checkpoint


@dataclass(frozen=True)
class Conv:
    key: str
    source: str
    ids: np.ndarray  # [L]
    hidden: np.ndarray  # [L, H] float16
    predict: np.ndarray  # [L] bool: the distribution at t (of token t + 1) is kept
    top_ids: np.ndarray  # [predict.sum(), k]
    top_logp: np.ndarray


@dataclass(frozen=True)
class FeatureProgress:
    step: int
    elapsed_s: float
    budget_s: float
    loss: float


def load_features(folders: tuple[Path, ...]) -> list[Conv]:
    convs = []
    for folder in folders:
        shards = sorted(Path(folder).glob("shard-*.npz"))
        if not shards:
            raise TreewiseError(f"{folder} holds no feature shards: build them with `treewise pair features`")
        for path in shards:
            s = np.load(path)
            starts = np.concatenate([[0], np.cumsum(s["seq_len"])])
            tops = np.concatenate([[0], np.cumsum(s["predict"])])[starts]  # each row's first top-k row
            for row, key in enumerate(s["keys"].tolist()):
                a, b = starts[row], starts[row + 1]
                convs.append(Conv(key, str(s["sources"][row]), s["ids"][a:b], s["hidden"][a:b], s["predict"][a:b],
                                  s["topk_ids"][tops[row]:tops[row + 1]], s["topk_logp"][tops[row]:tops[row + 1]]))
    return convs


def heldout(key: str, every: int) -> bool:
    return zlib.crc32(key.encode()) % every == 0


@dataclass(frozen=True)
class Batch:
    tokens: torch.Tensor  # [B, T] token t + 1 of each slot t
    features: torch.Tensor  # [B, T, H] the target's feature at t
    next_features: torch.Tensor  # [B, T, H] ... at t + 1
    mask: torch.Tensor  # [B, T] 1 on real slots
    scored: torch.Tensor  # [B, T] 1 where the target's distribution at t + 1 is known (token t + 2 learned)
    learn: torch.Tensor  # [B, T] ... and one of its top-k tokens is kept (the soft label is not empty)
    label_ids: torch.Tensor  # [B, T, k] draft ids of the target's top-k at t + 1 (0 where not kept)
    label_p: torch.Tensor  # [B, T, k] their probabilities over the kept ones (0 where not kept)
    top1: torch.Tensor  # [B, T] the target's top-1 at t + 1 as a draft id, -1 where it is not kept


def make_batch(convs: list[Conv], to_draft: np.ndarray, max_len: int) -> Batch:
    width = min(max(len(c.ids) for c in convs), max_len + 1) - 1
    b, h, k = len(convs), convs[0].hidden.shape[1], convs[0].top_ids.shape[1]
    tokens, mask = np.zeros((b, width), np.int64), np.zeros((b, width), np.float32)
    scored, learn = np.zeros((b, width), np.float32), np.zeros((b, width), np.float32)
    feats, nxt = np.zeros((b, width, h), np.float32), np.zeros((b, width, h), np.float32)
    ids, p, top1 = np.zeros((b, width, k), np.int64), np.zeros((b, width, k), np.float32), np.full((b, width), -1)
    for r, c in enumerate(convs):
        n = min(len(c.ids), width + 1) - 1
        tokens[r, :n], mask[r, :n] = c.ids[1:n + 1], 1.0
        feats[r, :n], nxt[r, :n] = c.hidden[:n], c.hidden[1:n + 1]
        rows = np.cumsum(c.predict) - 1  # position -> its row in top_ids where predict holds
        for t in np.flatnonzero(c.predict[1:n + 1]):
            row = rows[t + 1]
            d = to_draft[c.top_ids[row]]
            q = np.exp(c.top_logp[row].astype(np.float32)) * (d >= 0)
            if q.sum() > 0:
                ids[r, t], p[r, t], learn[r, t] = np.maximum(d, 0), q / q.sum(), 1.0
            top1[r, t], scored[r, t] = d[0], 1.0
    t = torch.from_numpy
    return Batch(t(tokens), t(feats), t(nxt), t(mask), t(scored), t(learn), t(ids), t(p), t(top1))


def losses(draft: FeatureDraft, batch: Batch, passes: int, reg_weight: float) -> tuple[torch.Tensor, list[dict]]:
    """The loss summed over passes, and per pass the sums the card reads (agreement, slots scored)."""
    feats, total, stats = batch.features, torch.zeros(()), []
    attn = batch.mask.long()
    learn, n = batch.learn, batch.learn.sum().clamp(min=1.0)
    for _ in range(passes):
        step = draft(batch.tokens, feats, attention_mask=attn)
        reg = F.smooth_l1_loss(step.features, batch.next_features, reduction="none").mean(-1)
        logq = torch.log_softmax(step.logits, dim=-1)
        ce = -(batch.label_p * logq.gather(-1, batch.label_ids)).sum(-1)
        total = total + (ce * learn).sum() / n + reg_weight * (reg * batch.mask).sum() / batch.mask.sum()
        # A target top-1 the draft does not keep is a miss: top1 is -1 there.
        hit = (step.logits.argmax(-1) == batch.top1) & (batch.scored > 0)
        stats.append({"hits": float(hit.sum()), "slots": float(batch.scored.sum()),
                      "ce": float((ce * learn).sum().detach())})
        # Slot t of the next pass reads the feature this pass guessed at slot t - 1 (the first keeps the target's).
        feats = torch.cat([batch.features[:, :1], step.features[:, :-1]], dim=1)
    return total, stats


def _groups(convs: list[Conv], batch_tokens: int, max_len: int, rng: np.random.Generator) -> list[list[int]]:
    order = rng.permutation(len(convs))
    groups, cur, longest = [], [], 0
    for i in order.tolist():
        n = min(len(convs[i].ids), max_len + 1)
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            groups.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    return groups + ([cur] if cur else [])


def train_feature_draft(cfg: FeatureTrainConfig, on_progress: Callable[[FeatureProgress], None] | None = None
                        ) -> dict:
    """Train until the budget is spent (resuming from work/), then evaluate on the held-out share and export."""
    torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    cfg.work.mkdir(parents=True, exist_ok=True)
    convs = [c for c in load_features(cfg.features) if len(c.ids) > 2]
    train = [c for c in convs if not heldout(c.key, cfg.heldout_every)]
    held = [c for c in convs if heldout(c.key, cfg.heldout_every)]
    if not train:
        raise TreewiseError("no training conversations in the feature folders")
    run = _start(cfg)
    _train(cfg, run, train, on_progress)
    run.draft.eval()
    card = {"conversations": len(convs), "train_conversations": len(train), "heldout_conversations": len(held),
            "train_tokens": int(sum(c.predict.sum() for c in train)), "passes": cfg.passes, "lr": cfg.lr,
            "kept_tokens": run.draft.kept, "steps": run.state["step"], "epochs": run.state["epoch"],
            "cpu_minutes": round(run.state["elapsed"] / 60, 1), "threads": cfg.threads,
            "total_cpu_minutes": round(run.state["elapsed"] / 60 + _earlier_minutes(cfg.init), 1),
            "init": str(cfg.init) if cfg.init else None,
            "final_loss": run.state["loss"], "heldout": evaluate(run.draft, held, run.to_draft, cfg)}
    if cfg.test:
        card["test"] = evaluate(run.draft, load_features(cfg.test), run.to_draft, cfg)
        rows = card["test"].values()
        total = sum(r["tokens"] for r in rows)
        card["test_overall"] = {"tokens": total, "top1_agreement": [  # token-weighted over the domains
            round(sum(r["tokens"] * r["top1_agreement"][i] for r in rows) / max(total, 1), 4)
            for i in range(cfg.passes)]}
    run.draft.save(cfg.out, card)
    write_bytes_atomic(cfg.out / "README.md", render_card(card).encode())
    return card


@dataclass
class _Training:
    """A training run's draft, optimiser and resumable state (step, epoch, position in the epoch, time, loss)."""

    draft: FeatureDraft
    opt: torch.optim.Optimizer
    params: list[torch.nn.Parameter]
    to_draft: np.ndarray  # target id -> draft row, -1 where the draft keeps no row
    ckpt: Path
    state: dict


def _start(cfg: FeatureTrainConfig) -> _Training:
    """A fresh draft from the target's layers, or the checkpoint's under work/."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(cfg.target, dtype=torch.float32).eval()
    if cfg.init is not None:  # its own kept-token map comes with it
        draft = FeatureDraft.load(cfg.init, target).train()
        to_target = draft.to_target.cpu()
    else:
        to_target = load_file(str(cfg.to_target / "model.safetensors"))["to_target"]
        draft = FeatureDraft.from_target(target, to_target)
    to_draft = np.full(target.config.vocab_size, -1, np.int64)
    to_draft[to_target.numpy()] = np.arange(len(to_target))
    params = [p for n, p in draft.named_parameters() if "embed_tokens" not in n]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    ckpt = cfg.work / "feature_draft.pt"
    state = restore_checkpoint(ckpt, draft, opt, torch.device("cpu"), "train-draft --kind feature") \
        if ckpt.exists() else {"step": 0, "epoch": 0, "at": 0, "elapsed": 0.0, "loss": float("nan"), "slots": 0}
    return _Training(draft, opt, params, to_draft, ckpt, state)


def _train(cfg: FeatureTrainConfig, run: _Training, train: list[Conv],
           on_progress: Callable[[FeatureProgress], None] | None) -> None:
    """Optimiser steps until the budget is spent, checkpointing every ``checkpoint_every_s`` and at the end."""
    state, budget = run.state, cfg.minutes * 60
    t0, last = time.monotonic() - state["elapsed"], time.monotonic()
    run.draft.train()
    while state["elapsed"] < budget:
        groups = _groups(train, cfg.batch_tokens, cfg.max_len, np.random.default_rng(cfg.seed + state["epoch"]))
        while state["at"] < len(groups) and state["elapsed"] < budget:
            for group in run.opt.param_groups:
                group["lr"] = lr_at(state["elapsed"] / budget, cfg.lr)
            batch = make_batch([train[i] for i in groups[state["at"]]], run.to_draft, cfg.max_len)
            loss, stats = losses(run.draft, batch, cfg.passes, cfg.reg_weight)
            run.opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(run.params, 1.0)
            run.opt.step()
            ema = loss.item() if state["step"] == 0 else 0.98 * state["loss"] + 0.02 * loss.item()
            state.update(step=state["step"] + 1, at=state["at"] + 1, loss=ema, elapsed=time.monotonic() - t0,
                         slots=state["slots"] + int(stats[0]["slots"]))  # learned slots seen
            if on_progress:
                on_progress(FeatureProgress(state["step"], state["elapsed"], budget, ema))
            if time.monotonic() - last > cfg.checkpoint_every_s:
                save_checkpoint(run.ckpt, run.draft, run.opt, state)
                last = time.monotonic()
        if state["at"] >= len(groups):
            state.update(epoch=state["epoch"] + 1, at=0)
    save_checkpoint(run.ckpt, run.draft, run.opt, state)


def render_card(card: dict) -> str:
    """The model card: what the draft is, what it saw, and its top-1 agreement per source and pass."""
    lines = ["# smollm2-feature-draft", "",
             "A one-layer feature draft for SmolLM2-135M-Instruct (decoder/feature_draft.py): fc([embedding; the",
             "target's last hidden state]), one Llama decoder layer, the target's final norm and the kept rows of its",
             f"head ({card['kept_tokens']} tokens, the standalone draft's map). The target's embedding and head are",
             "attached at load (`FeatureDraft.load(folder, target)`), not stored here.", "",
             f"Trained by `treewise pair train-draft --kind feature` on {card['train_tokens']:,} assistant tokens of "
             f"{card['train_conversations']:,} conversations (`treewise pair features`: ShareGPT conversations and "
             f"teacher answers, teacher-forced through the target), {card['steps']} steps, {card['epochs']} full "
             f"epochs, {card['cpu_minutes']} minutes on {card['threads']} threads, {card['passes']} passes "
             "(the later ones fed the draft's own guesses)"
             + (f", starting from an earlier draft: {card['total_cpu_minutes']} training minutes in all."
                if card.get("init") else "."), "",
             "Top-1 agreement with the target (pass 1: fed the target's features; later passes: the draft's own, as",
             "a tree's deeper levels are):", "",
             "| set | source | tokens | " + " | ".join(f"pass {i + 1}" for i in range(card["passes"])) + " |",
             "|---|---|---|" + "---|" * card["passes"]]
    test = {**card.get("test", {}), **({"all, token-weighted": card["test_overall"]} if "test_overall" in card else {})}
    for name, rows in (("held-out conversations", card["heldout"]), ("test split", test)):
        for src, row in rows.items():
            lines.append(f"| {name} | {src} | {row['tokens']} | "
                         + " | ".join(f"{a:.3f}" for a in row["top1_agreement"]) + " |")
    return "\n".join(lines) + "\n"


def _earlier_minutes(init: Path | None) -> float:
    """The training minutes behind the draft a run started from (its card's total)."""
    if init is None:
        return 0.0
    card = json.loads((init / "feature_draft.json").read_text()).get("card", {})
    return float(card.get("total_cpu_minutes", card.get("cpu_minutes", 0.0)))


@torch.no_grad()
def evaluate(draft: FeatureDraft, convs: list[Conv], to_draft: np.ndarray, cfg: FeatureTrainConfig) -> dict:
    """Per source: slots scored and top-1 agreement with the target at each pass (1: fed the target's features;
    2, 3: fed its own guesses, as a tree's deeper levels are)."""
    rows: dict[str, list[list[float]]] = {}
    for group in _groups(convs, cfg.batch_tokens, cfg.max_len, np.random.default_rng(0)):
        for c in (convs[i] for i in group):  # one at a time: the sums are per source
            _, stats = losses(draft, make_batch([c], to_draft, cfg.max_len), cfg.passes, cfg.reg_weight)
            acc = rows.setdefault(c.source, [[0.0, 0.0] for _ in stats])
            for a, s in zip(acc, stats, strict=True):
                a[0], a[1] = a[0] + s["hits"], a[1] + s["slots"]
    return {src: {"tokens": int(acc[0][1]), "top1_agreement": [round(h / max(n, 1.0), 4) for h, n in acc]}
            for src, acc in sorted(rows.items())}
