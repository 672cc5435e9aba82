"""Draft candidates that cost no forward: what followed earlier occurrences of the text's longest matching suffix.

A ``LookupIndex`` holds token documents (a request's prompt and output so far, and earlier outputs kept for
later requests) and maps every n-gram (``min_match <= n <= max_match``) to the positions that followed its
most recent occurrences. ``propose`` finds the longest suffix of a context that occurred before and grows a
tree of what followed it: a node's ``count`` is how many occurrences continue with its path, so its
empirical path probability is ``count / occurrences`` and its probability given its parent ``count /
count(parent)`` (the scores of SuffixDecoding, arXiv 2411.04975, and of prompt lookup, which is the chain
of a single occurrence). The tree keeps the most frequent paths, each node's parent before it.

Bounded memory: each n-gram keeps its ``max_positions`` latest occurrences, and once the documents hold more
than ``max_tokens`` tokens the oldest closed documents are dropped with every index entry that points at them.
An n-gram is indexed only once a token follows it, so a context never matches its own end.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from treewise.decoder.errors import TreewiseError

Position = tuple[int, int]  # (document id, index of the token that followed the n-gram)


@dataclass(frozen=True)
class LookupConfig:
    """Defaults of a lookup index and of the trees it proposes."""

    min_match: int = 1  # shortest suffix that counts as a match
    max_match: int = 4  # longest suffix looked up (and the longest n-gram indexed)
    max_positions: int = 32  # occurrences kept per n-gram, the latest
    max_tokens: int = 1 << 20  # tokens kept over all documents; the oldest closed documents go first
    max_nodes: int = 16  # nodes of a proposed tree
    max_depth: int = 8  # tokens of continuation followed from each occurrence

    def __post_init__(self) -> None:
        if not 1 <= self.min_match <= self.max_match:
            raise TreewiseError(f"lookup: need 1 <= min_match <= max_match, got {self.min_match} and "
                                f"{self.max_match}; set min_match to 1 and max_match to 4, say")
        for name in ("max_positions", "max_tokens", "max_nodes", "max_depth"):
            if getattr(self, name) < 1:
                raise TreewiseError(f"lookup: {name} must be at least 1, got {getattr(self, name)}")


@dataclass(frozen=True)
class LookupTree:
    """Candidate continuations of a context: node i is token ``tokens[i]`` under node ``parents[i]`` (-1: the
    context's last token), parents before children, most frequent first among siblings."""

    tokens: np.ndarray  # [n] int64
    parents: np.ndarray  # [n] int64, -1 or an earlier index
    counts: np.ndarray  # [n] int64 occurrences that continue with this node's path
    depth: np.ndarray  # [n] int64, 1 for children of the context
    match: int  # length of the matched suffix (0: no match, empty tree)
    occurrences: int  # occurrences of the matched suffix that were followed

    @property
    def size(self) -> int:
        return int(self.tokens.size)

    @property
    def path_prob(self) -> np.ndarray:
        """Empirical probability of each node's whole path: the share of occurrences that continue with it."""
        return self.counts / max(self.occurrences, 1)

    @property
    def prob(self) -> np.ndarray:
        """Empirical probability of each node given its parent."""
        above = np.where(self.parents >= 0, self.counts[np.maximum(self.parents, 0)], self.occurrences)
        return self.counts / np.maximum(above, 1)


def empty_tree() -> LookupTree:
    none = np.zeros(0, dtype=np.int64)
    return LookupTree(none, none, none, none, 0, 0)


class LookupIndex:
    """N-gram index over token documents; ``open`` one per request, ``extend`` it as tokens are committed,
    ``close`` it to keep it for later lookups (or ``drop`` it)."""

    def __init__(self, config: LookupConfig | None = None) -> None:
        self.config = config or LookupConfig()
        self._docs: OrderedDict[int, list[int]] = OrderedDict()  # oldest first
        self._open: set[int] = set()
        self._grams: dict[tuple[int, ...], deque[Position]] = {}
        self._next_id = 0
        self.tokens = 0  # tokens held over all documents

    def open(self, tokens: Sequence[int] = ()) -> int:
        """A new document (a request's prompt); returns its id."""
        doc = self._next_id
        self._next_id += 1
        self._docs[doc] = []
        self._open.add(doc)
        self.extend(doc, tokens)
        return doc

    def extend(self, doc: int, tokens: Sequence[int]) -> None:
        """Append tokens to an open document, indexing every n-gram the new tokens now follow."""
        if doc not in self._open:
            raise TreewiseError(f"lookup: document {doc} is not open; open() one per request before extend()")
        text, cfg = self._docs[doc], self.config
        for token in tokens:
            end = len(text)  # the n-grams ending just before ``token`` are followed by it
            for n in range(cfg.min_match, min(cfg.max_match, end) + 1):
                key = tuple(text[end - n : end])
                slot = self._grams.get(key)
                if slot is None:
                    slot = self._grams[key] = deque(maxlen=cfg.max_positions)
                slot.append((doc, end))
            text.append(int(token))
        self.tokens += len(tokens)
        self._evict()

    def close(self, doc: int) -> None:
        """Keep a finished document for later lookups (evicted oldest first past ``max_tokens``)."""
        self._open.discard(doc)
        self._evict()

    def drop(self, doc: int) -> None:
        """Forget a document and every index entry pointing at it."""
        text = self._docs.pop(doc, None)
        self._open.discard(doc)
        if text is None:
            return
        self.tokens -= len(text)
        cfg = self.config
        for end in range(1, len(text)):
            for n in range(cfg.min_match, min(cfg.max_match, end) + 1):
                key = tuple(text[end - n : end])
                slot = self._grams.get(key)
                if slot is None:
                    continue
                kept = [p for p in slot if p[0] != doc]
                if kept:
                    if len(kept) != len(slot):
                        self._grams[key] = deque(kept, maxlen=cfg.max_positions)
                else:
                    del self._grams[key]

    def _evict(self) -> None:
        while self.tokens > self.config.max_tokens:
            oldest = next((d for d in self._docs if d not in self._open), None)
            if oldest is None:
                return  # only open documents left: they stay whatever their size
            self.drop(oldest)

    @property
    def grams(self) -> int:
        """Distinct n-grams indexed (a memory measure)."""
        return len(self._grams)

    def propose(self, context: Sequence[int], max_nodes: int | None = None, max_depth: int | None = None,
                leave_out: int | None = None) -> LookupTree:
        """The tree of what followed the longest suffix of ``context`` seen before (empty if none was); occurrences
        in document ``leave_out`` do not count."""
        cfg = self.config
        max_nodes = cfg.max_nodes if max_nodes is None else max_nodes
        max_depth = cfg.max_depth if max_depth is None else max_depth
        if max_nodes < 1 or max_depth < 1:
            return empty_tree()
        for n in range(min(cfg.max_match, len(context)), cfg.min_match - 1, -1):
            slot = self._grams.get(tuple(int(t) for t in context[len(context) - n :]))
            where = [p for p in slot if p[0] != leave_out] if slot else []
            if where:
                return self._grow(where, n, max_nodes, max_depth)
        return empty_tree()

    def _grow(self, where: list[Position], match: int, max_nodes: int, max_depth: int) -> LookupTree:
        # A trie of every occurrence's continuation: (parent, token) -> node; counts in first-seen order.
        child: dict[tuple[int, int], int] = {}
        parent_of: list[int] = []
        token_of: list[int] = []
        counts: list[int] = []
        depth_of: list[int] = []
        for doc, start in reversed(where):  # latest first: ties among siblings go to the most recent
            text, node = self._docs[doc], -1
            for i in range(start, min(start + max_depth, len(text))):
                key = (node, text[i])
                nxt = child.get(key)
                if nxt is None:
                    nxt = child[key] = len(token_of)
                    parent_of.append(node)
                    token_of.append(text[i])
                    counts.append(0)
                    depth_of.append(depth_of[node] + 1 if node >= 0 else 1)
                counts[nxt] += 1
                node = nxt
        # The most frequent paths: a child never outcounts its parent, and ties go to the shallower, then the
        # earlier-seen node (created after its parent), so every kept node's parent is kept and comes first.
        keep = sorted(range(len(token_of)), key=lambda i: (-counts[i], depth_of[i], i))[:max_nodes]
        keep.sort(key=lambda i: (depth_of[i], -counts[i], i))
        new = {old: j for j, old in enumerate(keep)}
        return LookupTree(
            tokens=np.array([token_of[i] for i in keep], dtype=np.int64),
            parents=np.array([new[parent_of[i]] if parent_of[i] >= 0 else -1 for i in keep], dtype=np.int64),
            counts=np.array([counts[i] for i in keep], dtype=np.int64),
            depth=np.array([depth_of[i] for i in keep], dtype=np.int64),
            match=match, occurrences=len(where))


class SuffixStore:
    """Earlier requests' outputs, one ``LookupIndex`` per domain, shared by every request that holds this store
    (the cross-request source of SuffixDecoding): a finished request's output is kept as a closed document,
    the oldest evicted past ``LookupConfig.max_tokens`` per domain.

    Outputs are keyed by their prompt: a prompt's latest output replaces its earlier one, and with
    ``leave_out_same=True`` (the default) a request never looks up outputs of its own prompt, so a benchmark
    that repeats prompts measures what other requests' outputs give (a server whose users repeat requests
    word for word may set it False and copy their earlier answers)."""

    def __init__(self, config: LookupConfig | None = None, leave_out_same: bool = True) -> None:
        self.config = config or LookupConfig()
        self.leave_out_same = leave_out_same
        self._by_domain: dict[str, LookupIndex] = {}
        self._doc_of: dict[tuple[str, str], int] = {}  # (domain, prompt key) -> its latest output's document

    def index(self, domain: str) -> LookupIndex:
        found = self._by_domain.get(domain)
        if found is None:
            found = self._by_domain[domain] = LookupIndex(self.config)
        return found

    def add(self, domain: str, key: str, tokens: Sequence[int]) -> None:
        """Keep one finished output of the prompt ``key`` for later requests of ``domain``."""
        index = self.index(domain)
        old = self._doc_of.pop((domain, key), None)
        if old is not None:
            index.drop(old)
        if len(tokens):
            doc = self._doc_of[(domain, key)] = index.open(tokens)
            index.close(doc)

    def propose(self, domain: str, key: str, context: Sequence[int], max_nodes: int, max_depth: int) -> LookupTree:
        leave_out = self._doc_of.get((domain, key)) if self.leave_out_same else None
        return self.index(domain).propose(context, max_nodes, max_depth, leave_out)

    @property
    def tokens(self) -> int:
        return sum(index.tokens for index in self._by_domain.values())


class LookupSource:
    """One request's free candidates: its own prompt and output so far and, with a ``store``, earlier requests'
    outputs of its domain. ``propose`` indexes the tokens committed since its last call, then returns the tree
    of the longer match of the two (the request's own on a tie)."""

    def __init__(self, config: LookupConfig, store: SuffixStore | None, domain: str, key: str,
                 prompt_len: int) -> None:
        self.own = LookupIndex(config)
        self.doc = self.own.open()
        self.store, self.domain, self.key, self.prompt_len = store, domain, key, prompt_len
        self.seen: list[int] = []  # the tokens indexed so far (the request's sequence)

    def propose(self, seq: Sequence[int], max_nodes: int, max_depth: int) -> LookupTree:
        new = [int(t) for t in seq[len(self.seen):]]
        if new:
            self.own.extend(self.doc, new)
            self.seen.extend(new)
        tree = self.own.propose(self.seen, max_nodes, max_depth)
        if self.store is not None:
            shared = self.store.propose(self.domain, self.key, self.seen, max_nodes, max_depth)
            if shared.match > tree.match:
                tree = shared
        return tree

    def end(self, seq: Sequence[int]) -> None:
        """The request finished with ``seq`` (prompt and output): its output joins the store for later requests."""
        if self.store is not None:
            self.store.add(self.domain, self.key, [int(t) for t in seq[self.prompt_len:]])
        self.own.drop(self.doc)
