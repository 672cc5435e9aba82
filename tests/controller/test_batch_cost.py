"""The batched cost model: the grid's fit and monotonicity, its measurement, and LearnedTree's decisions on it
(drafting stops when a batch makes verification too expensive, resumes when the batch shrinks)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pytest
from conftest import make_model

from treewise.controller import BudgetsFile, DomainBudget, LatencyProfile, LearnedTree
from treewise.controller.latency import time_batch_forwards
from treewise.decoder import TreeDecoder
from treewise.decoder.capability import attention_layout


def _grid(rows: list[int], target: list[list[float]], draft: list[list[float]] | None = None,
          sizes: tuple[int, ...] = (1, 2, 4)) -> LatencyProfile:
    solo = LatencyProfile.flat(1.0, 0.3, 0.05)
    draft = draft if draft is not None else [[0.3] * len(sizes) for _ in rows]
    return LatencyProfile(**{**solo.model_dump(), "batch_rows": rows, "batch_sizes": list(sizes),
                             "batch_target_ms": target, "batch_draft_ms": draft})


def test_for_batch_interpolates_rows_and_keeps_solo_at_one() -> None:
    profile = _grid([1, 2, 4], [[1.0, 1.2, 1.5], [1.5, 2.0, 3.0], [2.5, 4.0, 7.0]])
    assert profile.for_batch(1) is profile and LatencyProfile.flat().for_batch(8) == LatencyProfile.flat()
    three = profile.for_batch(3)
    assert three.sizes == [1, 2, 4]
    assert three.target_ms == pytest.approx([2.0, 3.0, 5.0])  # halfway between 2 and 4 rows
    assert three.target_time(3) == pytest.approx(4.0)
    assert profile.for_batch(8).target_ms == pytest.approx([4.5, 8.0, 15.0])  # the last segment, extended
    assert profile.for_batch(3) is three  # memoised: LearnedTree asks at every change of batch size


def test_for_batch_is_monotone_in_rows_and_sizes() -> None:
    """Timing noise must not make a bigger batch or a bigger tree look cheaper."""
    noisy = _grid([1, 2, 4], [[1.0, 0.9, 1.5], [1.5, 2.0, 1.8], [1.4, 4.0, 7.0]])
    two, four = noisy.for_batch(2), noisy.for_batch(4)
    assert two.target_ms == pytest.approx([1.5, 2.0, 2.0])
    assert four.target_ms == pytest.approx([1.5, 4.0, 7.0])
    rng = np.random.default_rng(0)
    random = _grid([1, 2, 4, 8], rng.uniform(1, 10, (4, 3)).tolist(), rng.uniform(0.1, 1, (4, 3)).tolist())
    for b in range(2, 12):
        lo, hi = random.for_batch(b), random.for_batch(b + 1)
        assert np.all(np.diff(lo.target_ms) >= 0) and np.all(np.diff(lo.draft_ms) >= 0)
        assert np.all(np.asarray(hi.target_ms) >= np.asarray(lo.target_ms) - 1e-12)


def test_time_batch_forwards_measures_the_grid() -> None:
    model = make_model("llama", 0, layers=1)
    grid = time_batch_forwards(model, attention_layout(model), context=8, rows=(1, 3), sizes=(1, 4), repeats=2)
    assert len(grid) == 2 and all(len(r) == 2 for r in grid)
    assert all(ms > 0 for r in grid for ms in r)


class Fixed:
    """A stand-in predictor: every candidate has the same acceptance."""

    feature_names = ["depth"]

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.full(len(features["depth"]), 0.6)


# One row: a draft level and a second node cost little. Four rows: a second node per row costs twice the step.
EXPENSIVE_BATCH = _grid([1, 4], [[1.0, 1.05, 1.2], [2.0, 6.0, 9.0]], [[0.3, 0.3, 0.3], [0.5, 0.6, 0.8]])


@pytest.fixture(scope="module")
def dec(tokenizer):
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None  # rows end at their own lengths
    return TreeDecoder(target, make_model("llama", 1, layers=1), tokenizer)


def _policy(**kw: object) -> LearnedTree:
    """The grid's rule alone: measured step costs (the real clock on toy models) would move its decisions."""
    kw.setdefault("measured", False)
    return LearnedTree(Fixed(), BudgetsFile(default=DomainBudget(node_budget=6, max_depth=3, max_width=2)),
                       EXPENSIVE_BATCH, probe_every=1000, online=None, **kw)


def test_drafting_stops_in_an_expensive_batch_and_resumes_when_it_shrinks(dec) -> None:
    prompts = ["def f(x):", "hello world", "12 + 7 =", "a b c"]
    limits = [40, 6, 6, 6]
    outs = dec.generate_batch(prompts, max_new_tokens=limits, tree=_policy())
    assert [o.token_ids for o in outs] == [dec.generate_plain(p, max_new_tokens=m).token_ids
                                           for p, m in zip(prompts, limits, strict=True)]
    steps = outs[0].stats.steps
    crowded = [s for s in steps[1:] if s.rows == 4]  # step 0 probes on the prior
    alone = [s for s in steps if s.rows == 1]
    assert crowded and all(s.draft_forwards == 0 and s.verified == 0 for s in crowded)
    assert alone and all(s.draft_forwards > 0 for s in alone[:-1])  # the last step has no room for a tree
    assert np.mean([s.verified for s in alone]) >= 1.5
    solo = dec.generate(prompts[0], max_new_tokens=40, tree=_policy())
    assert all(s.draft_forwards > 0 for s in solo.stats.steps[:-1])  # the same policy drafts every solo step


def test_batch_unaware_learned_tree_keeps_solo_sizes(dec) -> None:
    outs = dec.generate_batch(["def f(x):", "hello world", "12 + 7 =", "a b c"], max_new_tokens=12,
                              tree=_policy(batch_aware=False))
    assert all(s.draft_forwards > 0 for o in outs for s in o.stats.steps[:-1])


def test_batch_cap_maximises_the_batch_goodput() -> None:
    """Rows' trees padded to the cap: the cap trades the rows' best values against the batched verify."""
    policy = _policy()
    policy.start(__import__("treewise.decoder", fromlist=["RequestInfo"]).RequestInfo("code", 4, 8, 0.0, "x"))
    policy._rebatch(4)
    policy._request.drafted = True
    policy._request.state.scalars[:] = 0.0  # no draft time: the verify cost alone decides
    costs = policy._request.costs.target  # 4 rows: 2.0 ms at 1 token a row, 6.0 at 2, 7.5 at 3, 9.0 at 4
    assert costs[1:5] == pytest.approx([2.0, 6.0, 7.5, 9.0])
    strong = [np.array([0.9, 0.8, 0.0, 0.7])] * 4  # 0: pruned
    # n=0: 4/2 = 2.0; n=1: 4*1.9/6 = 1.27; n=2: 4*2.7/7.5 = 1.44; n=3: 4*3.4/9 = 1.51 -> no tree at all
    assert policy.batch_cap(strong) == 0
    cheap = LearnedTree(Fixed(), BudgetsFile(default=DomainBudget(node_budget=6, max_depth=3, max_width=2)),
                        _grid([1, 4], [[1.0, 1.05, 1.2], [2.0, 2.1, 2.4]]), online=None)
    cheap.start(__import__("treewise.decoder", fromlist=["RequestInfo"]).RequestInfo("code", 4, 8, 0.0, "x"))
    cheap._rebatch(4)
    cheap._request.drafted = True
    cheap._request.state.scalars[:] = 0.0
    assert cheap.batch_cap(strong) == 3  # 4*3.4/2.4 beats every smaller cap
    assert cheap.batch_cap([np.array([0.9]), np.zeros(0)]) == 1
    cheap.batch_aware = False
    assert cheap.batch_cap(strong) == 3 and cheap.batch_cap([np.array([0.9, 0.1])] * 2) == 2


def test_a_common_cap_cuts_rows_to_their_best_nodes_and_stays_exact(dec) -> None:
    prompts = ["def f(x):", "hello world", "12 + 7 =", "a b c"]
    wide = LearnedTree(Fixed(), BudgetsFile(default=DomainBudget(node_budget=6, max_depth=3, max_width=2)),
                       _grid([1, 4], [[1.0, 1.0, 1.0], [2.0, 2.4, 4.0]], [[0.01] * 3, [0.01] * 3], sizes=(1, 3, 5)),
                       probe_every=1000, online=None, measured=False)
    outs = dec.generate_batch(prompts, max_new_tokens=12, tree=wide)
    assert [o.token_ids for o in outs] == [dec.generate_plain(p, max_new_tokens=12).token_ids for p in prompts]
    crowded = [s for o in outs for s in o.stats.steps if s.rows == 4]
    assert crowded and max(s.verified for s in crowded) < max(s.drafted for s in crowded)
    assert len({s.verified for s in crowded if s.draft_forwards}) == 1  # one common size
