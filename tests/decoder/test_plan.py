"""``LevelPlan`` holds numpy arrays whatever a policy passes, and ``Frontier.arrays`` gives the same columns
whether the drafter attached its own or a caller built the frontier from tensors alone."""

import numpy as np
import torch

from treewise.decoder import Frontier, LevelPlan


def test_a_plan_made_of_tensors_or_lists_is_numpy() -> None:
    for keep, children in ((torch.tensor([True, False, True]), torch.tensor([2, 0, 1])),
                           ([True, False, True], [2, 0, 1]),
                           (np.array([True, False, True]), np.array([2, 0, 1]))):
        plan = LevelPlan(keep=keep, children=children)
        assert isinstance(plan.keep, np.ndarray) and isinstance(plan.children, np.ndarray)
        assert plan.keep.tolist() == [True, False, True] and plan.children.tolist() == [2, 0, 1]


def test_uniform_plans() -> None:
    plan = LevelPlan.uniform(3, 2)
    assert plan.keep.dtype == np.bool_ and plan.keep.tolist() == [True] * 3 and plan.children.tolist() == [2] * 3
    for keep in (torch.tensor([True, False, True]), np.array([True, False, True])):
        plan = LevelPlan.uniform(3, 4, keep=keep)
        assert plan.keep.tolist() == [True, False, True] and plan.children.tolist() == [4, 0, 4]


def _frontier() -> Frontier:
    t = {n: torch.arange(3) if n in ("tokens", "parent", "sibling_rank") else torch.rand(3)
         for n in ("tokens", "parent", "sibling_rank", "draft_logprob", "draft_entropy", "draft_margin",
                   "path_logprob", "parent_draft_prob")}
    return Frontier.of(depth=1, step=0, position=0, prompt_len=4, domain="code", temperature=0.0, tree_size=0,
                       max_depth=3, **t)


def test_frontier_columns_are_shared_by_arrays_and_tensor_views() -> None:
    f = _frontier()
    arrays = f.arrays()
    for name in ("tokens", "parent", "sibling_rank", "draft_logprob", "draft_entropy", "draft_margin",
                 "path_logprob", "parent_draft_prob"):
        view = getattr(f, name)
        assert isinstance(view, torch.Tensor) and view.shape == (3,)
        np.testing.assert_array_equal(arrays[name], view.numpy())
        assert np.shares_memory(arrays[name], view.numpy())  # no copy either way
    assert f.size == 3
    own = {"tokens": np.array([7, 8, 9])}
    drafted = Frontier(depth=1, step=0, position=0, prompt_len=4, domain="code", temperature=0.0, tree_size=0,
                       max_depth=3, columns=own)
    assert drafted.arrays() is own and drafted.size == 3  # the drafter's columns are handed over as they are
