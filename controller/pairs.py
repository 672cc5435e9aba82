"""Named model pairs: where each pair's models and its own data files (latency, budgets, predictor) live.

``smollm2`` is the real pair and the default: SmolLM2-135M-Instruct as the target (converted by ``treewise pair
fetch smollm2`` into the user cache; ``source`` names that fetch), the draft ``treewise pair train-draft`` writes
to ``data/models/smollm2-draft``, prompts framed by the target's chat template. ``micro`` is the embedded pair
trained here (``data/models``), which tests and CI decode. ``$TREEWISE_PAIR`` picks the default pair.

Each pair keeps its data files under its own folder of ``data/``; a pair whose file is not there yet borrows
the one of the pair it ``borrows`` from, and ``PairFiles.borrowed`` says so, for the commands to print.
Pure data and paths: the decoder itself reads none of these files (the controller and the studies do).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from treewise.decoder.errors import TreewiseError
from treewise.decoder.paths import data_dir

PAIR_ENV = "TREEWISE_PAIR"
DEFAULT_PAIR = "smollm2"
LATENCY, BUDGETS, PREDICTOR = "latency.json", "budgets.json", "predictor"


@dataclass(frozen=True)
class PairSpec:
    """One named pair: its models, whether prompts are chat turns, and where its data files live."""

    name: str
    chat: bool  # prompts go through the target's chat template as a user turn
    draft: str  # folder under data/
    files: str  # folder under data/ holding latency.json, budgets.json, predictor/ ("" = data/ itself)
    target: str | None = None  # folder under data/, or None: fetched into the user cache (``source``)
    source: str | None = None  # the ``treewise pair fetch`` source that converts the target
    borrows: str | None = None  # the pair whose data files stand in while this pair's own are missing
    how: tuple[tuple[str, str], ...] = ()  # data file -> the command that makes this pair's own

    def draft_dir(self) -> Path:
        return data_dir() / self.draft

    def own(self, kind: str) -> Path:
        """This pair's own path of ``kind`` (latency.json, budgets.json, predictor), present or not."""
        return data_dir() / self.files / kind


@dataclass(frozen=True)
class PairFiles:
    """The data files a pair's policies read: its own, or the borrowed pair's where its own are missing."""

    pair: str
    latency: Path
    budgets: Path
    predictor: Path
    borrowed: tuple[str, ...] = ()  # one sentence per borrowed file: whose, and how to make the pair's own


PAIRS: dict[str, PairSpec] = {
    "smollm2": PairSpec(
        "smollm2", chat=True, draft="models/smollm2-draft", files="smollm2", source="smollm2", borrows="micro",
        how=((LATENCY, "`treewise latency --pair smollm2` measures it"),
             (BUDGETS, "`treewise tune --pair smollm2` tunes them"),
             (PREDICTOR, "`treewise pair prompts` + `treewise collect --pair smollm2` + `treewise train` train "
                         "it (docs/predictor.md)"))),
    "micro": PairSpec("micro", chat=False, draft="models/draft", files="", target="models/target"),
}


def default_pair_name() -> str:
    """``$TREEWISE_PAIR`` when set, else the real pair (``smollm2``)."""
    return os.environ.get(PAIR_ENV) or DEFAULT_PAIR


def pair_spec(name: str | None = None) -> PairSpec:
    """The pair called ``name`` (None: ``default_pair_name()``); an unknown name raises naming the known ones."""
    chosen = name or default_pair_name()
    if chosen not in PAIRS:
        where = f" (from ${PAIR_ENV})" if name is None else ""
        raise TreewiseError(f"unknown model pair {chosen!r}{where}: choose one of {', '.join(PAIRS)}")
    return PAIRS[chosen]


def pair_files(name: str | None = None) -> PairFiles:
    """The latency profile, budgets file and predictor folder the pair's policies read (see ``PairFiles``)."""
    spec = pair_spec(name)
    how = dict(spec.how)
    paths: dict[str, Path] = {}
    notes: list[str] = []
    for kind in (LATENCY, BUDGETS, PREDICTOR):
        own = spec.own(kind)
        if own.exists() or spec.borrows is None:
            paths[kind] = own
            continue
        paths[kind] = PAIRS[spec.borrows].own(kind)
        notes.append(f"{kind}: borrowed from the {spec.borrows} pair ({paths[kind]}) until {own} exists; "
                     f"{how.get(kind, 'make it')}")
    return PairFiles(spec.name, paths[LATENCY], paths[BUDGETS], paths[PREDICTOR], tuple(notes))
