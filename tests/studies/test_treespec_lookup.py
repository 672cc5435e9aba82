"""The lookup tree kinds build the policies they name: a draft-free lookup, a suffix store, the hybrid."""

import math

from treewise.controller import Hybrid, LearnedTree
from treewise.decoder import NoDraft, StaticTree
from treewise.studies.shared.treespec import parse_tree_spec


def test_lookup_kinds_build_their_policies() -> None:
    lookup = parse_tree_spec("lookup:max_nodes=6,min_value=0.2").build(pair="micro")
    assert isinstance(lookup, Hybrid) and isinstance(lookup.inner, NoDraft) and lookup.store is None
    assert lookup.lookup.max_nodes == 6 and lookup.min_value == 0.2
    suffix = parse_tree_spec("suffix").build(pair="micro")
    assert isinstance(suffix.inner, NoDraft) and suffix.store is not None
    hybrid = parse_tree_spec("hybrid:skip_gain=3").build(pair="micro")
    assert isinstance(hybrid.inner, LearnedTree) and hybrid.store is not None and hybrid.skip_gain == 3
    assert parse_tree_spec("hybrid:store=false").build(pair="micro").store is None
    learned = parse_tree_spec("learned:lookup=true").build(pair="micro")
    assert isinstance(learned, Hybrid) and isinstance(learned.inner, LearnedTree)
    assert isinstance(parse_tree_spec("learned").build(pair="micro"), LearnedTree)


def test_static_with_lookup_logs_both_sources_every_step() -> None:
    policy = parse_tree_spec("static:width=2,depth=3,lookup=true").build()
    assert isinstance(policy, Hybrid) and isinstance(policy.inner, StaticTree) and math.isinf(policy.skip_gain)
    assert isinstance(parse_tree_spec("static:width=2,depth=3").build(), StaticTree)
