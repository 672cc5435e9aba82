"""Batched tree decoding: every row equals what generate() gives for that prompt alone."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import make_model
from test_architectures import build

from treewise.controller import ConfidenceTree
from treewise.decoder import Chain, NodeLogWriter, StaticTree, TreeDecoder, TreewiseError, read_node_logs
from treewise.decoder.cache.kvcache import BatchCache


def _prompts(n: int, seed: int = 3) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice("abcdefghij klmnop(){}=+") for _ in range(rng.randint(3, 60))) for _ in range(n)]


@pytest.fixture(scope="module", params=[("llama", False), ("qwen2", True), ("gpt2", False)],
                ids=["llama", "qwen2-window", "gpt2"])
def dec(request, tokenizer):
    arch, window = request.param
    return TreeDecoder(build(arch, 0, window=window), build(arch, 1, layers=1, window=window), tokenizer)


@pytest.mark.parametrize("size", [4, 8])
def test_rows_equal_solo_greedy(dec, size: int) -> None:
    prompts = _prompts(size)
    refs = [dec.generate_plain(p, max_new_tokens=24) for p in prompts]
    for policy in (StaticTree(2, 3), Chain(4), ConfidenceTree(budget=8, max_depth=4, top_k=2)):
        outs = dec.generate_batch(prompts, max_new_tokens=24, tree=policy)
        assert [o.token_ids for o in outs] == [r.token_ids for r in refs]
        assert [o.finish_reason for o in outs] == [r.finish_reason for r in refs]


def test_rows_at_eos_length_and_context(tokenizer) -> None:
    target, draft = make_model("llama", 0, max_pos=48), make_model("llama", 1, layers=1, max_pos=48)
    dec = TreeDecoder(target, draft, tokenizer)
    prompts = ["x" * 40, "ab", "hello tree", "q" * 30]  # the long ones reach the context limit
    limits = [dec.generate_plain(p, max_new_tokens=20) for p in prompts]
    outs = dec.generate_batch(prompts, max_new_tokens=20, tree=StaticTree(2, 3))
    assert [o.token_ids for o in outs] == [r.token_ids for r in limits]
    assert [o.finish_reason for o in outs] == [r.finish_reason for r in limits]
    assert outs[0].finish_reason == "context" and len({o.finish_reason for o in outs}) >= 2
    dec = TreeDecoder(build("llama", 0), build("llama", 1, layers=1), tokenizer)
    eos_rows = dec.generate_batch(_prompts(8), max_new_tokens=24, tree=StaticTree(2, 3))
    assert {o.finish_reason for o in eos_rows} == {"eos", "length"}  # rows leave the batch at different steps
    assert [o.token_ids for o in eos_rows] == [dec.generate_plain(p, max_new_tokens=24).token_ids
                                               for p in _prompts(8)]


@pytest.mark.parametrize("mode", ["topk", "sampled"])
def test_seeded_rows_equal_solo_sampling(dec, mode: str) -> None:
    prompts = _prompts(4, seed=5)
    seeds = [11, 12, 13, 14]
    outs = dec.generate_batch(prompts, max_new_tokens=16, tree=StaticTree(2, 2), temperature=1.0, seed=seeds,
                              draft_mode=mode)
    solo = [dec.generate(p, max_new_tokens=16, tree=StaticTree(2, 2), temperature=1.0, seed=s, draft_mode=mode)
            for p, s in zip(prompts, seeds, strict=True)]
    assert [o.token_ids for o in outs] == [s.token_ids for s in solo]


def test_broken_row_compaction_fails(dec, monkeypatch) -> None:
    """Compacting every row as if it had row 0's committed prefix (a per-row bookkeeping slip) must break outputs."""
    prompts = _prompts(4)
    refs = [dec.generate_plain(p, max_new_tokens=24).token_ids for p in prompts]
    original = BatchCache.compact

    def row0_prefix(self: BatchCache, keeps: list[torch.Tensor]) -> None:
        self.committed = [self.committed[0]] * len(keeps)
        original(self, keeps)

    monkeypatch.setattr(BatchCache, "compact", row0_prefix)
    try:
        outs = dec.generate_batch(prompts, max_new_tokens=24, tree=StaticTree(2, 3))
    except (IndexError, RuntimeError):
        return  # a cache that no longer matches its row's tokens may also crash: the slip is caught either way
    assert sum(o.token_ids != r for o, r in zip(outs, refs, strict=True)) >= 1


def test_node_logs_equal_solo(dec, tmp_path) -> None:
    prompts = _prompts(4)
    ids = [f"p{i}" for i in range(4)]
    solo = NodeLogWriter(tmp_path / "solo")
    for p, pid in zip(prompts, ids, strict=True):
        dec.generate(p, max_new_tokens=16, tree=StaticTree(2, 3), domain="code", prompt_id=pid, run_id="r", log=solo)
    solo.close()
    batch = NodeLogWriter(tmp_path / "batch")
    dec.generate_batch(prompts, max_new_tokens=16, tree=StaticTree(2, 3), domain="code", prompt_ids=ids, run_id="r",
                       log=batch)
    batch.close()
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

def test_bad_batches(dec) -> None:
    with pytest.raises(TreewiseError, match="at least one prompt"):
        dec.generate_batch([])
    with pytest.raises(TreewiseError, match="mix strings"):
        dec.generate_batch(["abc", [5, 6]])
    with pytest.raises(TreewiseError, match="prompt 1: .*context"):
        dec.generate_batch(["abc", "x" * 300])
    with pytest.raises(TreewiseError, match="one entry per prompt"):
        dec.generate_batch(["abc", "def"], seed=[1])


def test_plain_batch_rows_equal_solo_plain(dec) -> None:
    """The batched baseline (left padding) gives each row the target's solo greedy output."""
    prompts = _prompts(6)
    outs = dec.generate_plain_batch(prompts, max_new_tokens=24)
    refs = [dec.generate_plain(p, max_new_tokens=24) for p in prompts]
    assert [o.token_ids for o in outs] == [r.token_ids for r in refs]
    assert [o.finish_reason for o in outs] == [r.finish_reason for r in refs]
    with pytest.raises(TreewiseError, match="at least one prompt"):
        dec.generate_plain_batch([])


def test_embedded_pair_rows_equal_solo_greedy() -> None:
    """The shipped pair, 8 test-split prompts of mixed domains and lengths, batches of 4 and 8."""
    import json
    from pathlib import Path

    data = Path(__file__).resolve().parents[2] / "data"
    if not (data / "models" / "target" / "config.json").exists():
        pytest.skip("data/models not built: run `treewise train-pair`")
    dec = TreeDecoder.from_pretrained(data / "models" / "target", data / "models" / "draft", device="cpu")
    prompts = []
    for suite in sorted((data / "prompts").glob("*.jsonl")):
        rows = [json.loads(line) for line in suite.read_text().splitlines() if line.strip()]
        prompts.append(next(r["prompt"] for r in rows if r["split"] == "test"))
    assert len({len(p) for p in prompts}) > 4  # mixed lengths
    refs = [dec.generate_plain(p, max_new_tokens=32).token_ids for p in prompts]
    for size in (4, 8):
        outs = [o for i in range(0, len(prompts), size)
                for o in dec.generate_batch(prompts[i : i + size], max_new_tokens=32, tree=StaticTree(2, 3))]
        assert [o.token_ids for o in outs] == refs
