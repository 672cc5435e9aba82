"""Property-based tests (hypothesis) of the text a user hands treewise: tree specs and suite JSONL.

Example tests pin the messages; these check the contract over inputs nobody thought of: any text either
parses or raises the parser's own error (a one-line message the CLI prints), never another exception,
and what parses round-trips.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from treewise.decoder import Chain, StaticTree, TreewiseError
from treewise.studies.shared.suites import Prompt, SuiteError, load_suite
from treewise.studies.shared.treespec import TreeSpecError, parse_tree_spec

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Kinds whose build needs no shipped file (learned/budgeted load the predictor; their parsing is still fuzzed).
BUILDABLE = ("static", "chain", "confidence", "dynamic_chain")

spec_text = st.one_of(
    st.text(max_size=60),
    st.builds(lambda kind, items: f"{kind}:" + ",".join(items),
              st.sampled_from(["static", "chain", "confidence", "dynamic_chain", "learned", "budgeted", "beam", ""]),
              st.lists(st.builds(lambda k, v: f"{k}={v}",
                                 st.sampled_from(["width", "depth", "branching", "length", "budget", "max_depth",
                                                  "top_k", "max_length", "threshold", "node_budget", "x", ""]),
                                 st.one_of(st.integers(-5, 2000).map(str), st.floats(allow_nan=True).map(str),
                                           st.text(max_size=8),
                                           st.lists(st.integers(-2, 9), min_size=1, max_size=8).map(
                                               lambda xs: "-".join(map(str, xs))))),
                       max_size=4)),
)


@FAST
@given(spec_text)
def test_any_tree_spec_parses_or_raises_its_own_error(text: str) -> None:
    try:
        spec = parse_tree_spec(text)
    except TreeSpecError as err:
        assert str(err) and "\n" not in str(err)
        return
    assert parse_tree_spec(spec.canonical) == spec  # the canonical form means the same tree
    if spec.kind in BUILDABLE:
        try:
            spec.build()
        except TreewiseError as err:  # a value out of range: named, with the spec
            assert str(err) and "\n" not in str(err)


@FAST
@given(st.integers(1, 4), st.integers(1, 4), st.permutations(["width", "depth"]), st.sampled_from(["", " ", "  "]))
def test_static_spec_round_trips_in_any_spelling(width: int, depth: int, order: list[str], pad: str) -> None:
    values = {"width": width, "depth": depth}
    text = f"{pad}static:{pad}" + f",{pad}".join(f"{k}={values[k]}" for k in order)
    spec = parse_tree_spec(text)
    assert spec.canonical == f"static:width={width},depth={depth}"
    assert spec.build() == StaticTree(width=width, depth=depth)


@FAST
@given(st.lists(st.integers(1, 3), min_size=1, max_size=5), st.integers(1, 16))
def test_branching_and_chain_specs_build_what_they_say(branching: list[int], length: int) -> None:
    spec = parse_tree_spec("static:branching=" + "-".join(map(str, branching)))
    assert spec.build() == StaticTree(branching=tuple(branching))
    assert parse_tree_spec(f"chain:length={length}").build() == Chain(length=length)


line_text = st.one_of(
    st.text(max_size=80),
    st.dictionaries(st.sampled_from(["id", "domain", "prompt", "split", "source", "extra"]),
                    st.one_of(st.text(max_size=10), st.integers(), st.none(), st.sampled_from(["train", "test"])),
                    max_size=6).map(json.dumps),
    st.just("[1, 2]"), st.just("null"), st.just('"text"'),
)


@FAST
@given(st.lists(line_text, max_size=6), st.binary(max_size=20))
def test_any_suite_file_loads_or_names_file_and_line(lines: list[str], tail: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "code.jsonl"
        path.write_bytes("\n".join(lines).encode("utf-8") + tail)
        try:
            prompts = load_suite(tmp)
        except SuiteError as err:
            assert str(err).startswith(str(path)) and "\n" not in str(err)
            return
        assert all(isinstance(p, Prompt) and p.prompt for p in prompts)
        assert len({p.id for p in prompts}) == len(prompts)


prompt = st.builds(Prompt, id=st.text(min_size=1, max_size=12), domain=st.sampled_from(["code", "math"]),
                   prompt=st.text(min_size=1, max_size=40), split=st.sampled_from([None, "train", "tune", "test"]),
                   source=st.one_of(st.none(), st.text(max_size=8)))


@FAST
@given(st.lists(prompt, max_size=8, unique_by=lambda p: p.id))
def test_suite_round_trips(prompts: list[Prompt]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        text = "".join(p.model_dump_json() + "\n" for p in prompts)
        (Path(tmp) / "all.jsonl").write_text(text, encoding="utf-8")
        if not prompts:
            assert load_suite(tmp) == []
            return
        assert load_suite(tmp) == prompts
        assert load_suite(tmp, split="test") == [p for p in prompts if p.split == "test"]
