"""A copy-heavy prompt suite, data/prompts/copy.jsonl: `python -m studies.pair.corpus.copy_suite`.

Prompt-lookup and suffix drafting win when the answer repeats long spans of the prompt; these prompts ask for
exactly that. Three kinds, each framed like the structured prompts (``### Instruction:`` ... ``### Response:``):

- code: a snippet of data/prompts/code.jsonl (HumanEval or held-out code, at most 25 lines / 900 characters)
  returned whole with one identifier renamed (one that occurs in it) or with a comment added at the top;
- reformat: 4-6 generated records (`text_generators._record`) converted JSON -> CSV, CSV -> JSON or
  markdown table -> CSV;
- quote: a 400-800 character passage of held-out knowledge/creative text, copied whole or quoted line by line.

Code and passages keep their split: a test prompt copies code of code.jsonl's test split or text of
data/heldout, a train or tune prompt text of the same split, so a draft distilled on the suites' train and tune
splits has not memorised what a test prompt copies. Deterministic (fixed seed); the shipped file must equal
`build()`, which tests/studies/test_copy_suite.py checks.
"""

from __future__ import annotations

import builtins
import json
import keyword
import random
import re
from itertools import zip_longest
from pathlib import Path

from treewise.decoder.records.atomic import atomic_path

from .generators import pick
from .text_generators import _record, _table

SEED = 20261204
PROMPTS = Path(__file__).resolve().parents[3] / "data" / "prompts"
KINDS = ("code", "reformat", "quote")
PLAN = {  # prompts per kind and split: 24 test, 8 tune, 8 train, 14/13/13 over the kinds
    "code": {"test": 8, "tune": 3, "train": 3},
    "reformat": {"test": 8, "tune": 3, "train": 2},
    "quote": {"test": 8, "tune": 2, "train": 3},
}
MAX_CODE_CHARS, MAX_CODE_LINES = 900, 25
PASSAGE_CHARS = (400, 800)
_NOT_NAMES = set(keyword.kwlist) | set(dir(builtins)) | {"self", "cls"}
_DEFINED = re.compile(r"def\s+(\w+)\s*\(([^)]*)\)|^\s*(\w+)\s*=[^=]|for\s+(\w+)\s+in\b", re.M)

Item = tuple[str, str]  # (instruction, the content the answer copies)


def frame(task: str, content: str) -> str:
    return f"### Instruction:\n{task}\n{content}\n\n### Response:\n"


def read_rows(name: str, folder: Path = PROMPTS) -> list[dict]:
    rows = [json.loads(line) for line in open(folder / f"{name}.jsonl", encoding="utf-8") if line.strip()]
    return sorted(rows, key=lambda r: r["id"])


def code_snippets(split: str, folder: Path = PROMPTS) -> list[str]:
    """Real code of one split of code.jsonl that fits the size limits (MT-bench rows are requests, not code)."""
    out = []
    for row in read_rows("code", folder):
        text = row["prompt"].strip("\n").rstrip()
        fits = len(text) <= MAX_CODE_CHARS and text.count("\n") < MAX_CODE_LINES
        if row["split"] == split and row["source"] != "mt-bench" and fits:
            out.append(text)
    return out


def identifiers(code: str) -> list[str]:
    """Names the code defines (function, parameter, assignment or loop target) that occur at least twice."""
    names: set[str] = set()
    for m in _DEFINED.finditer(code):
        params = [p.split(":")[0].split("=")[0].strip(" *") for p in (m.group(2) or "").split(",")]
        names.update(n for n in (m.group(1), m.group(3), m.group(4), *params) if n)
    counts = {n: len(re.findall(rf"\b{n}\b", code)) for n in names if n.isidentifier() and n not in _NOT_NAMES}
    return sorted((n for n, c in counts.items() if c >= 2 and len(n) >= 2), key=lambda n: (-counts[n], n))


def code_item(rng: random.Random, code: str, i: int) -> Item:
    names = identifiers(code)
    if i % 2 == 0 and names:
        old = pick(rng, names[:3])
        new = f"{pick(rng, ('new', 'my', 'the', 'local'))}_{old}"
        while re.search(rf"\b{new}\b", code):
            new += "_"
        return f"Rewrite this code renaming the identifier `{old}` to `{new}` everywhere; return the whole code.", code
    what = pick(rng, ("saying what it does", "naming its author as 'treewise'", "that says 'reviewed'"))
    return f"Return this code unchanged except add a one-line comment at the top {what}.", code


def records(rng: random.Random) -> list[dict[str, object]]:
    """4-6 generated records of one kind (same keys)."""
    n = rng.randint(4, 6)
    rows = [_record(random.Random(rng.random()))]
    while len(rows) < n:
        rec = _record(random.Random(rng.random()))
        if list(rec) == list(rows[0]):
            rows.append(rec)
    return rows


def reformat_item(rng: random.Random, i: int) -> Item:
    rows = records(rng)
    keep = pick(rng, ("keep every value exactly as written", "do not change any value", "keep the row order"))
    if i % 3 == 0:
        data = "[\n" + ",\n".join("  " + json.dumps(r) for r in rows) + "\n]"
        return f"Convert this JSON list of records to CSV with a header row; {keep}:", data
    if i % 3 == 1:
        return f"Convert this CSV to a JSON list of objects, one per row; {keep}:", _table(rows, "csv")
    return f"Convert this markdown table to CSV with a header row; {keep}:", _table(rows, "markdown")


def pieces(text: str) -> list[tuple[str, str]]:
    """(glue, piece): the paragraphs of ``text`` (glue a blank line); one longer than half a passage is cut at
    line ends into pieces glued by a newline, so joining them restores the text."""
    out = []
    for para in text.split("\n\n"):
        para, glue = para.strip("\n").rstrip(), "\n\n"
        while len(para) > PASSAGE_CHARS[1] // 2 and (cut := para.rfind("\n", 0, PASSAGE_CHARS[1] // 2)) > 0:
            out.append((glue, para[:cut]))
            para, glue = para[cut + 1 :], "\n"
        if para.strip():
            out.append((glue, para))
    return out


def join(texts: list[tuple[str, str]]) -> list[str]:
    """Consecutive (glue, text) pieces joined into passages of 400-800 characters."""
    lo, hi = PASSAGE_CHARS
    out, cur = [], ""
    for glue, text in texts:
        nxt = f"{cur}{glue}{text}" if cur else text
        cur = (text if len(text) <= hi else "") if len(nxt) > hi else nxt
        if len(cur) >= lo:
            out.append(cur)
            cur = ""
    return out


def passages(split: str, rng: random.Random, folder: Path = PROMPTS) -> list[str]:
    """Knowledge and creative passages of one split, domains alternating.

    Test passages come in order from data/heldout/<domain>.txt (held-out text no prompt or training set holds;
    the suites' test splits have too little long text); train and tune ones join whole held-out prompts of that
    split, shuffled."""
    per_domain: list[list[str]] = []
    for domain in ("knowledge", "creative"):
        if split == "test":
            text = (folder.parent / "heldout" / f"{domain}.txt").read_text(encoding="utf-8")
            texts = pieces(text.rstrip().rsplit("\n\n", 1)[0])  # the last paragraph is cut off: left out
        else:
            texts = [("\n\n", r["prompt"].strip("\n").rstrip()) for r in read_rows(domain, folder)
                     if r["split"] == split and r["source"].startswith("held-out:")]
            rng.shuffle(texts)
        per_domain.append(join(texts))
    return [p for pair in zip_longest(*per_domain) for p in pair if p]


def quote_item(rng: random.Random, passage: str, i: int) -> Item:
    lines = [ln for ln in passage.splitlines() if ln.strip()]
    words = sorted({w for ln in lines for w in re.findall(r"[A-Za-z]{5,}", ln)})
    hits = {w: sum(bool(re.search(rf"\b{w}\b", ln)) for ln in lines) for w in words}
    shared = [w for w, n in hits.items() if 2 <= n <= max(2, len(lines) // 2)]
    if i % 3 == 1 and shared:
        word = pick(rng, shared)
        return f'Quote verbatim, in order, every line of the passage below that contains the word "{word}".', passage
    if i % 3 == 2:
        return "Copy the passage below exactly, numbering its non-empty lines 1., 2., 3. and so on.", passage
    return "Copy the passage below, correcting nothing, then add a one-sentence summary.", passage


def sources(kind: str, split: str, rng: random.Random, folder: Path) -> list[str]:
    """The texts one split of a kind copies (reformat makes its own records)."""
    if kind == "code":
        return code_snippets(split, folder)
    return passages(split, rng, folder) if kind == "quote" else []


def make_item(kind: str, rng: random.Random, content: str, i: int) -> Item:
    if kind == "code":
        return code_item(rng, content, i)
    return quote_item(rng, content, i) if kind == "quote" else reformat_item(rng, i)


def build_items(seed: int = SEED, folder: Path = PROMPTS) -> list[tuple[dict, str]]:
    """Every (row, copied content) of the suite, in kind then id order."""
    out: list[tuple[dict, str]] = []
    for kind in KINDS:
        rng = random.Random(f"{seed}:{kind}")
        n = 0
        for split, count in PLAN[kind].items():
            pool = sources(kind, split, rng, folder)
            if kind != "reformat" and len(pool) < count:
                raise ValueError(f"copy suite: {len(pool)} {kind} sources in split {split}, {count} needed")
            for j, content in enumerate(rng.sample(pool, count) if pool else [""] * count):
                task, copied = make_item(kind, rng, content, j)
                row = {"id": f"copy-{kind}-{n}", "domain": "copy",
                       "prompt": frame(task, copied), "split": split, "source": f"generated:copy-{kind}"}
                out.append((row, copied))
                n += 1
    return out


def build(seed: int = SEED, folder: Path = PROMPTS) -> list[dict]:
    return [row for row, _ in build_items(seed, folder)]


def write(path: Path = PROMPTS / "copy.jsonl", seed: int = SEED, folder: Path = PROMPTS) -> int:
    rows = build(seed, folder)
    with atomic_path(path) as tmp:
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def main() -> None:
    print(f"wrote {write()} prompts to {PROMPTS / 'copy.jsonl'}")


if __name__ == "__main__":
    main()
