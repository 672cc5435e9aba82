"""Property tests of the tree as data and of the attention masks built from it."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from treewise.decoder import DraftTree, TreewiseError, chain_then_tree, tree_attention_mask


@st.composite
def parent_lists(draw: st.DrawFn) -> list[int]:
    n = draw(st.integers(min_value=1, max_value=40))
    return [-1] + [draw(st.integers(min_value=0, max_value=i - 1)) for i in range(1, n)]


def _depth_by_walk(parents: list[int], i: int) -> int:
    d = 0
    while parents[i] != -1:
        i, d = parents[i], d + 1
    return d


@settings(max_examples=200, deadline=None)
@given(parent_lists())
def test_tree_properties(parents: list[int]) -> None:
    n = len(parents)
    tree = DraftTree.from_parents(parents, list(range(100, 100 + n)))
    assert tree.size == n
    for i in range(n):
        assert int(tree.depth[i]) == _depth_by_walk(parents, i)
        # ancestors of i = i plus the ancestors of its parent
        expected = {i}
        j = i
        while parents[j] != -1:
            j = parents[j]
            expected.add(j)
        assert set(torch.nonzero(tree.ancestor_mask[i]).flatten().tolist()) == expected
        assert tree.path_to(i)[0] == 0 and tree.path_to(i)[-1] == i
        assert len(tree.path_to(i)) == int(tree.depth[i]) + 1
    # positions: the root sits at the offset, every node one past its parent
    pos = tree.position_ids(17)
    assert int(pos[0]) == 17
    assert all(int(pos[i]) == int(pos[parents[i]]) + 1 for i in range(1, n))
    # paths: one per leaf, each a chain of parent links from the root
    leaves = set(range(n)) - set(parents[1:])
    assert {p[-1] for p in tree.paths} == leaves
    for path in tree.paths:
        assert all(parents[b] == a for a, b in zip(path, path[1:], strict=False))


@settings(max_examples=50, deadline=None)
@given(parent_lists(), st.integers(min_value=0, max_value=5), st.integers(min_value=0, max_value=4))
def test_chain_then_tree_mask(parents: list[int], past: int, chain: int) -> None:
    tree = DraftTree.from_parents(parents, [0] * len(parents))
    vis = chain_then_tree(chain, tree.ancestor_mask)
    mask = tree_attention_mask(vis, past, torch.float32)
    q = chain + tree.size
    assert mask.shape == (1, 1, q, past + q)
    visible = mask[0, 0] == 0
    assert visible[:, :past].all()  # the cached prefix is visible to all
    for i in range(chain):  # the chain is causal
        assert visible[i, past : past + i + 1].all() and not visible[i, past + i + 1 :].any()
    for i in range(tree.size):  # tree nodes see the chain plus exactly their ancestors
        row = visible[chain + i, past:]
        assert row[:chain].all()
        assert torch.equal(row[chain:], tree.ancestor_mask[i])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16])
def test_mask_values_in_every_dtype(dtype: torch.dtype) -> None:
    """The additive mask: 0 where visible, the dtype's minimum elsewhere, the cached prefix always visible."""
    vis = torch.rand(5, 7, generator=torch.Generator().manual_seed(0)) > 0.5
    mask = tree_attention_mask(vis, 11, dtype)
    assert mask.dtype == dtype and mask.shape == (1, 1, 5, 18)
    want = torch.zeros(5, 18, dtype=dtype)
    want[:, 11:][~vis] = torch.finfo(dtype).min
    assert torch.equal(mask[0, 0], want)


def test_bad_trees_raise() -> None:
    with pytest.raises(TreewiseError, match="root"):
        DraftTree.from_parents([0, 0], [1, 2])
    with pytest.raises(TreewiseError, match="earlier"):
        DraftTree.from_parents([-1, 2, 1], [1, 2, 3])
    with pytest.raises(TreewiseError, match="one token per node"):
        DraftTree.from_parents([-1, 0], [1])
