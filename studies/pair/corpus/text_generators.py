"""Generated structured, instruction and chat text over real fillers (split from generators.py for size)."""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterator

from .generators import CITIES, COLORS, NAMES, PRODUCTS, RealText, arith_problem, format_chat, pick


def _record(rng: random.Random) -> dict[str, object]:
    kind = rng.randrange(3)
    if kind == 0:
        return {
            "name": pick(rng, NAMES),
            "age": rng.randint(18, 90),
            "city": pick(rng, CITIES),
            "email": f"{pick(rng, NAMES).lower()}{rng.randint(1, 999)}@example.{pick(rng, ('com', 'org', 'net'))}",
        }
    if kind == 1:
        return {
            "product": pick(rng, PRODUCTS),
            "color": pick(rng, COLORS),
            "price": round(rng.uniform(3, 900), 2),
            "stock": rng.randint(0, 500),
        }
    return {
        "city": pick(rng, CITIES),
        "date": f"20{rng.randint(10, 29)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
        "temp_c": rng.randint(-15, 40),
        "rain_mm": round(rng.uniform(0, 60), 1),
    }


def _sentence(rec: dict[str, object], rng: random.Random) -> str:
    parts = [f"{k.replace('_', ' ')} {pick(rng, ('is', 'of', '=', ':'))} {v}" for k, v in rec.items()]
    rng.shuffle(parts)
    return pick(rng, ("Record: ", "Note - ", "", "From the log, ")) + ", ".join(parts) + "."


def _table(rows: list[dict[str, object]], fmt: str) -> str:
    keys = list(rows[0])
    if fmt == "csv":
        return "\n".join([",".join(keys)] + [",".join(str(r[k]) for k in keys) for r in rows])
    if fmt == "markdown":
        head = "| " + " | ".join(keys) + " |\n|" + "---|" * len(keys)
        return head + "\n" + "\n".join("| " + " | ".join(str(r[k]) for k in keys) + " |" for r in rows)
    if fmt == "yaml":
        return "\n".join("- " + "\n  ".join(f"{k}: {r[k]}" for k in keys) for r in rows)
    return json.dumps(rows, indent=pick(random.Random(len(rows)), (None, 2)))


def structured_task(rng: random.Random) -> tuple[str, str]:
    """(instruction with input, expected output) for a text-to-structure task."""
    kind = rng.randrange(3)
    rows = [_record(random.Random(rng.random())) for _ in range(rng.randint(1, 4))]
    rows = [r for r in rows if list(r) == list(rows[0])]
    fmt = pick(rng, ("json", "csv", "markdown", "yaml"))
    verb = pick(rng, ("Convert", "Turn", "Rewrite", "Format", "Put"))
    if kind == 0:
        text = "\n".join(_sentence(r, rng) for r in rows)
        return (
            f"{verb} the following notes into {fmt.upper() if fmt != 'markdown' else 'a markdown table'}:\n{text}",
            _table(rows, fmt),
        )
    if kind == 1:
        src = pick(rng, ("csv", "json", "yaml", "markdown"))
        return f"{verb} this {src} data to {fmt}:\n{_table(rows, src)}", _table(rows, fmt)
    key = pick(rng, list(rows[0]))
    text = " ".join(_sentence(r, rng) for r in rows)
    return f"Extract every {key.replace('_', ' ')} from the text as a JSON list.\nText: {text}", json.dumps(
        [r[key] for r in rows]
    )


def structured_docs(rng: random.Random) -> Iterator[str]:
    while True:
        items = [structured_task(rng) for _ in range(4)]
        yield "\n\n".join(instruction_format(rng, q, a) for q, a in items)


def instruction_format(rng: random.Random, q: str, a: str) -> str:
    style = rng.randrange(3)
    if style == 0:
        return f"### Instruction:\n{q}\n\n### Response:\n{a}"
    if style == 1:
        return f"User: {q}\nAssistant: {a}"
    return f"Instruction: {q}\nOutput: {a}"


def text_transform(rng: random.Random, text: str) -> tuple[str, str]:
    toks = text.split()
    kind = rng.randrange(6)
    if kind == 0:
        return f"Rewrite in upper case: {text}", text.upper()
    if kind == 1:
        return f'Count the words in: "{text}"', f"The text has {len(toks)} words."
    if kind == 2:
        return f"List the words of this sentence in alphabetical order: {text}", ", ".join(
            sorted(t.strip(".,;:") for t in toks)
        )
    if kind == 3:
        return f"Give the first {min(3, len(toks))} words of: {text}", " ".join(toks[:3])
    if kind == 4:
        return f"Reverse the order of the words: {text}", " ".join(reversed(toks))
    return f"Replace every vowel with '*' in: {text}", "".join("*" if c in "aeiouAEIOU" else c for c in text)


def steps_task(rng: random.Random, facts: RealText) -> tuple[str, str]:
    """A multi-step instruction whose steps act on real text."""
    word, gloss = pick(rng, facts.glosses)
    saying = pick(rng, facts.sayings).replace("\n", " ")[:160]
    steps = [
        ("define the word '" + word + "'", f"{word}: {gloss}."),
        ("copy the quotation", saying),
        ("count its characters", f"The quotation has {len(saying)} characters."),
        ("give its first word", saying.split()[0] if saying.split() else ""),
        ("write the word backwards", word[::-1]),
        ("say how many letters the word has", f"'{word}' has {sum(c.isalpha() for c in word)} letters."),
    ]
    chosen = rng.sample(steps, rng.randint(2, 4))
    intro = pick(
        rng,
        (
            "Do the following steps in order",
            "Follow these steps",
            "Complete each step",
            "Please carry out these tasks",
            "Work through this list",
        ),
    )
    q = intro + ":\n" + "\n".join(f"{i + 1}. {s[0].capitalize()}." for i, s in enumerate(chosen))
    a = "\n".join(f"{i + 1}. {s[1]}" for i, s in enumerate(chosen))
    return q, a


_SHARED_FACTS: list[RealText] = []


def shared_facts(rng: random.Random) -> RealText:
    if not _SHARED_FACTS:
        _SHARED_FACTS.append(RealText.load(rng))
    return _SHARED_FACTS[0]


def instruction_item(rng: random.Random, facts: RealText) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        return instruction_format(rng, *steps_task(rng, facts))
    if kind == 1:
        text = pick(rng, facts.verses if rng.random() < 0.5 else facts.sayings).replace("\n", " ")[:200]
        return instruction_format(rng, *text_transform(rng, text))
    text = pick(rng, facts.sayings).replace("\n", " ")[:200]
    q1, a1 = text_transform(rng, text)
    q2, a2 = text_transform(rng, a1 if len(a1) > 10 else text)
    follow = pick(rng, ("Now", "Next,", "Then", "Good. Now", "Thanks. Now"))
    return format_chat([q1, a1, f"{follow} do this with your answer. {q2.split(':')[0]}.", a2])


def instruction_docs(rng: random.Random) -> Iterator[str]:
    facts = shared_facts(rng)
    while True:
        yield "\n\n".join(instruction_item(rng, facts) for _ in range(4))


def chat_exchange(rng: random.Random, facts: RealText) -> list[str]:
    kind = rng.randrange(6)
    name = pick(rng, NAMES)
    if kind == 0:
        word, gloss = pick(rng, facts.glosses)
        return [
            pick(
                rng,
                (
                    f"What is {word}?",
                    f"Can you tell me what a {word} is?",
                    f"I keep hearing '{word}'. Meaning?",
                ),
            ),
            pick(rng, ("", "Sure. ", "Good question. ")) + f"{word.capitalize()}: {gloss}.",
        ]
    if kind == 1:
        return [
            pick(rng, ("Tell me something funny.", "Got a quote for me?", "Say something wise.", "I'm bored.")),
            pick(rng, facts.sayings),
        ]
    if kind == 2:
        return [
            pick(rng, ("Read me a verse.", "Quote the Bible, please.", "Any old scripture today?")),
            pick(rng, facts.verses),
        ]
    if kind == 3:
        q, a = arith_problem(rng)
        return [q, a]
    if kind == 4:
        city = pick(rng, CITIES)
        return [
            f"Hi, I'm {name} from {city}.",
            pick(
                rng,
                (
                    f"Nice to meet you, {name}! How is {city} these days?",
                    f"Hello {name}. What can I do for you today?",
                ),
            ),
        ]
    letters = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 9)))
    return [f"Spell '{letters}' backwards.", f"'{letters}' backwards is '{letters[::-1]}'."]


def chat_docs(rng: random.Random, facts: RealText) -> Iterator[str]:
    while True:
        turns: list[str] = []
        for _ in range(rng.randint(1, 4)):
            turns += chat_exchange(rng, facts)
        yield format_chat(turns)


def story_docs(rng: random.Random) -> Iterator[str]:
    """Short sayings woven into requests for writing (creative prompts in the trained form)."""
    facts = shared_facts(rng)
    while True:
        topic = pick(rng, facts.glosses)[0]
        body = " ".join(pick(rng, facts.sayings).replace("\n", " ") for _ in range(2))
        yield f"Write a short piece about {topic}.\n{body}"
