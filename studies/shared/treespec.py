"""Tree specs on the command line: ``KIND:key=value,...`` -> a decoder tree policy.

Kinds register themselves with ``register_tree_kind`` so later stages (the controller's
``confidence:...`` and ``learned:...``) add their own without touching this parser.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from treewise.controller import (
    BudgetedTree,
    BudgetsFile,
    ConfidenceTree,
    DomainBudget,
    DynamicChain,
    Hybrid,
    LearnedTree,
    load_budgets,
)
from treewise.decoder import Chain, NoDraft, StaticTree, TreePolicy, TreewiseError

from .config import given  # the parameters a spec named (the parser fills the others with None)


class TreeSpecError(TreewiseError):
    """A --tree value that cannot be parsed; the message says the expected syntax."""


@dataclass(frozen=True)
class Param:
    type: type  # int, float, str, bool, or Levels (dash-separated ints: 4-2-1)
    required: bool = False
    default: Any = None  # None: left out of the policy's arguments and of the canonical spec
    help: str = ""


class Levels(tuple):
    """A per-level int list written with dashes, since commas separate parameters: ``4-2-1-1``."""

    def __new__(cls, text: str) -> Levels:
        return super().__new__(cls, (int(x) for x in str(text).split("-")))

    def __str__(self) -> str:
        return "-".join(str(x) for x in self)


@dataclass(frozen=True)
class TreeKind:
    name: str
    build: Callable[..., TreePolicy]
    params: dict[str, Param]
    help: str = ""
    uses_pair: bool = False  # ``build`` takes ``pair=``: the policy reads that model pair's data files

    @property
    def syntax(self) -> str:
        keys = ",".join(f"{k}={p.type.__name__.upper()}" for k, p in self.params.items())
        return f"{self.name}:{keys}" if keys else self.name


_KINDS: dict[str, TreeKind] = {}


def register_tree_kind(kind: TreeKind) -> None:
    """Make ``kind`` parseable; a later registration under the same name replaces the earlier one."""
    _KINDS[kind.name] = kind


def tree_kinds() -> dict[str, TreeKind]:
    return dict(_KINDS)


@dataclass(frozen=True)
class TreeSpec:
    """A parsed spec: kind name plus typed parameter values (defaults filled in)."""

    kind: str
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def canonical(self) -> str:
        """The spec with every parameter, in declaration order: stable across spellings."""
        named = given(self.params)
        return f"{self.kind}:" + ",".join(f"{k}={v}" for k, v in named.items()) if named else self.kind

    def build(self, pair: str | None = None) -> TreePolicy:
        """The policy; a kind that reads data files (learned, budgeted) reads model ``pair``'s (None: the default
        pair, ``controller.pairs``)."""
        kind = _KINDS[self.kind]
        try:
            return kind.build(**self.params, **({"pair": pair} if kind.uses_pair else {}))
        except TreeSpecError:
            raise
        except TreewiseError as err:  # the policy's own check (too many nodes, width 0): name the spec
            raise TreeSpecError(f"tree spec {self.canonical}: {err} (on the command line: "
                                f"{_KINDS[self.kind].syntax})") from None


def _known() -> str:
    return "; ".join(k.syntax for k in _KINDS.values())


def _convert(kind: TreeKind, key: str, raw: str) -> Any:
    want = kind.params[key].type
    try:
        if want is bool:
            if raw.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(raw)
            return raw.lower() in ("true", "1", "yes")
        return want(raw)
    except ValueError:
        raise TreeSpecError(
            f"tree spec {kind.name}: {key}={raw!r} is not of type {want.__name__.lower()}; use {kind.syntax}"
        ) from None


def parse_tree_spec(text: str) -> TreeSpec:
    """Parse ``KIND:key=value,...`` (for example ``static:width=2,depth=3``, ``chain:length=4``)."""
    name, _, rest = text.strip().partition(":")
    kind = _KINDS.get(name.strip())
    if kind is None:
        raise TreeSpecError(f"unknown tree kind {name!r} in {text!r}: use one of {_known()}")
    written: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, raw = item.partition("=")
        key = key.strip()
        if not eq or not raw.strip():
            raise TreeSpecError(f"tree spec {text!r}: {item!r} is not key=value; use {kind.syntax}")
        if key not in kind.params:
            raise TreeSpecError(f"tree spec {text!r}: unknown parameter {key!r}; use {kind.syntax}")
        if key in written:
            raise TreeSpecError(f"tree spec {text!r}: {key!r} given twice")
        written[key] = _convert(kind, key, raw.strip())
    params = {}
    for key, param in kind.params.items():
        if key not in written and param.required:
            raise TreeSpecError(f"tree spec {text!r}: missing {key}=...; use {kind.syntax}")
        params[key] = written.get(key, param.default)
    return TreeSpec(kind.name, params)


def build_tree(text: str, pair: str | None = None) -> TreePolicy:
    """Parse and build in one go (for model ``pair``, see ``TreeSpec.build``); a bad value (width=0) fails here,
    before any model is loaded."""
    return parse_tree_spec(text).build(pair)


def _static(width: int | None, depth: int | None, branching: Levels | None,
            lookup: bool | None = None) -> TreePolicy:
    if branching is not None:
        if width is not None or depth is not None:
            raise TreeSpecError("tree spec static: give width=W,depth=D or branching=W1-W2-..., not both")
        tree = StaticTree(branching=tuple(branching))
    elif width is None or depth is None:
        raise TreeSpecError("tree spec static: missing width or depth; use static:width=W,depth=D or "
                            "static:branching=W1-W2-... (children per node at each level)")
    else:
        tree = StaticTree(width=width, depth=depth)
    if not lookup:
        return tree
    # For node logs of both sources (``treewise collect``): every step drafts, every valued lookup node joins.
    from treewise.decoder.candidates.lookup import LookupConfig, SuffixStore

    config = LookupConfig(max_nodes=16, max_depth=8)
    return Hybrid(tree, config, SuffixStore(config), skip_gain=float("inf"))


register_tree_kind(TreeKind(
    "static", _static,
    {"width": Param(int, help="children per node"), "depth": Param(int, help="levels"),
     "branching": Param(Levels, help="children per node at each level, e.g. 4-2-1-1-1-1"),
     "lookup": Param(bool, help="also suffix-lookup candidates, every step (node logs of both sources)")},
    help="full top-k tree: every node drafts the draft's top `width` children, `depth` levels",
))
register_tree_kind(TreeKind(
    "chain", lambda length: Chain(length=length), {"length": Param(int, required=True, help="draft tokens")},
    help="a single draft path",
))
register_tree_kind(TreeKind(
    "none", lambda: NoDraft(), {},
    help="no drafting: plain target steps through treewise's own loop (prices the loop against generate)",
))


def _confidence(**params: Any) -> TreePolicy:
    return ConfidenceTree(**given(params))


def _dynamic_chain(**params: Any) -> TreePolicy:
    return DynamicChain(**given(params))


def _learned(online: bool | None = None, budgets: str | None = None,
             native: bool | None = None, predictor: str | None = None, pair: str | None = None,
             batch_aware: bool | None = None, measured: bool | None = None, lookup: bool | None = None,
             **params: Any) -> TreePolicy:
    """The shipped LearnedTree; ``budgets`` reads another budgets file (e.g. a ``treewise tune --family learned``
    result), ``predictor`` another predictor folder (e.g. another pair's, to measure what training on this
    pair's logs buys); any budget field given overrides the budgets for every domain; ``online=false`` turns the
    per-request correction off, ``native=false`` the compiled
    level off (the Python path, for A/B runs), ``batch_aware=false`` the batch's cost model off (trees sized as
    if each row decoded alone), ``measured=false`` the correction of the cost model by measured step times off."""
    policy = LearnedTree.default(online=online is not False, pair=pair)
    policy.native = native is not False
    policy.batch_aware = batch_aware is not False
    policy.measured = measured is not False
    if budgets is not None:
        policy.budgets = load_budgets(budgets)
    if predictor is not None:
        from treewise.predictor import AcceptancePredictor

        policy.predictor = AcceptancePredictor.load(Path(predictor))
    if overrides := given(params):
        policy.budgets = BudgetsFile(default=DomainBudget(policy="learned", **overrides))
    return _with_lookup(policy, True, pair) if lookup else policy


_LOOKUP_PARAMS = {
    "max_nodes": Param(int, help="lookup nodes per step at most (default 16)"),
    "min_value": Param(float, help="lookup nodes valued below this stay out (default 0.15)"),
    "skip_gain": Param(float, help="expected lookup tokens at which a step skips the draft model (default 2)"),
    "prior": Param(float, help="pseudo-occurrences shrinking a lookup node's path probability (default 1)"),
    "max_depth": Param(int, help="tokens of continuation followed from each occurrence (default 8)"),
}


def _with_lookup(inner: TreePolicy, store: bool, pair: str | None, max_nodes: int | None = None,
                 max_depth: int | None = None, **params: Any) -> Hybrid:
    """``inner`` plus lookup candidates priced by the pair's latency profile; ``store``: also earlier requests'
    outputs (a store shared by every request this policy decodes)."""
    from treewise.controller.learned import PairData
    from treewise.decoder.candidates.lookup import LookupConfig, SuffixStore

    lookup = LookupConfig(max_nodes=max_nodes or 16, max_depth=max_depth or 8)
    return Hybrid(inner, lookup, SuffixStore(lookup) if store else None, PairData.load(pair).latency,
                  **given(params))


register_tree_kind(TreeKind(
    "lookup", lambda pair=None, **p: _with_lookup(NoDraft(), False, pair, **p), dict(_LOOKUP_PARAMS),
    help="prompt lookup: candidates from what followed the text's longest earlier match in the request's own "
         "prompt and output, no draft model", uses_pair=True,
))
register_tree_kind(TreeKind(
    "suffix", lambda pair=None, **p: _with_lookup(NoDraft(), True, pair, **p), dict(_LOOKUP_PARAMS),
    help="suffix lookup: the request's own text and earlier requests' outputs of its domain, no draft model",
    uses_pair=True,
))
register_tree_kind(TreeKind(
    "hybrid", lambda pair=None, store=None, **p: _with_lookup(LearnedTree.default(pair=pair), store is not False,
                                                              pair, **p),
    {**_LOOKUP_PARAMS, "store": Param(bool, help="also earlier requests' outputs (default true)")},
    help="LearnedTree's drafted tree merged with suffix-lookup candidates; the draft model sits out steps the "
         "lookup covers", uses_pair=True,
))


def _budgeted(pair: str | None = None) -> TreePolicy:
    return BudgetedTree.default(pair=pair)


register_tree_kind(TreeKind(
    "confidence", _confidence,
    {"budget": Param(int, help="nodes kept"), "max_depth": Param(int, help="levels"),
     "top_k": Param(int, help="nodes expanded per level and children per node")},
    help="EAGLE-2: expand the top_k nodes per level by path probability, keep the best `budget` nodes",
))
register_tree_kind(TreeKind(
    "dynamic_chain", _dynamic_chain,
    {"max_length": Param(int, help="longest chain"), "threshold": Param(float, help="initial confidence threshold")},
    help="HF dynamic lookahead: a chain cut where the draft's confidence falls under an online-refit threshold",
))
register_tree_kind(TreeKind(
    "learned", _learned,
    {name: Param(kind, help=f"override the budgets' {name}") for name, kind in (
        ("node_budget", int), ("max_depth", int), ("max_width", int), ("threshold", float), ("cost_scale", float))}
    | {"online": Param(bool, help="per-request online correction of the predictor (default true)"),
       "native": Param(bool, help="each level as one compiled call where numba is installed (default true)"),
       "batch_aware": Param(bool, help="in a batch, size trees by the batch's cost model (default true)"),
       "measured": Param(bool, help="correct the cost model by the step times the request measures (default true)"),
       "budgets": Param(str, help="budgets file to read instead of the pair's budgets.json"),
       "lookup": Param(bool, help="merge suffix-lookup candidates into the tree (the hybrid kind; default false)"),
       "predictor": Param(str, help="predictor folder to read instead of the pair's")},
    help="LearnedTree with the model pair's predictor, budgets and latency profile (controller.pairs.pair_files)",
    uses_pair=True,
))
register_tree_kind(TreeKind(
    "budgeted", _budgeted, {},
    help="per domain, the policy family and size the pair's budgets.json names (domain='auto' classifies the "
         "prompt)", uses_pair=True,
))
