"""The drafter's native calls (``decoder.kernels.native``) against the code they replace: the children kernel against
the numpy path's columns, ``expand`` and ``tree_arrays`` compiled against themselves as plain Python and
against ``DraftTree.from_parents``, and whole decodes with and without the native children."""

import numpy as np
import pytest
import torch
from conftest import make_model

import treewise.decoder.draft as draft
from treewise.decoder import StaticTree, TreeDecoder
from treewise.decoder.draft import _children, _Expanded
from treewise.decoder.kernels.native import (
    FLOAT_COLUMNS,
    INT_COLUMNS,
    expand,
    expander,
    kernel,
    tree_arrays,
    tree_builder,
)
from treewise.decoder.tree import DraftTree

numba = pytest.importorskip("numba")


def _expanded(logits: torch.Tensor, counts: list[int]) -> _Expanded:
    e = logits.shape[0]
    probs = torch.softmax(logits, -1)
    c = np.asarray(counts, dtype=np.int64)
    return _Expanded(probs, np.ascontiguousarray(logits.numpy()), c, int(c.max()), bool((c == c.max()).all()),
                     np.arange(e) + 3, np.arange(e), np.linspace(-2, 0, e).astype(np.float32),
                     np.linspace(0.2, 0.9, e).astype(np.float32))


@pytest.mark.parametrize("counts", [[4], [3, 3, 3], [2, 0, 4, 1], [1, 1, 1, 1, 1, 1]])
@pytest.mark.parametrize("entropy", [True, False])
def test_native_children_match_the_numpy_path(counts: list[int], entropy: bool) -> None:
    g = torch.Generator().manual_seed(len(counts))
    e, v = len(counts), 6144
    logits = torch.randn(e, v, generator=g) * 3
    logits[0, 11] += 15.0  # a peaked row: most 32-token blocks are skipped by the scan
    if e > 1:
        logits[1, 200:] = float("-inf")  # a cut row: its entropy takes the direct sum
    exp = _expanded(logits, counts)
    ref = _children(exp, "topk", None, entropy)
    got = _children(exp, "topk", None, entropy, kernel())
    assert list(got) == list(ref)  # same columns, same order
    for name in INT_COLUMNS:
        np.testing.assert_array_equal(got[name], ref[name], err_msg=name)
    for name in FLOAT_COLUMNS:
        assert got[name].dtype == ref[name].dtype == np.float32
        np.testing.assert_allclose(got[name], ref[name], rtol=1e-6, atol=1e-6, err_msg=name)
    if not entropy:
        assert np.isnan(got["draft_entropy"]).all()


def test_native_entropy_is_the_float64_entropy() -> None:
    g = torch.Generator().manual_seed(1)
    for scale in (1.0, 3.0, 10.0):
        logits = torch.randn(5, 6144, generator=g) * scale
        p = torch.softmax(logits, -1).double()
        reference = -(p * torch.log(p.clamp_min(1e-300))).sum(-1).numpy()
        got = _children(_expanded(logits, [2] * 5), "topk", None, True, kernel())["draft_entropy"][::2]
        np.testing.assert_allclose(got, reference, rtol=1e-6, atol=1e-6)


def _plan_case(seed: int) -> tuple:
    rng = np.random.default_rng(seed)
    e_prev, m = 3, 9
    f = 5
    fed_anc = np.zeros((32, 32), dtype=bool)
    fed_anc[:f, :f] = np.tril(rng.random((f, f)) < 0.5) | np.eye(f, dtype=bool)
    keep = rng.random(m) < 0.7
    children = np.where(rng.random(m) < 0.6, rng.integers(1, 4, m), 0)
    level_row = np.sort(rng.integers(0, e_prev, m))
    tokens = rng.integers(0, 100, m)
    logprob, path_lp = np.log(rng.random(m)).astype(np.float32), -rng.random(m).astype(np.float32)
    parent_slot = np.array([-1, 2, 4])
    return keep, children, level_row, tokens, logprob, path_lp, parent_slot, fed_anc, f, 2, 10


@pytest.mark.parametrize("seed", range(6))
def test_expand_compiled_equals_plain_python_and_its_meaning(seed: int) -> None:
    keep, children, level_row, tokens, logprob, path_lp, parent_slot, fed_anc, f, depth, start = _plan_case(seed)
    plain_anc, compiled_anc = fed_anc.copy(), fed_anc.copy()
    plain = expand(keep, children, level_row, tokens, logprob, path_lp, parent_slot, plain_anc, f, depth, start)
    compiled = expander()(keep, children, level_row, tokens, logprob, path_lp, parent_slot, compiled_anc, f, depth,
                          start)
    for a, b in zip(plain, compiled, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)  # exp: numba and numpy may differ by an ulp
    np.testing.assert_array_equal(plain_anc, compiled_anc)
    kept, depth_col, fed, rows, counts, feed, anc, cand, slots, lp, prob, n_kept, kmax, uniform = plain
    expanded = np.flatnonzero(keep & (children > 0))
    np.testing.assert_array_equal(rows, expanded)
    np.testing.assert_array_equal(counts, children[expanded])
    np.testing.assert_array_equal(feed, tokens[expanded])
    np.testing.assert_array_equal(cand, start + expanded)
    np.testing.assert_array_equal(slots, f + np.arange(len(expanded)))
    np.testing.assert_array_equal(lp, path_lp[expanded])
    np.testing.assert_allclose(prob, np.exp(logprob[expanded]), rtol=1e-6)
    assert n_kept == keep.sum() and (depth_col == depth).all() and kept.dtype == np.bool_
    np.testing.assert_array_equal(fed[expanded], f + np.arange(len(expanded)))
    assert (fed[np.setdiff1d(np.arange(len(keep)), expanded)] == -1).all()
    for j, i in enumerate(expanded):  # each fed node sees its parent's ancestry and itself
        ps = parent_slot[level_row[i]]
        want = np.zeros(f + len(expanded), dtype=bool)
        if ps >= 0:
            want[:f] = fed_anc[ps, :f]
        want[f + j] = True
        np.testing.assert_array_equal(anc[j], want)
    np.testing.assert_array_equal(plain_anc[f:f + len(expanded), :f + len(expanded)], anc)
    if len(expanded):
        assert kmax == counts.max() and uniform == bool((counts == counts.max()).all())


@pytest.mark.parametrize("seed", range(8))
def test_tree_arrays_equal_from_parents_and_drop_orphans(seed: int) -> None:
    rng = np.random.default_rng(seed)
    m = 14
    parent = np.array([-1 if i < 3 else int(rng.integers(-1, i)) for i in range(m)])  # parents come first
    tokens, fed = rng.integers(0, 50, m), rng.integers(-1, 20, m)
    keep = rng.random(m) < 0.75
    plain = tree_arrays(keep, parent, tokens, fed, 7)
    compiled = tree_builder()(keep, parent, tokens, fed, 7)
    for a, b in zip(plain, compiled, strict=True):
        np.testing.assert_array_equal(a, b)
    index, parents, toks, depth, anc, slots = plain
    # the connected selection, closed by hand: a candidate stays only if its parent does
    inside = keep.copy()
    for i in range(m):
        inside[i] &= parent[i] < 0 or inside[parent[i]]
    np.testing.assert_array_equal(index >= 0, inside)
    np.testing.assert_array_equal(index[inside], np.arange(1, inside.sum() + 1))
    tree_parents = [-1] + [0 if parent[i] < 0 else int(index[parent[i]]) for i in np.flatnonzero(inside)]
    ref = DraftTree.from_parents(tree_parents, [7, *tokens[inside].tolist()])
    np.testing.assert_array_equal(parents, ref.parents.numpy())
    np.testing.assert_array_equal(toks, ref.tokens.numpy())
    np.testing.assert_array_equal(depth, ref.depth.numpy())
    np.testing.assert_array_equal(anc, ref.ancestor_mask.numpy())
    np.testing.assert_array_equal(slots, [-1, *fed[inside].tolist()])


def test_decodes_with_and_without_the_native_children_agree(tokenizer, monkeypatch) -> None:
    target, drafter = make_model("llama", 0, layers=2), make_model("llama", 1, layers=1)
    dec = TreeDecoder(target, drafter, tokenizer)
    prompts = ["def f(x):", "hello there", "1 + 2 =", "(a, b)"]

    def run() -> list[tuple]:
        out = []
        for prompt in prompts:
            for tree in (StaticTree(3, 3), StaticTree(1, 5)):
                r = dec.generate(prompt, max_new_tokens=16, tree=tree)
                out.append((r.token_ids, [(s.drafted, s.verified, s.accepted) for s in r.stats.steps]))
        return out

    native = run()
    monkeypatch.setattr(draft, "kernel", lambda: None)  # the numpy children path
    assert run() == native
    assert all(ref.token_ids == dec.generate_plain(p, max_new_tokens=16).token_ids
               for p, ref in zip(prompts, (dec.generate(p, max_new_tokens=16) for p in prompts), strict=True))
