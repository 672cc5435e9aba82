"""The lookup index against a brute-force search: longest match, continuation counts, bounds on memory."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from treewise.decoder.candidates.lookup import LookupConfig, LookupIndex, LookupTree
from treewise.decoder.errors import TreewiseError

tokens = st.lists(st.integers(0, 3), min_size=0, max_size=40)  # a small vocabulary: many repeats


def _paths(tree: LookupTree) -> dict[tuple[int, ...], int]:
    paths: list[tuple[int, ...]] = []
    for tok, parent in zip(tree.tokens.tolist(), tree.parents.tolist(), strict=True):
        assert parent < len(paths)  # parents come first
        paths.append((paths[parent] if parent >= 0 else ()) + (tok,))
    return dict(zip(paths, tree.counts.tolist(), strict=True))


def _reference(docs: list[list[int]], context: list[int], cfg: LookupConfig) -> tuple[int, int, Counter]:
    """Longest matched suffix, its followed occurrences, and the count of every continuation path."""
    for n in range(min(cfg.max_match, len(context)), cfg.min_match - 1, -1):
        suffix = context[len(context) - n :]
        where = [(d, e) for d, doc in enumerate(docs) for e in range(n, len(doc)) if doc[e - n : e] == suffix]
        if where:
            paths: Counter = Counter()
            for d, e in where:
                for k in range(1, cfg.max_depth + 1):
                    if e + k <= len(docs[d]):
                        paths[tuple(docs[d][e : e + k])] += 1
            return n, len(where), paths
    return 0, 0, Counter()


@settings(max_examples=150, deadline=None)
@given(earlier=st.lists(tokens, max_size=3), live=tokens, max_match=st.integers(1, 4), min_match=st.integers(1, 4),
       max_depth=st.integers(1, 6))
def test_propose_matches_brute_force(earlier: list[list[int]], live: list[int], max_match: int, min_match: int,
                                     max_depth: int) -> None:
    cfg = LookupConfig(min_match=min(min_match, max_match), max_match=max_match, max_depth=max_depth,
                       max_positions=10_000, max_nodes=10_000)
    index = LookupIndex(cfg)
    for doc in earlier:
        index.close(index.open(doc))
    index.open(live)  # the request's own text: its last n-grams are followed by nothing yet
    tree = index.propose(live)
    match, occurrences, paths = _reference([*earlier, live], live, cfg)
    assert (tree.match, tree.occurrences) == (match, occurrences)
    assert _paths(tree) == dict(paths)
    assert (tree.depth == [len(p) for p in _paths(tree)]).all()
    if tree.size:
        assert tree.path_prob.max() <= 1.0 and (tree.prob > 0).all() and (tree.prob <= 1).all()


@settings(max_examples=100, deadline=None)
@given(earlier=st.lists(tokens, min_size=1, max_size=3), live=tokens, max_nodes=st.integers(1, 8))
def test_cut_tree_keeps_the_most_frequent_closed_paths(earlier: list[list[int]], live: list[int],
                                                       max_nodes: int) -> None:
    index = LookupIndex(LookupConfig(max_positions=10_000))
    for doc in earlier:
        index.close(index.open(doc))
    index.open(live)
    full, cut = index.propose(live, max_nodes=10_000), index.propose(live, max_nodes=max_nodes)
    kept, every = _paths(cut), _paths(full)
    assert cut.size == min(max_nodes, full.size)
    assert all(every[p] == c for p, c in kept.items())  # counts unchanged by the cut
    assert all(p[:-1] in kept for p in kept if len(p) > 1)  # parent-closed
    dropped = [c for p, c in every.items() if p not in kept]
    assert not dropped or min(kept.values()) >= max(dropped)


def test_longest_match_wins_and_prompt_lookup_copies() -> None:
    index = LookupIndex(LookupConfig(max_depth=3))
    doc = index.open([5, 1, 2, 9, 9, 7, 1, 2, 3, 4, 0])
    index.extend(doc, [7, 1, 2])  # "7 1 2" occurred once, followed by 3 4 0; "1 2" also by 9 9 7
    tree = index.propose([7, 1, 2])
    assert tree.match == 3 and tree.occurrences == 1
    assert tree.tokens.tolist() == [3, 4, 0] and tree.parents.tolist() == [-1, 0, 1]
    shorter = index.propose([8, 1, 2])  # only "1 2" matches: two continuations, the latest first on a tie
    assert shorter.match == 2 and sorted(shorter.tokens[shorter.parents == -1].tolist()) == [3, 9]
    assert shorter.tokens[0] == 3


def test_no_match_gives_an_empty_tree() -> None:
    index = LookupIndex()
    index.open([1, 2, 3])
    assert index.propose([1, 2, 3]).size == 0  # its own end is followed by nothing
    assert index.propose([]).size == 0 and index.propose([7]).match == 0


def test_positions_per_ngram_are_bounded_latest_kept() -> None:
    index = LookupIndex(LookupConfig(max_positions=4, max_match=1, max_depth=1))
    doc = index.open([1, 0, 1, 0, 1, 0, 1, 2, 1, 3, 1, 4, 1])
    tree = index.propose([1])
    assert tree.occurrences == 4  # the last four occurrences of "1"
    assert sorted(tree.tokens.tolist()) == [0, 2, 3, 4]
    index.extend(doc, [5])
    assert 0 not in index.propose([1]).tokens.tolist()


def test_memory_bound_evicts_the_oldest_closed_documents() -> None:
    cfg = LookupConfig(max_tokens=10)
    index = LookupIndex(cfg)
    docs = [[1, 2, 3, 4], [2, 3, 5, 6], [7, 8, 9, 1]]
    ids = []
    for d in docs:
        ids.append(index.open(d))
        index.close(ids[-1])
    assert index.tokens == 8 and ids[0] not in index._docs  # 12 > 10: the oldest closed document went
    live = index.open([3, 5])  # 10 tokens: the bound holds
    fresh = LookupIndex(cfg)
    for d in docs[1:]:
        fresh.close(fresh.open(d))
    fresh.open([3, 5])
    assert index.grams == fresh.grams
    assert _paths(index.propose([2, 3])) == _paths(fresh.propose([2, 3])) == {(5,): 1, (5, 6): 1}
    index.extend(live, list(range(20)))  # open documents stay whatever their size; closed ones go first
    assert live in index._docs and ids[1] not in index._docs and ids[2] not in index._docs


def test_bad_settings_and_closed_documents_are_refused() -> None:
    with pytest.raises(TreewiseError, match="min_match"):
        LookupConfig(min_match=3, max_match=2)
    with pytest.raises(TreewiseError, match="max_nodes"):
        LookupConfig(max_nodes=0)
    index = LookupIndex()
    doc = index.open([1, 2])
    index.close(doc)
    with pytest.raises(TreewiseError, match="not open"):
        index.extend(doc, [3])
