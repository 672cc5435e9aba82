"""Continuous batching: with ``max_batch`` rows at once, waiting requests join as rows finish, and every row
still equals what that prompt gives alone (greedy, both sampling modes, node logs)."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from test_architectures import build

from treewise.controller import ConfidenceTree
from treewise.decoder import NodeLogWriter, StaticTree, TreeDecoder, TreewiseError, read_node_logs
from treewise.decoder.cache.kvcache import BatchCache

LIMITS = [40, 3, 5, 2, 30, 4, 3, 12]  # a long row, short ones that finish and make room, a long late joiner


def _prompts(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghij klmnop(){}=+") for _ in range(rng.randint(3, 60))) for _ in range(n)]


@pytest.fixture(scope="module", params=[("llama", False), ("qwen2", True), ("gpt2", False)],
                ids=["llama", "qwen2-window", "gpt2"])
def dec(request, tokenizer):
    arch, window = request.param
    # eos_token_id=None: rows end at their own lengths only, so the refill pattern is what LIMITS says
    target, draft = build(arch, 0, window=window), build(arch, 1, layers=1, window=window)
    for model in (target, draft):
        model.generation_config.eos_token_id = None
    return TreeDecoder(target, draft, tokenizer)


def test_rows_of_different_lengths_refill_the_batch_and_equal_solo(dec) -> None:
    prompts = _prompts(len(LIMITS))
    refs = [dec.generate_plain(p, max_new_tokens=m).token_ids for p, m in zip(prompts, LIMITS, strict=True)]
    for policy in (StaticTree(2, 3), ConfidenceTree(budget=8, max_depth=4, top_k=2)):
        outs = dec.generate_batch(prompts, max_new_tokens=LIMITS, tree=policy, max_batch=2)
        assert [o.token_ids for o in outs] == refs
        assert [len(o.token_ids) for o in outs] == LIMITS
        rows = [[s.rows for s in o.stats.steps] for o in outs]
        assert max(max(r) for r in rows) == 2
        # The long row has a partner for longer than any short row lives: finished rows were replaced.
        short = [len(o.stats.steps) for o, m in zip(outs, LIMITS, strict=True) if m <= 5]
        assert sum(r == 2 for r in rows[0]) > max(short)


def test_joined_rows_take_a_prefill_of_their_own(dec, monkeypatch) -> None:
    """Joins after the batch's first forward prefill the prompt alone; a prefill that writes the prompt in the
    wrong order must break outputs."""
    prompts = _prompts(5, seed=9)
    limits = [20, 2, 2, 2, 20]
    refs = [dec.generate_plain(p, max_new_tokens=m).token_ids for p, m in zip(prompts, limits, strict=True)]
    calls: list[bool] = []
    original = BatchCache.prefill

    def counted(self: BatchCache, model, row: int, tokens: torch.Tensor, hidden: bool = False):
        out = original(self, model, row, tokens, hidden)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(BatchCache, "prefill", counted)
    outs = dec.generate_batch(prompts, max_new_tokens=limits, tree=StaticTree(2, 2), max_batch=2)
    assert [o.token_ids for o in outs] == refs
    assert calls.count(False) == 4 and calls.count(True) == 6  # 2 rows x 2 caches at the start, 3 joins x 2 caches

    def reversed_prompt(self: BatchCache, model, row: int, tokens: torch.Tensor, hidden: bool = False):
        return original(self, model, row, tokens.flip(0), hidden)

    monkeypatch.setattr(BatchCache, "prefill", reversed_prompt)
    outs = dec.generate_batch(prompts, max_new_tokens=limits, tree=StaticTree(2, 2), max_batch=2)
    assert sum(o.token_ids != r for o, r in zip(outs, refs, strict=True)) >= 1


@pytest.mark.parametrize("mode", ["topk", "sampled"])
def test_seeded_joined_rows_equal_solo_sampling(dec, mode: str) -> None:
    prompts = _prompts(5, seed=5)
    seeds, limits = [11, 12, 13, 14, 15], [24, 3, 6, 3, 16]
    outs = dec.generate_batch(prompts, max_new_tokens=limits, tree=StaticTree(2, 2), temperature=1.0, seed=seeds,
                              draft_mode=mode, max_batch=2)
    solo = [dec.generate(p, max_new_tokens=m, tree=StaticTree(2, 2), temperature=1.0, seed=s, draft_mode=mode)
            for p, s, m in zip(prompts, seeds, limits, strict=True)]
    assert [o.token_ids for o in outs] == [s.token_ids for s in solo]


def test_node_logs_and_finish_callbacks(dec, tmp_path) -> None:
    prompts, limits = _prompts(5), [16, 4, 9, 3, 12]
    ids = [f"p{i}" for i in range(5)]
    solo = NodeLogWriter(tmp_path / "solo")
    for p, pid, m in zip(prompts, ids, limits, strict=True):
        dec.generate(p, max_new_tokens=m, tree=StaticTree(2, 3), domain="code", prompt_id=pid, run_id="r", log=solo)
    solo.close()
    batch = NodeLogWriter(tmp_path / "batch")
    finished: list[tuple[int, list[int]]] = []
    outs = dec.generate_batch(prompts, max_new_tokens=limits, tree=StaticTree(2, 3), domain="code", prompt_ids=ids,
                              run_id="r", log=batch, max_batch=2,
                              on_finish=lambda i, out: finished.append((i, out.token_ids)))
    batch.close()
    assert sorted(finished) == [(i, o.token_ids) for i, o in enumerate(outs)]
    assert finished[0][0] != 0  # rows are reported as they end, not in input order
    keys = [("prompt_id", "ascending"), ("step", "ascending"), ("node_id", "ascending")]
    a = read_node_logs(tmp_path / "solo").sort_by(keys)
    b = read_node_logs(tmp_path / "batch").sort_by(keys)
    assert a.num_rows == b.num_rows > 0 and a.column_names == b.column_names
    for name in a.column_names:
        x, y = a.column(name).to_numpy(zero_copy_only=False), b.column(name).to_numpy(zero_copy_only=False)
        if x.dtype.kind == "f":
            np.testing.assert_allclose(x, y, atol=1e-4, equal_nan=True, err_msg=name)
        else:
            assert (x == y).all(), name


def test_bad_continuous_batches(dec) -> None:
    with pytest.raises(TreewiseError, match="max_batch must be >= 1"):
        dec.generate_batch(["abc", "def"], max_batch=0)
    with pytest.raises(TreewiseError, match="one entry per prompt"):
        dec.generate_batch(["abc", "def"], max_new_tokens=[4])
