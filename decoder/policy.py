"""Tree policies: at each level a policy sees the frontier and says what to keep and expand.

The decoder drafts level by level. Level 0 is the root alone; the policy says how many children to
draft for it. At level d >= 1 the frontier holds every candidate drafted at depth d (the top-k children
of the nodes expanded at d - 1) with the features known before verification; the policy returns which
candidates enter the tree and how many children each kept one drafts next (0 = leaf).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np
import torch

from treewise.decoder.records.nodelog import NUMPY_TYPES, SOURCES, TOKEN_TYPES, feature_columns

from .errors import TreewiseError

_TYPE_NAMES = np.asarray(TOKEN_TYPES, dtype=object)
# The per-candidate columns of a Frontier, by field name.
_COLUMNS = ("tokens", "parent", "sibling_rank", "draft_logprob", "draft_entropy", "draft_margin", "path_logprob",
            "parent_draft_prob")
_SPECIAL = TOKEN_TYPES.index("special")


@dataclass(frozen=True)
class RequestInfo:
    """What a policy may know about the request before the first step."""

    domain: str
    prompt_len: int
    max_new_tokens: int
    temperature: float
    prompt: str = ""  # the prompt text (decoded when token ids were given), e.g. for domain="auto"


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor view of a column; a copy of a read-only one (the root's shared columns), which torch cannot
    view without a warning and a reader must not write through."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


def _column(name: str, doc: str) -> property:
    return property(lambda self: _tensor(self.columns[name]), doc=f"[m] tensor view: {doc}")


class _CandidateViews:
    """Tensor views of the per-candidate columns a ``Frontier`` and the step's ``Candidates`` share (each holds
    them as numpy arrays in ``columns``)."""

    columns: Mapping[str, np.ndarray]

    tokens = _column("tokens", "draft token ids")
    parent = _column("parent", "candidate index of the parent in the whole step, -1 for the root")
    sibling_rank = _column("sibling_rank", "rank among its siblings by draft probability")
    draft_logprob = _column("draft_logprob", "log draft probability")
    draft_entropy = _column("draft_entropy", "entropy of the distribution it was drafted from")
    draft_margin = _column("draft_margin", "top-1 minus top-2 probability of that distribution")
    path_logprob = _column("path_logprob", "summed draft log probability from the root")
    parent_draft_prob = _column("parent_draft_prob", "the parent's own draft probability")

    @property
    def size(self) -> int:
        return len(self.columns["tokens"])


@dataclass(frozen=True)
class Frontier(_CandidateViews):
    """Candidates at one depth of the tree being drafted: per-candidate columns ([m] numpy arrays, read as
    ``arrays()`` or as tensor views like ``frontier.tokens``) and the step's scalars.

    The drafter builds one per level from its own numpy columns; ``Frontier.of`` builds one from tensors."""

    depth: int  # 0 for the root level
    step: int
    position: int  # output index of the root's children (tokens generated before this step)
    prompt_len: int
    domain: str
    temperature: float
    tree_size: int  # nodes already kept in the tree, root excluded
    max_depth: int  # deepest level the decoder allows this step (stop and context limits)
    # Every name of _COLUMNS -> [m] array; tensors are made only when a policy reads one (torch.from_numpy
    # per column and level is a cold call right after a draft forward, paid by policies that read none).
    columns: Mapping[str, np.ndarray] = field(repr=False, compare=False)
    running_accept_rate: float = float("nan")
    prev_accepted: int = -1
    token_type_table: np.ndarray | None = field(default=None, repr=False)  # [V] index into TOKEN_TYPES
    batch: int = 1  # rows decoded together in this step: a batch-aware policy sizes its tree for their goodput

    @classmethod
    def of(cls, *, tokens: torch.Tensor | np.ndarray, parent: torch.Tensor | np.ndarray,
           sibling_rank: torch.Tensor | np.ndarray, draft_logprob: torch.Tensor | np.ndarray,
           draft_entropy: torch.Tensor | np.ndarray, draft_margin: torch.Tensor | np.ndarray,
           path_logprob: torch.Tensor | np.ndarray, parent_draft_prob: torch.Tensor | np.ndarray,
           **scalars: object) -> Frontier:
        """A frontier from per-candidate tensors or arrays (CPU, sharing their memory) and the scalar fields."""
        given = (tokens, parent, sibling_rank, draft_logprob, draft_entropy, draft_margin, path_logprob,
                 parent_draft_prob)
        cols = {n: v.numpy() if isinstance(v, torch.Tensor) else np.asarray(v)
                for n, v in zip(_COLUMNS, given, strict=True)}
        return cls(columns=cols, **scalars)  # type: ignore[arg-type]

    @classmethod
    def from_fields(cls, fields: Mapping[str, object], depth: int, tree_size: int,
                    columns: Mapping[str, np.ndarray]) -> Frontier:
        """A frontier from a step's shared ``fields`` (every other field, by name) and one level's values,
        unchecked: the frozen ``__init__`` sets its 12 fields one ``object.__setattr__`` at a time, each a cold
        call right after a draft forward, where one dict update is a single call (docs/performance.md)."""
        frontier = object.__new__(cls)
        frontier.__dict__.update(fields, depth=depth, tree_size=tree_size, columns=columns)
        return frontier

    def arrays(self) -> Mapping[str, np.ndarray]:
        """The candidate columns as numpy arrays, by name (the drafter's own: do not write into them)."""
        return self.columns

    def features(self) -> dict[str, np.ndarray]:
        """Node-log feature columns for these candidates (what a learned predictor consumes)."""
        m = self.size
        types = (_TYPE_NAMES[self.token_type_table[self.columns["tokens"]]] if self.token_type_table is not None
                 else np.full(m, "special", dtype=object))
        return candidate_features(self, np.full(m, self.depth), types, domain=self.domain, position=self.position,
                                  prompt_len=self.prompt_len, running_accept_rate=self.running_accept_rate,
                                  prev_accepted=self.prev_accepted, temperature=self.temperature)

    def numeric_features(self) -> dict[str, np.ndarray]:
        """``features()`` without object arrays, for a predictor's hot path: ``token_type`` and ``source`` as
        integer codes into ``TOKEN_TYPES`` and ``SOURCES`` and no ``domain`` (the caller adds its own code)."""
        m = self.size
        c = self.columns
        tokens = c["tokens"]
        types = (self.token_type_table[tokens] if self.token_type_table is not None
                 else np.full(m, _SPECIAL, dtype=np.int64))

        scalars = {"depth": self.depth, "position": self.position + self.depth - 1, "prompt_len": self.prompt_len,
                   "running_accept_rate": self.running_accept_rate, "prev_accepted": self.prev_accepted,
                   "temperature": self.temperature}
        # Scalars in the node log's types (training saw float32 rates).
        # A frontier holds the draft model's candidates: the lookup columns of the draft's alone, ``source`` as
        # its code into SOURCES (as token_type's into TOKEN_TYPES).
        scalars |= {"lookup_prob": np.nan, "lookup_count": 0, "match_len": 0}
        return {name: np.full(m, v, dtype=NUMPY_TYPES[name]) for name, v in scalars.items()} | {
            "source": np.zeros(m, dtype=np.int64), "token_id": tokens, "token_type": types,
            **{n: c[n] for n in ("sibling_rank", "draft_logprob", "draft_entropy", "draft_margin", "path_logprob",
                                 "parent_draft_prob")},
        }


_CANDIDATE_COLUMNS = (*_COLUMNS, "depth", "tree_index")


@dataclass(frozen=True)
class Candidates(_CandidateViews):
    """Every candidate drafted in one step, in level order: [m] numpy columns (``columns``, by name) read as
    tensor views (``candidates.path_logprob``); tensors are made only for what a reader asks for."""

    columns: Mapping[str, np.ndarray] = field(repr=False)  # every name of _CANDIDATE_COLUMNS

    depth = _column("depth", "1 for the root's children")
    tree_index = _column("tree_index", "index in the DraftTree, -1 when the policy pruned it")

    def with_tree_index(self, tree_index: np.ndarray) -> Candidates:
        return Candidates({**self.columns, "tree_index": tree_index})


def candidate_features(c: Frontier | Candidates, depth: np.ndarray, token_type: np.ndarray, *, domain: str,
                       position: int, prompt_len: int, running_accept_rate: float, prev_accepted: int,
                       temperature: float) -> dict[str, np.ndarray]:
    """The feature columns of drafted candidates (ids excluded), typed by the node-log schema.

    One definition for both views: ``Frontier.features()`` (one depth, before the policy decides) and the
    node-log rows of a step's ``Candidates`` (every depth, after verification). ``position`` counts the tokens
    generated before the step; a node at depth d would become output token ``position + d - 1``.
    """
    return feature_columns(c.size, {
        "domain": domain, "depth": depth, "sibling_rank": c.columns["sibling_rank"], "token_id": c.columns["tokens"],
        "token_type": token_type, "draft_logprob": c.columns["draft_logprob"],
        "draft_entropy": c.columns["draft_entropy"], "draft_margin": c.columns["draft_margin"],
        "path_logprob": c.columns["path_logprob"], "parent_draft_prob": c.columns["parent_draft_prob"],
        "position": position + depth - 1, "prompt_len": prompt_len,
        "running_accept_rate": running_accept_rate, "prev_accepted": prev_accepted, "temperature": temperature,
        **_lookup_features(c),
    })


_SOURCE_NAMES = np.asarray(SOURCES, dtype=object)


def _lookup_features(c: Frontier | Candidates) -> dict[str, object]:
    """Who proposed each candidate and what the lookup knew of it (decoder.candidates.merge); a frontier, and a step the
    draft model alone drafted, hold the draft's candidates only."""
    cols = c.columns
    if "source" not in cols:
        return {"source": "draft", "lookup_prob": np.nan, "lookup_count": 0, "match_len": 0}
    return {"source": _SOURCE_NAMES[cols["source"]], "lookup_prob": cols["lookup_prob"],
            "lookup_count": cols["lookup_count"], "match_len": cols["match_len"]}


@dataclass(frozen=True)
class LevelPlan:
    """A policy's answer for one frontier, held as numpy arrays: a policy may pass torch tensors, which are
    converted here (the drafter's bookkeeping is numpy, and a torch op per answer is slow right after a forward)."""

    keep: np.ndarray  # [m] bool: candidates that enter the tree (ignored at the root level)
    children: np.ndarray  # [m] int: children to draft for each kept candidate (0 = leaf)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keep", _numpy(self.keep))
        object.__setattr__(self, "children", _numpy(self.children))

    @classmethod
    def of_arrays(cls, keep: np.ndarray, children: np.ndarray) -> LevelPlan:
        """A plan from numpy arrays taken as they are, unchecked: the frozen ``__init__`` and its conversion
        check are cold calls right after a draft forward (docs/performance.md)."""
        plan = object.__new__(cls)
        plan.__dict__.update(keep=keep, children=children)
        return plan

    @classmethod
    def uniform(cls, m: int, children: int, keep: np.ndarray | torch.Tensor | None = None) -> LevelPlan:
        if keep is None:  # the same read-only plan for every level of this shape (a static tree's every level)
            return _uniform_plan(m, children)
        kept = _numpy(keep).astype(bool, copy=False)
        return cls(keep=kept, children=np.where(kept, children, 0))


@functools.lru_cache(maxsize=256)
def _uniform_plan(m: int, children: int) -> LevelPlan:
    """Keep all ``m``, ``children`` each: read-only arrays, shared by every caller (two allocations and a
    plan per level are cold calls right after a draft forward, a cache hit one lookup; docs/performance.md)."""
    keep, kids = np.ones(m, dtype=bool), np.full(m, children, dtype=np.int64)
    keep.flags.writeable = kids.flags.writeable = False
    return LevelPlan.of_arrays(keep, kids)


def _numpy(value: np.ndarray | torch.Tensor | list) -> np.ndarray:
    """A policy's answer as a numpy array (a CPU tensor's memory is shared, not copied)."""
    if isinstance(value, np.ndarray):
        return value
    return value.numpy(force=True) if isinstance(value, torch.Tensor) else np.asarray(value)


@dataclass(frozen=True)
class StepOutcome:
    """What the verifier decided in one step, reported back to the policy."""

    step: int
    verified: int  # tree nodes sent to the target, root excluded
    accepted: int  # draft tokens accepted
    tried: int  # verified nodes whose parent was accepted
    path: tuple[int, ...] = ()  # tree indices of the accepted nodes, root (0) excluded, in order
    forward_ms: float = float("nan")  # the step's model forwards, draft and target, as measured (a batch: shared)
    extra: int = 0  # verified nodes another source proposed (decoder.candidates.merge): the last ``extra`` tree indices
    from_lookup: int = 0  # accepted nodes another source proposed, alone or with the draft model


@runtime_checkable
class TreePolicy(Protocol):
    """Decides the shape of each step's draft tree."""

    def start(self, request: RequestInfo) -> None:
        """Called once before a request's first step."""

    def plan(self, frontier: Frontier) -> LevelPlan:
        """Which candidates of this level to keep, and how many children each drafts."""

    def finalize(self, candidates: Candidates) -> torch.Tensor | None:
        """After the last level: an optional [m] keep mask over all candidates (None keeps the tree as is).

        Lets a policy rerank globally (EAGLE-2 keeps the best ``budget`` nodes by path probability). The
        drafter also drops any node whose parent is dropped, so the tree stays connected.
        """

    def observe(self, outcome: StepOutcome) -> None:
        """Called after each verified step."""


@runtime_checkable
class BatchSizing(Protocol):
    """A policy that sizes a batch's trees together. A batched target forward pads every row's tree to the
    largest, so a node past the others' sizes costs a token in every row: after drafting, the batch keeps at
    most ``batch_cap`` nodes per row, each row its best by ``node_values`` (``decoder.loop.batch``)."""

    def node_values(self) -> np.ndarray:
        """This step's candidates' values in candidate order, non-increasing from parent to child (0 where the
        policy pruned); empty when the step did not draft."""

    def batch_cap(self, values: list[np.ndarray]) -> int:
        """Nodes per row for the batch whose rows' ``node_values`` are ``values``."""


MAX_STATIC_NODES = 1024


@dataclass(frozen=True)
class StaticTree:
    """A fixed shape: every node at depth d < ``depth`` drafts the draft's top ``width`` children.

    ``StaticTree(width=2, depth=3)`` is the full binary tree of 2 + 4 + 8 nodes. ``branching`` gives a
    width per level instead, e.g. ``(4, 2, 1, 1)``: 4 root children, 2 under each, then single chains
    (4 + 8 + 8 + 8 nodes). The top-1 chain is always inside the tree.
    """

    width: int = 2
    depth: int = 3
    branching: tuple[int, ...] | None = None
    reads_draft_entropy: ClassVar[bool] = False  # the drafter may skip computing it

    def __post_init__(self) -> None:
        if self.branching is not None:
            object.__setattr__(self, "branching", tuple(int(b) for b in self.branching))
            object.__setattr__(self, "depth", len(self.branching))
            object.__setattr__(self, "width", max(self.branching, default=0))
        if self.width < 1 or self.depth < 1 or min(self.levels, default=0) < 1:
            raise TreewiseError(
                f"StaticTree needs width >= 1 and depth >= 1, got width={self.width}, depth={self.depth}"
                f"{', branching=' + str(self.branching) if self.branching else ''}; use Chain(length) for one path"
            )
        if self.nodes > MAX_STATIC_NODES:
            raise TreewiseError(
                f"StaticTree {self.levels} has {self.nodes} nodes (limit {MAX_STATIC_NODES}): narrow the deep "
                "levels with branching=(w1, w2, ...), e.g. (4, 2, 1, 1, 1, 1), or use a budgeted dynamic tree"
            )

    @property
    def levels(self) -> tuple[int, ...]:
        return self.branching if self.branching is not None else (self.width,) * self.depth

    @property
    def nodes(self) -> int:
        total, count = 0, 1
        for b in self.levels:
            count *= b
            total += count
        return total

    def start(self, request: RequestInfo) -> None:
        return None

    def plan(self, frontier: Frontier) -> LevelPlan:
        d = frontier.depth
        children = self.levels[d] if d < min(self.depth, frontier.max_depth) else 0
        return LevelPlan.uniform(frontier.size, children)

    def finalize(self, candidates: Candidates) -> torch.Tensor | None:
        return None

    def observe(self, outcome: StepOutcome) -> None:
        return None


@dataclass(frozen=True)
class Chain(StaticTree):
    """A single draft path of ``length`` tokens (``StaticTree(width=1, depth=length)``)."""

    length: int = 4
    width: int = field(default=1, init=False)
    depth: int = field(default=0, init=False)
    branching: tuple[int, ...] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        if self.length < 1:
            raise TreewiseError(f"Chain needs length >= 1, got {self.length}")
        object.__setattr__(self, "depth", self.length)
        super().__post_init__()


@dataclass(frozen=True)
class NoDraft:
    """Never drafts: every step is one plain target step through treewise's loop. A baseline that prices the
    loop itself (``treewise profile --tree none=none``, ``treewise bench --tree none=none``)."""

    reads_draft_entropy: ClassVar[bool] = False

    def start(self, request: RequestInfo) -> None:
        return None

    def plan(self, frontier: Frontier) -> LevelPlan:
        return LevelPlan.uniform(frontier.size, 0)

    def finalize(self, candidates: Candidates) -> torch.Tensor | None:
        return None

    def observe(self, outcome: StepOutcome) -> None:
        return None


def top_k_mask(scores: torch.Tensor, k: int) -> torch.Tensor:
    """[m] bool marking the k highest scores (all when m <= k)."""
    m = scores.numel()
    if m <= k:
        return torch.ones(m, dtype=torch.bool)
    keep = torch.zeros(m, dtype=torch.bool)
    keep[torch.topk(scores, k).indices] = True
    return keep
