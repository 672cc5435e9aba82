"""A named model pair resolved to folders a decoder loads: ``--pair`` with ``--target``/``--draft`` overriding.

The registry (names, draft folders, chat framing, data files) is ``controller.pairs``; this module adds what only
the studies do: fetching the real target on first use (``studies.shared.fetch``, then found in the cache) and
checking the folders before anything is downloaded or loaded. Imports the decoder (torch): commands import it
when they run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from treewise.controller import HostProfile, host_profile, priced_by
from treewise.controller.pairs import PairFiles, pair_files, pair_spec
from treewise.decoder import TreeDecoder, TreePolicy, TreewiseError
from treewise.decoder.paths import data_dir

from .fetch import SOURCES, cache_root, fetch
from .paths import OWN_PAIR_POLICY, PAIR_POLICIES
from .treespec import build_tree

_log = logging.getLogger("treewise")


@dataclass(frozen=True)
class ResolvedPair:
    """The pair a command decodes with: its name, model folders (or hub ids), framing and data files."""

    name: str
    target: str
    draft: str
    chat: bool
    files: PairFiles


def resolve_pair(name: str | None = None, target: str | Path | None = None, draft: str | Path | None = None,
                 on_stage: Callable[[str], None] | None = None) -> ResolvedPair:
    """The pair ``name`` (None: ``$TREEWISE_PAIR``, else smollm2) with ``target``/``draft`` overriding its folders.

    The draft is checked first, so a missing one fails before the real target is fetched; a fetched target is
    converted once and then found in the cache (``on_stage`` hears the fetch's stages)."""
    spec = pair_spec(name)
    draft_path = str(draft) if draft is not None else str(spec.draft_dir())
    if draft is None and not Path(draft_path).is_dir():
        if spec.name == "micro":
            raise _no_micro(Path(draft_path).parent)
        raise TreewiseError(f"the {spec.name} pair has no draft at {draft_path}: run `treewise pair train-draft` "
                            f"(it trains one into that folder), pass --draft DIR, or use --pair micro")
    if target is not None:
        target_path = str(target)
    elif spec.source is not None:
        target_path = str(fetch(SOURCES[spec.source], on_stage=on_stage))
    else:
        target_path = str(data_dir() / (spec.target or "models/target"))
        if not Path(target_path).is_dir():
            raise _no_micro(Path(target_path).parent)
    return ResolvedPair(spec.name, target_path, draft_path, spec.chat, pair_files(spec.name))


def _no_micro(models: Path) -> TreewiseError:
    return TreewiseError(f"no model pair under {models}: run `treewise train-pair` (it builds the embedded pair), "
                         "set TREEWISE_DATA, or pass --target and --draft (a Hugging Face id or folder each)")


def load_pair_decoder(pair: ResolvedPair, device: str | None = None, precision: str | None = None) -> TreeDecoder:
    """Load ``pair``'s models; a chat pair's decoder frames text prompts by the target's chat template."""
    return TreeDecoder.from_pretrained(pair.target, pair.draft, device=device, chat=pair.chat, precision=precision)


def host_curve(dec: TreeDecoder, pair: ResolvedPair, remeasure: bool = False) -> HostProfile:
    """``pair``'s cost curve on this host (``controller.host.host_profile``), cached per host in the user cache
    (``hosts/``), its shipped ``latency.json`` the one that counts on its own host kind."""
    return host_profile(dec, cache_root() / "hosts", pair.files.latency, remeasure=remeasure)


def parameter_count(model: object) -> int:
    """Distinct parameters of a loaded model (tied embeddings counted once)."""
    params = {id(p): p.numel() for p in model.parameters()}  # type: ignore[attr-defined]
    return int(sum(params.values()))


def load(pair: str | None = None, *, target: str | Path | None = None, draft: str | Path | None = None,
         policy: str | TreePolicy | None = None, device: str | None = None, chat: bool | None = None,
         on_stage: Callable[[str], None] | None = None, host: bool = True,
         precision: str | None = None) -> TreeDecoder:
    """A decoder whose ``generate()`` adapts by default: ``treewise.load()`` is the real pair (smollm2, its target
    fetched and converted on first use) with its shipped policy, the one ``treewise demo`` runs, each prompt's
    domain detected (``domain="auto"``).

    ``pair``: a registered pair (None: ``$TREEWISE_PAIR``, else smollm2); ``target``/``draft`` (a Hugging Face id
    or folder each) override its models, and given both without ``pair`` they are a pair of your own, decoded
    with EAGLE-2's confidence tree, which reads no shipped files. ``policy``: a tree spec (e.g.
    "static:width=2,depth=3") or a ``TreePolicy`` instead. ``chat``: frame text prompts by the target's chat
    template (None: the named pair's setting; off for a pair of your own). ``on_stage`` hears the first fetch's
    stages (default: the "treewise" logger, at INFO). ``host``: the policy prices trees by the cost curve of
    this host (``controller.host``: measured once per host kind, a few seconds, then cached; the pair's shipped
    curve where it was measured on this host kind); off: by the shipped curve. ``precision``: "exact" (float32,
    the default on CPU) or "fast" (bfloat16 where the hardware has it; ``TreeDecoder.from_pretrained``)."""
    if pair is None and target is not None and draft is not None:
        spec, tree = _policy(policy, OWN_PAIR_POLICY, None)
        dec = TreeDecoder.from_pretrained(target, draft, device=device, chat=bool(chat), precision=precision)
        return dec.with_policy(tree, spec)
    resolved = resolve_pair(pair, target, draft, on_stage=on_stage or _log.info)
    spec, tree = _policy(policy, PAIR_POLICIES[resolved.name], resolved.name)  # fails before a model loads
    dec = TreeDecoder.from_pretrained(resolved.target, resolved.draft, device=device,
                                      chat=resolved.chat if chat is None else chat, precision=precision)
    if host:
        found = host_curve(dec, resolved)
        _log.info(found.line())
        tree = priced_by(tree, found.profile)
    return dec.with_policy(tree, spec, domain="auto")


def _policy(given: str | TreePolicy | None, shipped: str, pair: str | None) -> tuple[str | None, TreePolicy]:
    """The policy ``load`` installs and the name results report (None: the policy's class name)."""
    if given is not None and not isinstance(given, str):
        return None, given
    spec = given or shipped
    return spec, build_tree(spec, pair)
