"""Node logging: schema, one row per drafted node, labels consistent with the accepted path, crash safety."""

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import make_model

from treewise.decoder import (
    FEATURE_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    TOKEN_TYPES,
    NodeLogError,
    NodeLogWriter,
    StaticTree,
    TreeDecoder,
    read_node_logs,
)


@pytest.fixture(scope="module")
def dec(tokenizer):
    return TreeDecoder(make_model("llama", 0), make_model("llama", 1, layers=1), tokenizer)


def test_rows_match_drafted_nodes_and_labels(dec, tmp_path) -> None:
    writer = NodeLogWriter(tmp_path)
    outs = [dec.generate(p, max_new_tokens=20, tree=StaticTree(2, 3), domain="code", prompt_id=f"p{i}",
                         run_id="r", log=writer) for i, p in enumerate(["def f(x):", "hello there"])]
    writer.close()
    table = read_node_logs(tmp_path)
    assert table.schema.equals(SCHEMA, check_metadata=False)
    meta = pq.read_schema(writer.written[0]).metadata
    assert meta[b"treewise.schema_version"].decode() == SCHEMA_VERSION
    assert table.num_rows == sum(o.stats.drafted for o in outs)
    df = table.to_pydict()
    assert set(df["token_type"]) <= set(TOKEN_TYPES)
    assert set(df["domain"]) == {"code"}
    for pid, out in zip(["p0", "p1"], outs, strict=True):
        rows = [i for i, p in enumerate(df["prompt_id"]) if p == pid]
        steps = sorted({df["step"][i] for i in rows})
        assert steps == list(range(out.stats.n_steps))
        for step, st in enumerate(out.stats.steps):
            r = [i for i in rows if df["step"][i] == step]
            assert len(r) == st.drafted
            assert sum(df["verified"][i] for i in r) == st.verified
            on_path = [i for i in r if df["on_accepted_path"][i]]
            assert len(on_path) == st.accepted
            # the accepted path is a chain of argmax matches starting at depth 1
            assert sorted(df["depth"][i] for i in on_path) == list(range(1, st.accepted + 1))
            assert all(df["target_argmax_match"][i] for i in on_path)
            for i in r:
                if df["verified"][i] and df["parent_id"][i] != -1:
                    assert df["verified"][r[0] + df["parent_id"][i] - df["node_id"][r[0]]]
    probs = np.asarray(df["target_prob"])
    assert ((probs >= 0) & (probs <= 1)).all()
    assert np.isnan(np.asarray(df["accept_prob"], dtype=float)).all()  # greedy never uses it


def test_logged_features_are_what_the_policy_saw(dec, tmp_path) -> None:
    """Frontier.features() (before verification) and the node-log rows come from one definition."""
    class Recording(StaticTree):
        seen: list = []  # class attribute, not a field: shared by any per-request copy of the policy

        def plan(self, frontier):
            if frontier.depth >= 1:
                Recording.seen.append((frontier.step, frontier.features()))
            return super().plan(frontier)

    writer = NodeLogWriter(tmp_path)
    dec.generate("def f(x):", max_new_tokens=12, tree=Recording(2, 3), temperature=0.7, seed=1, domain="code",
                 prompt_id="p", log=writer)
    writer.close()
    rows = read_node_logs(tmp_path)
    steps = np.asarray(rows.column("step"))
    names = [n for n in FEATURE_COLUMNS if n not in ("run_id", "prompt_id", "step", "node_id", "parent_id")]
    assert Recording.seen and set(Recording.seen[0][1]) == set(names)
    for step in sorted(set(steps.tolist())):
        levels = [f for s, f in Recording.seen if s == step]  # StaticTree keeps every candidate, level by level
        for name in names:
            seen = np.concatenate([f[name] for f in levels])
            logged = np.asarray(rows.column(name))[steps == step]
            assert seen.dtype == logged.dtype or name in ("domain", "token_type"), name
            np.testing.assert_array_equal(seen, logged.astype(seen.dtype), err_msg=f"step {step} column {name}")


def test_sampling_logs_accept_prob(dec, tmp_path) -> None:
    writer = NodeLogWriter(tmp_path)
    dec.generate("abc", max_new_tokens=10, temperature=1.0, seed=0, log=writer)
    writer.close()
    df = read_node_logs(tmp_path).to_pydict()
    tried = [p for p in df["accept_prob"] if p == p]
    assert tried and all(0 <= p <= 1 for p in tried)


def test_file_survives_a_crash(dec, tmp_path) -> None:
    writer = NodeLogWriter(tmp_path, flush_every=1)
    with pytest.raises(RuntimeError), writer:
        dec.generate("first", max_new_tokens=8, prompt_id="done", log=writer)

        class Boom(StaticTree):
            def plan(self, frontier):
                if frontier.step == 2:
                    raise RuntimeError("killed midway")
                return super().plan(frontier)

        dec.generate("second", max_new_tokens=8, prompt_id="killed", tree=Boom(2, 2), log=writer)
    assert not list(tmp_path.glob("*.tmp"))
    table = read_node_logs(tmp_path)
    assert set(table.column("prompt_id").to_pylist()) == {"done"}


def test_reader_errors(tmp_path) -> None:
    with pytest.raises(NodeLogError, match="treewise collect"):
        read_node_logs(tmp_path)
    import pyarrow as pa
    pq.write_table(pa.table({"x": [1]}).replace_schema_metadata({b"treewise.schema_version": b"0"}),
                   tmp_path / "old.parquet")
    with pytest.raises(NodeLogError, match="schema version"):
        read_node_logs(tmp_path)


def _one_part(dec, folder) -> "object":
    with NodeLogWriter(folder) as log:
        dec.generate("abc", max_new_tokens=6, tree=StaticTree(2, 2), log=log, prompt_id="p")
    return log.written[-1]


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "bad_page"])
def test_damaged_part_is_named_not_a_traceback(dec, tmp_path, damage) -> None:
    from treewise.decoder import TreewiseError
    from treewise.decoder.records.nodelog import part_is_readable

    good = _one_part(dec, tmp_path)
    bad = tmp_path / "nodes-bad.parquet"
    data = good.read_bytes()
    if damage == "truncated":  # a crash mid-copy, a full disk
        bad.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        bad.write_bytes(b"not parquet at all\n")
    elif damage == "empty":
        bad.write_bytes(b"")
    else:  # footer intact, a data page overwritten
        bad.write_bytes(data[:8] + b"\xff" * 200 + data[208:])
    with pytest.raises(TreewiseError, match=f"{bad}: .*(truncated or corrupt|corrupt node-log).*treewise collect"):
        read_node_logs(tmp_path)
    assert part_is_readable(good)
    assert part_is_readable(bad) == (damage == "bad_page")
    assert isinstance(NodeLogError("x"), TreewiseError)  # the CLI's one-line handler catches it
