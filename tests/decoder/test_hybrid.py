"""Hybrid trees end to end: lookup candidates merged into drafted trees decode exactly, solo and batched, in
greedy and both sampling modes; they are logged with their source; the draft model sits out covered steps."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_architectures import build

from treewise.controller import Hybrid, LatencyProfile
from treewise.controller.hybrid import LookupCalibration
from treewise.decoder import (
    SCHEMA,
    LookupConfig,
    NodeLogWriter,
    NoDraft,
    StaticTree,
    SuffixStore,
    TreeDecoder,
    read_node_logs,
)

PROMPTS = ["abc abc abc abc abc abc", "x = [1, 2, 3]; y = [1, 2, 3]; z = [1, 2", "hello world hello", "q(q(q(q("]
LOOK = LookupConfig(max_nodes=8, max_depth=6)


@pytest.fixture(scope="module", params=[("llama", False), ("qwen2", True), ("gpt2", False)],
                ids=["llama", "qwen2-window", "gpt2"])
def dec(request, tokenizer):
    arch, window = request.param
    return TreeDecoder(build(arch, 0, window=window), build(arch, 1, layers=1, window=window), tokenizer)


def _policies() -> dict[str, Hybrid]:
    return {"lookup": Hybrid(NoDraft(), LOOK, min_value=0.0),
            "static+suffix": Hybrid(StaticTree(2, 2), LOOK, SuffixStore(LOOK), min_value=0.0, skip_gain=1.5),
            "priced": Hybrid(StaticTree(2, 2), LOOK, latency=LatencyProfile.flat(1.0, 0.1, 0.05))}


def test_greedy_solo_and_batched_equal_plain(dec, tmp_path) -> None:
    refs = [dec.generate_plain(p, max_new_tokens=32).token_ids for p in PROMPTS]
    for name, policy in _policies().items():
        log = NodeLogWriter(tmp_path / name)
        solo = [dec.generate(p, max_new_tokens=32, tree=policy, domain="code", log=log).token_ids for p in PROMPTS]
        log.close()
        batch = [o.token_ids for o in dec.generate_batch(PROMPTS, max_new_tokens=32, tree=policy, domain="code")]
        assert solo == refs and batch == refs, name
    t = read_node_logs(tmp_path / "static+suffix")
    col = {name: t.column(name).to_numpy(zero_copy_only=False) for name in t.column_names}
    looked = col["source"] != "draft"
    assert looked.any() and col["on_accepted_path"][looked].any()  # lookup nodes were verified and accepted
    assert not np.isnan(col["lookup_prob"][looked]).any()
    assert (col["match_len"][looked] > 0).all() and (col["lookup_count"][looked] > 0).all()
    assert np.isnan(col["lookup_prob"][~looked]).all()
    only = col["source"] == "lookup"
    # A lookup node's draft columns come from its parent's draft distribution where the draft expanded it.
    rank, lp = col["sibling_rank"][only], col["draft_logprob"][only]
    assert (rank >= -1).all() and ((rank == -1) == np.isnan(lp)).all()


@pytest.mark.parametrize("mode", ["topk", "sampled"])
def test_seeded_sampling_batched_equals_solo(dec, mode: str) -> None:
    # Trees that depend on the request alone (no store, a calibration that does not learn): the same seeded draws.
    # The skip rule reads measured step times: off here, so the trees do not depend on timing either.
    policy = Hybrid(StaticTree(2, 2), LOOK, min_value=0.0, calibration=LookupCalibration(learn=False),
                    skip_gain=float("inf"))
    seeds = [3, 4, 5, 6]
    batch = dec.generate_batch(PROMPTS, max_new_tokens=20, tree=policy, temperature=1.0, seed=seeds, draft_mode=mode)
    solo = [dec.generate(p, max_new_tokens=20, tree=policy, temperature=1.0, seed=s, draft_mode=mode)
            for p, s in zip(PROMPTS, seeds, strict=True)]
    assert [o.token_ids for o in batch] == [s.token_ids for s in solo]


def test_covered_steps_skip_the_draft_model(tokenizer) -> None:
    target = build("llama", 0)
    target.generation_config.eos_token_id = None  # a long output: its loops give the lookup matches
    dec = TreeDecoder(target, build("llama", 1, layers=1), tokenizer)
    prompt = "the cat sat on the mat " * 4
    ref = dec.generate_plain(prompt, max_new_tokens=48).token_ids
    out = dec.generate(prompt, max_new_tokens=48, tree=Hybrid(StaticTree(2, 2), LOOK, skip_gain=1.0, min_value=0.0))
    assert out.token_ids == ref
    skipped = [s for s in out.stats.steps if s.draft_forwards == 0 and s.verified > 0]
    drafted = [s for s in out.stats.steps if s.draft_forwards > 0]
    assert skipped and drafted  # both kinds of step happen on one request
    never = dec.generate(prompt, max_new_tokens=48, tree=Hybrid(StaticTree(2, 2), LOOK, skip_gain=1e9))
    assert all(s.draft_forwards > 0 for s in never.stats.steps[:-1]) and never.token_ids == ref


def test_priced_lookup_nodes_pay_for_their_verify() -> None:
    from treewise.decoder.candidates.lookup import LookupTree

    class Drafted:  # what proposals() reads of a DraftResult
        class tree:
            size = 3

    steep = LatencyProfile.flat(1.0, 0.1, 0.5)  # each verified node costs half a plain step
    policy = Hybrid(NoDraft(), LOOK, latency=steep, min_value=0.0)
    look = LookupTree(np.array([5, 6, 7]), np.array([-1, 0, 1]), np.array([4, 2, 1]), np.array([1, 2, 3]), 3, 4)
    policy._look, policy._values = look, look.counts / (look.occurrences + policy.prior)  # 0.8, 0.4, 0.2
    kept = policy.proposals(Drafted())  # type: ignore[arg-type]
    assert kept.tokens.tolist() == [5]  # only the node worth more than half a step
    policy.latency = None
    assert policy.proposals(Drafted()).size == 3  # type: ignore[arg-type]


def test_older_node_logs_read_with_the_added_columns(tmp_path) -> None:
    old = pa.schema([f for f in SCHEMA if f.name not in ("source", "lookup_prob", "lookup_count", "match_len")],
                    metadata=SCHEMA.metadata)
    empty = {f.name: pa.array([], f.type) for f in old}
    row = {name: pa.array([None], arr.type) if name not in ("run_id", "prompt_id", "domain", "token_type")
           else pa.array(["x"], arr.type) for name, arr in empty.items()}
    pq.write_table(pa.table(row, schema=old), tmp_path / "nodes-old.parquet")
    table = read_node_logs(tmp_path)
    assert table.column("source").to_pylist() == ["draft"] and table.column("match_len").to_pylist() == [0]
    assert np.isnan(table.column("lookup_prob").to_numpy(zero_copy_only=False)[0])


def test_calibration_learns_per_domain_and_match_length() -> None:
    cal = LookupCalibration(rate=0.7, pseudo=4.0)
    assert cal.scale("prose", 1) == pytest.approx(0.7)
    for _ in range(50):
        cal.add("prose", 1, accepted=0, offered=2.0)  # one-word matches that never hold
        cal.add("code", 5, accepted=2, offered=2.0)  # long matches that always do
    assert cal.scale("prose", 1) < 0.05 and cal.scale("code", 4) > 0.95  # 4 and longer share a bucket
    assert cal.scale("prose", 2) == pytest.approx(0.7) and cal.scale("code", 1) == pytest.approx(0.7)
    frozen = LookupCalibration(learn=False)
    frozen.add("prose", 1, accepted=0, offered=5.0)
    assert frozen.scale("prose", 1) == pytest.approx(0.7)


def test_skip_rule_weighs_tokens_per_measured_millisecond() -> None:
    policy = Hybrid(NoDraft(), LOOK, skip_gain=2.0)
    assert not policy._skips(1.9)  # under the floor
    assert policy._skips(2.5)  # nothing known of drafting steps
    policy._drafted = (3.0, 40.0)  # drafting steps: 3 tokens accepted in 40 ms of forwards
    assert policy._skips(2.5)  # no lookup step timed yet: a probe times one
    policy._skip_ms = 20.0  # lookup steps take half the time: 2.5 tokens (+1) in 20 ms beat 3 (+1) in 40 ms
    assert policy._skips(2.5)
    policy._skip_ms = 40.0  # as long as a drafting step: 2.5 (+1) tokens lose to 3 (+1)
    assert not policy._skips(2.5)
    policy._drafted = (3.0, float("nan"))  # untimed drafting steps: tokens alone
    assert policy._skips(3.0) and not policy._skips(2.5)
