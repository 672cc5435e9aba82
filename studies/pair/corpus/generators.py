"""Generated training text: many templates, random values and real-text fillers so no domain is trivial.

Generators take a `random.Random` and yield documents. reasoning-gym items for training use seeds below
`PROMPT_SEED_BASE`; prompt builders use seeds from `PROMPT_SEED_BASE` up, so the two never share an item.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass

from .sources import bible_verses, fortunes

PROMPT_SEED_BASE = 10_000_000

NAMES = (
    "Ada Alan Amira Ben Carla Chen Dario Dmitri Elena Farah Gita Hugo Ines Ivan Jamal Jin Kofi Lena Luis "
    "Maya Mei Nadia Omar Priya Quinn Rosa Sam Sofia Tariq Uma Vera Wen Yusuf Zara Olga Pablo Ruth Theo "
    "Noah Iris Felix Hana Kai Leo Mira Nils Odile Petra Rami Sven Tomas"
).split()
CITIES = (
    "Lisbon Oslo Cairo Lima Quito Hanoi Dakar Perth Austin Leeds Lyon Porto Kyoto Pune Accra Bergen Cork "
    "Gdansk Tunis Malmo Graz Split Turku Davao Recife Cusco Hobart Nantes Basel Tromso"
).split()
ITEMS = (
    "apples pencils books stamps marbles cookies tickets coins shells bottles cards flowers boxes candles "
    "bricks tiles nails seeds eggs lemons oranges plates cups chairs"
).split()
UNITS = {"km": "kilometres", "kg": "kilograms", "L": "litres", "h": "hours", "m": "metres"}
PRODUCTS = (
    "lamp kettle chair desk monitor keyboard backpack umbrella jacket blender toaster notebook "
    "bicycle helmet tent stove camera speaker router printer"
).split()
COLORS = "red blue green yellow black white purple orange grey brown".split()


def pick(rng: random.Random, options: tuple[str, ...] | list[str]) -> str:
    return options[rng.randrange(len(options))]


def gloss_qa(rng: random.Random, word: str, pos: str, gloss: str) -> str:
    q = pick(
        rng,
        (
            f'What does the {pos} "{word}" mean?',
            f"Define {word}.",
            f"Q: {word} ({pos})",
            f'Meaning of "{word}":',
            f"What is meant by {word}?",
            f"{word}, {pos}.",
        ),
    )
    return f"{q}\n{gloss}"


def format_chat(turns: list[str], names: tuple[str, str] = ("User", "Assistant")) -> str:
    return "\n".join(f"{names[i % 2]}: {t}" for i, t in enumerate(turns))


@dataclass
class RealText:
    """Pools of real sentences used as fillers (definitions, sayings, verses)."""

    glosses: list[tuple[str, str]]
    sayings: list[str]
    verses: list[str]

    @classmethod
    def load(cls, rng: random.Random) -> RealText:
        glosses: list[tuple[str, str]] = []
        for line in open("/usr/share/wordnet/data.noun", encoding="utf-8", errors="replace"):
            if "|" in line and not line.startswith("  "):
                head, gloss = line.split("|", 1)
                glosses.append((head.split()[4].replace("_", " "), gloss.strip().split(";")[0]))
        sayings = [f for f in fortunes() if len(f) < 300]
        verses = [v.split(" ", 1)[1] for v in bible_verses() if " " in v]
        rng.shuffle(glosses)
        rng.shuffle(sayings)
        return cls(glosses=glosses, sayings=sayings, verses=verses)


def arith_problem(rng: random.Random) -> tuple[str, str]:
    """A word problem with a worked multi-step solution."""
    who, other = rng.sample(NAMES, 2)
    item = pick(rng, ITEMS)
    a, b, c = rng.randint(3, 90), rng.randint(2, 40), rng.randint(2, 9)
    kind = rng.randrange(5)
    if kind == 0:
        q = f"{who} has {a} {item}. {other} gives {who} {b} more, then {who} shares them equally among {c} friends."
        q += pick(rng, (" How many does each friend get, and how many are left?", " What does each friend receive?"))
        t = a + b
        s = f"{who} has {a} + {b} = {t} {item}. Dividing by {c}: {t} // {c} = {t // c}, remainder {t % c}."
        return q, f"{s}\nEach friend gets {t // c}, with {t % c} left over."
    if kind == 1:
        price, qty, cash = rng.randint(2, 45), rng.randint(2, 12), rng.randint(100, 900)
        q = f"A {pick(rng, PRODUCTS)} costs ${price}. {who} buys {qty} of them and pays with ${cash}. How much change?"
        return (
            q,
            f"Cost: {qty} x {price} = {qty * price}. Change: {cash} - {qty * price} = {cash - qty * price}.",
        )
    if kind == 2:
        speed, hours = rng.randint(20, 120), rng.randint(2, 9)
        u = pick(rng, ("km", "m"))
        q = f"A train from {pick(rng, CITIES)} travels at {speed} {u} per hour for {hours} hours. How far does it go?"
        return q, f"Distance = speed x time = {speed} x {hours} = {speed * hours} {UNITS[u]}."
    if kind == 3:
        pct = rng.choice((5, 10, 12, 15, 20, 25, 30, 40, 50))
        base = rng.randint(2, 80) * 10
        q = f"A {pick(rng, PRODUCTS)} is priced at {base} dollars and is on sale for {pct}% off."
        q += " What is the sale price?"
        off = base * pct / 100
        return (
            q,
            f"Discount: {pct}% of {base} = {off:g}. Sale price: {base} - {off:g} = {base - off:g} dollars.",
        )
    w, h = rng.randint(2, 40), rng.randint(2, 40)
    q = f"A garden in {pick(rng, CITIES)} is {w} m wide and {h} m long. Find its area and perimeter."
    return q, f"Area = {w} x {h} = {w * h} square metres. Perimeter = 2 x ({w} + {h}) = {2 * (w + h)} metres."


MATH_SETS = (
    "gsm_symbolic",
    "basic_arithmetic",
    "chain_sum",
    "fraction_simplification",
    "gcd",
    "lcm",
    "simple_equations",
    "prime_factorization",
    "decimal_arithmetic",
    "leg_counting",
    "time_intervals",
    "coin_flip",
    "products",
    "calendar_arithmetic",
    "power_function",
    "base_conversion",
    "polynomial_multiplication",
    "number_sorting",
    "count_primes",
    "bitwise_arithmetic",
)
LOGIC_SETS = (
    "syllogism",
    "propositional_logic",
    "knights_knaves",
    "family_relationships",
    "aiw",
    "self_reference",
    "number_sequence",
    "zebra_puzzles",
    "word_sorting",
    "letter_counting",
    "spell_backward",
    "word_sequence_reversal",
    "sentence_reordering",
    "shortest_path",
    "maze",
    "mini_sudoku",
    "tower_of_hanoi",
    "jugs",
    "course_schedule",
    "binary_alternation",
)


def gym_items(name: str, seed: int, size: int) -> list[tuple[str, str]]:
    """(question, worked answer) pairs from one reasoning-gym dataset."""
    import reasoning_gym

    ds = reasoning_gym.create_dataset(name, size=size, seed=seed)
    out: list[tuple[str, str]] = []
    for i in range(size):
        item = ds[i]
        meta = item.get("metadata") or {}
        answer = str(item["answer"])
        cot = meta.get("answer_cot") or meta.get("solution_steps")
        worked = f"{cot}\nThe answer is {answer}." if isinstance(cot, str) else f"The answer is {answer}."
        out.append((item["question"].strip(), worked))
    return out


def qa_format(rng: random.Random, q: str, a: str) -> str:
    lead, ans = pick(rng, (("Question:", "Answer:"), ("Problem:", "Solution:"), ("Q:", "A:"), ("Task:", "Reasoning:")))
    return f"{lead} {q}\n{ans} {a}"


def _gym_docs(rng: random.Random, sets: tuple[str, ...], extra: list) -> Iterator[str]:
    seed = 1
    while True:
        name = pick(rng, sets)
        seed += 1
        try:
            items = gym_items(name, seed, 8)
        except Exception:  # a generator that fails on a seed is skipped, not fatal
            continue
        docs = [qa_format(rng, q, a) for q, a in items]
        docs += [qa_format(rng, *f(rng)) for f in extra for _ in range(2)]
        rng.shuffle(docs)
        yield "\n\n".join(docs)


def math_docs(rng: random.Random) -> Iterator[str]:
    return _gym_docs(rng, MATH_SETS, [arith_problem])


def ordering_puzzle(rng: random.Random) -> tuple[str, str]:
    people = rng.sample(NAMES, rng.randint(3, 5))
    rel = pick(
        rng,
        (
            ("taller", "tallest", "shortest"),
            ("older", "oldest", "youngest"),
            ("faster", "fastest", "slowest"),
        ),
    )
    facts = [f"{people[i]} is {rel[0]} than {people[i + 1]}" for i in range(len(people) - 1)]
    rng.shuffle(facts)
    ask_top = rng.random() < 0.5
    q = ". ".join(facts) + f". Who is the {rel[1] if ask_top else rel[2]}?"
    chain = " > ".join(people)
    return (
        q,
        f"Ordering the facts gives {chain}. So the {rel[1] if ask_top else rel[2]} is "
        f"{people[0] if ask_top else people[-1]}.",
    )


def truth_puzzle(rng: random.Random) -> tuple[str, str]:
    p, q = rng.choice((True, False)), rng.choice((True, False))
    a, b = rng.sample(
        (
            "it rains",
            "the door is open",
            "the light is on",
            "Sam is home",
            "the bus is late",
            "the alarm rings",
            "the shop is closed",
            "the road is wet",
        ),
        2,
    )
    op = pick(rng, ("and", "or", "implies"))
    val = (p and q) if op == "and" else (p or q) if op == "or" else ((not p) or q)
    ques = f"Suppose '{a}' is {p} and '{b}' is {q}. Is '{a} {op} {b}' true or false?"
    return (
        ques,
        f"'{a}' = {p}, '{b}' = {q}. Applying '{op}': {p} {op} {q} = {val}. So it is {str(val).lower()}.",
    )


def logic_docs(rng: random.Random) -> Iterator[str]:
    return _gym_docs(rng, LOGIC_SETS, [ordering_puzzle, truth_puzzle])
