"""Merging lookup candidates into a drafted tree: shared prefixes once, the draft's part untouched, depth bounded;
verification of merged trees exact in both sampling rules (a lookup node's source changes nothing)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treewise.decoder import Candidates, DraftResult, DraftTree, Sampling, VerifyInput, verify
from treewise.decoder.candidates.lookup import LookupTree
from treewise.decoder.candidates.merge import BOTH, DRAFT, LOOKUP, merge_lookup

V = 5


def _forest(draw: st.DrawFn, size: int) -> tuple[list[int], list[int]]:
    """Parents (-1: the root / the context) and tokens of ``size`` nodes, parents first."""
    parents = [draw(st.integers(-1, i - 1)) for i in range(size)]
    return parents, [draw(st.integers(0, V - 1)) for _ in range(size)]


def _drafted(parents: list[int], tokens: list[int]) -> DraftResult:
    """A DraftResult whose tree holds every candidate (tree index = candidate index + 1)."""
    tree = DraftTree.from_parents([-1] + [p + 1 for p in parents], [0, *tokens])
    m = len(tokens)
    lp = np.log(np.linspace(0.9, 0.1, m, dtype=np.float32)) if m else np.zeros(0, np.float32)
    cols = {"tokens": np.asarray(tokens, np.int64), "parent": np.asarray(parents, np.int64),
            "sibling_rank": np.zeros(m, np.int64), "draft_logprob": lp, "draft_entropy": np.ones(m, np.float32),
            "draft_margin": np.ones(m, np.float32), "path_logprob": lp.copy(),
            "parent_draft_prob": np.ones(m, np.float32), "depth": tree.depth.numpy()[1:].copy(),
            "tree_index": np.arange(1, m + 1, dtype=np.int64)}
    q = {0: torch.full((V,), 1.0 / V)}
    return DraftResult(tree, Candidates(cols), q, torch.arange(m + 1) - 1, 0.0, 0.0, 1)


def _lookup(parents: list[int], tokens: list[int]) -> LookupTree:
    """A lookup trie (distinct tokens under one parent, as LookupIndex builds them) from a random forest."""
    keep, seen, new = [], set(), {}
    for i, (p, t) in enumerate(zip(parents, tokens, strict=True)):
        if (p >= 0 and p not in new) or (new.get(p, -1), t) in seen:
            continue
        seen.add((new.get(p, -1), t))
        new[i] = len(keep)
        keep.append((new.get(p, -1), t))
    depth: list[int] = []
    for p, _ in keep:
        depth.append(1 if p < 0 else depth[p] + 1)
    arr = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    counts = arr([len(keep) - i for i in range(len(keep))])
    return LookupTree(arr([t for _, t in keep]), arr([p for p, _ in keep]), counts, arr(depth), 2, len(keep) + 1)


def _paths(parents: list[int], tokens: list[int]) -> list[tuple[int, ...]]:
    paths: list[tuple[int, ...]] = []
    for p, t in zip(parents, tokens, strict=True):
        paths.append((paths[p] if p >= 0 else ()) + (t,))
    return paths


@settings(max_examples=200, deadline=None)
@given(st.data(), st.integers(0, 8), st.integers(0, 10), st.integers(1, 4), st.sampled_from(["topk", "sampled"]))
def test_merge_properties(data: st.DataObject, n_draft: int, n_look: int, max_depth: int, mode: str) -> None:
    dr = _drafted(*_forest(data.draw, n_draft))
    look = _lookup(*_forest(data.draw, n_look))
    out = merge_lookup(dr, look, mode, max_depth)  # type: ignore[arg-type]
    tree, n = out.tree, dr.tree.size
    # The draft's part is untouched: tokens, parents, cache slots, distributions; new nodes are never fed.
    assert torch.equal(tree.tokens[:n], dr.tree.tokens) and torch.equal(tree.parents[:n], dr.tree.parents)
    assert torch.equal(out.fed_slot[:n], dr.fed_slot) and (out.fed_slot[n:] == -1).all()
    assert out.extra == tree.size - n and out.draft_probs is dr.draft_probs
    # A well-formed tree: the mask is the one DraftTree builds from the parents.
    ref = DraftTree.from_parents(tree.parents.tolist(), tree.tokens.tolist())
    assert torch.equal(ref.ancestor_mask, tree.ancestor_mask) and torch.equal(ref.depth, tree.depth)
    assert int(tree.depth.max()) <= max(max_depth, int(dr.tree.depth.max()))
    # Every path of either source (the lookup's cut at max_depth) is in the tree; nothing else is.
    merged = set(_paths([x - 1 for x in tree.parents.tolist()[1:]], tree.tokens.tolist()[1:]))
    draft = set(_paths([x - 1 for x in dr.tree.parents.tolist()[1:]], dr.tree.tokens.tolist()[1:]))
    wanted = {p for p in _paths(look.parents.tolist(), look.tokens.tolist()) if len(p) <= max_depth}
    assert merged == draft | wanted
    if mode == "topk":  # shared prefixes once: no two siblings carry one token from the lookup
        pairs = list(zip(tree.parents.tolist()[n:], tree.tokens.tolist()[n:], strict=True))
        old = set(zip(tree.parents.tolist()[1:n], tree.tokens.tolist()[1:n], strict=True))
        assert len(set(pairs)) == len(pairs) and not set(pairs) & old
    else:  # sampled: every lookup node is a node of its own
        assert tree.size - n == len(wanted)
    # Candidates describe the tree: each kept candidate's token and parent, its source.
    cols = out.candidates.columns
    t = cols["tree_index"]
    assert (tree.tokens[t].numpy() == cols["tokens"]).all()
    parent_tree = np.where(cols["parent"] >= 0, t[np.maximum(cols["parent"], 0)], 0)
    assert (tree.parents[t].numpy() == parent_tree).all()
    if out is not dr:
        source = cols["source"]
        assert (source[: len(dr.candidates.columns["tokens"])] != LOOKUP).all()
        assert (source[len(dr.candidates.columns["tokens"]):] == LOOKUP).all()
        assert ((source == DRAFT) == np.isnan(cols["lookup_prob"])).all()
        assert mode == "topk" or not (source == BOTH).any()


def _target(path: tuple[int, ...]) -> torch.Tensor:
    """The target's distribution after ``path``: one function of the tokens, as a real model's would be."""
    g = torch.Generator().manual_seed(hash(path) % (2**31))
    return torch.softmax(2.0 * torch.randn(V, generator=g), -1)


def _merged_tree(mode: str, g: torch.Generator) -> tuple[DraftResult, dict[int, torch.Tensor]]:
    """The draft: 2 root children (top-2 or i.i.d. from q), one child under the first; lookup: tokens 1 and 3
    under the root, 4 under 1."""
    q_root, q_child = torch.softmax(torch.tensor([0.5, 1.5, 0.2, -3.0, -3.0]), -1), torch.full((V,), 0.2)
    if mode == "topk":
        kids, grand = torch.topk(q_root, 2).indices.tolist(), [int(q_child.argmax())]
    else:
        kids = torch.multinomial(q_root, 2, replacement=True, generator=g).tolist()
        grand = torch.multinomial(q_child, 1, generator=g).tolist()
    dr = _drafted([-1, -1, 0], [*kids, *grand])
    dr = DraftResult(dr.tree, dr.candidates, {0: q_root, 1: q_child}, dr.fed_slot, 0.0, 0.0, 2)
    look = LookupTree(np.array([1, 3, 4]), np.array([-1, -1, 0]), np.array([2, 1, 2]), np.array([1, 1, 2]), 2, 3)
    return merge_lookup(dr, look, mode, 4), dr.draft_probs  # type: ignore[arg-type, return-value]


def _joint(mode: str, fixed: bool, n: int) -> float:
    """Total variation between the first two emitted tokens and the target's own joint distribution."""
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(V, V)
    for _ in range(n):
        dr, q = _merged_tree(mode, g)
        toks = dr.tree.tokens.tolist()
        paths = [()] + [tuple(toks[j] for j in dr.tree.path_to(i)[1:]) for i in range(1, dr.tree.size)]
        logits = torch.stack([torch.log(_target(p)) for p in paths])
        acc = verify(VerifyInput(dr.tree, logits, Sampling(temperature=1.0), mode, q, g,  # type: ignore[arg-type]
                                 dr.fixed_from if fixed else None))
        out = [toks[i] for i in acc.path[1:]] + [acc.bonus]
        if len(out) < 2:  # the bonus ended the step: draw the next token from the target, as the next step would
            out.append(int(torch.multinomial(_target((out[0],)), 1, generator=g)))
        counts[out[0], out[1]] += 1
    exact = torch.stack([_target(()) [a] * _target((a,)) for a in range(V)])
    return 0.5 * float((counts / n - exact).abs().sum())


@pytest.mark.parametrize("mode", ["topk", "sampled"])
def test_merged_trees_verify_exactly(mode: str) -> None:
    assert _joint(mode, fixed=True, n=12000) < 0.035


def test_sampled_rule_without_fixed_nodes_loses_exactness() -> None:
    # Lookup nodes judged as if they were i.i.d. draft samples: what the fixed-first rule prevents.
    assert _joint("sampled", fixed=False, n=3000) > 0.06


def test_suffix_store_leaves_out_the_same_prompt_and_keeps_its_latest_output() -> None:
    from treewise.decoder.candidates.lookup import LookupConfig, SuffixStore

    store = SuffixStore(LookupConfig(max_tokens=12))
    store.add("code", "a", [1, 2, 3, 4])
    assert store.propose("code", "a", [9, 2], 8, 4).size == 0  # its own earlier output: left out
    assert store.propose("code", "b", [9, 2], 8, 4).tokens.tolist() == [3, 4]  # another prompt's: found
    assert store.propose("math", "b", [9, 2], 8, 4).size == 0  # per domain
    store.add("code", "a", [1, 2, 5])  # the same prompt again: its latest output replaces the first
    assert store.propose("code", "b", [2], 8, 4).tokens.tolist() == [5]
    store.add("code", "c", [6, 7, 8, 9, 6, 7, 8, 9, 6, 7])  # past max_tokens: the oldest output goes
    assert store.tokens <= 12 and store.propose("code", "b", [2], 8, 4).size == 0
    assert SuffixStore(leave_out_same=False).propose("x", "a", [1], 4, 4).size == 0
    kept = SuffixStore(leave_out_same=False)
    kept.add("code", "a", [1, 2, 3])
    assert kept.propose("code", "a", [2], 4, 4).tokens.tolist() == [3]
