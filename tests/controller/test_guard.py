"""PayoffGuard's decisions on a scripted clock, and in LearnedTree / BudgetedTree on a real decode."""


import pytest
from conftest import DraftProb, make_model

from treewise.controller import BudgetedTree, BudgetsFile, DomainBudget, LatencyProfile, LearnedTree
from treewise.controller.guard import PayoffGuard
from treewise.decoder import TreeDecoder


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(guard: PayoffGuard, clock: Clock, steps: list[tuple[float, int]]) -> list[bool]:
    """Drive ``steps`` (ms a tree step takes, tokens it emits); a refused step is plain and takes 8 ms."""
    allowed = []
    for ms, tokens in steps:
        ok = guard.allow()
        allowed.append(ok)
        clock.now += (ms if ok else 8.0) / 1000
        guard.observe(verified=4 if ok else 0, accepted=tokens - 1 if ok else 0)
    return allowed


def test_drafting_that_pays_is_never_refused() -> None:
    clock = Clock()
    guard = PayoffGuard(plain_ms=8.0, clock=clock)
    guard.start()
    assert all(_run(guard, clock, [(12.0, 3)] * 40))  # 0.25 tokens/ms against 0.125


def test_drafting_that_does_not_pay_stops_after_warmup_and_probes() -> None:
    clock = Clock()
    guard = PayoffGuard(plain_ms=8.0, warmup=2, probe_every=4, clock=clock)
    guard.start()
    allowed = _run(guard, clock, [(14.0, 1)] * 30)  # 0.07 tokens/ms against 0.125
    # step 0 (prefill) is not measured; steps 1 and 2 make the warm-up; from step 3 on, plain with probes
    assert allowed[:4] == [True, True, True, False]
    later = "".join("T" if a else "p" for a in allowed[3:])
    assert later.startswith("pppp")
    # a probe drafts two steps (the first one feeds the draft what the plain steps committed, unmeasured)
    assert "pTTp" in later and "TTT" not in later
    assert max(len(r) for r in later.split("T")) <= 4  # never more than probe_every plain steps in a row


def test_a_probe_that_pays_again_resumes_drafting() -> None:
    clock = Clock()
    guard = PayoffGuard(plain_ms=8.0, warmup=2, probe_every=3, weight=0.5, clock=clock)
    guard.start()
    _run(guard, clock, [(14.0, 1)] * 12)
    assert not guard.pays
    allowed = _run(guard, clock, [(10.0, 5)] * 20)  # the request changed: 0.5 tokens/ms
    assert all(allowed[-10:])


def test_the_catch_up_step_after_plain_steps_is_not_measured() -> None:
    clock = Clock()
    guard = PayoffGuard(plain_ms=8.0, warmup=1, probe_every=2, weight=1.0, clock=clock)
    guard.start()
    _run(guard, clock, [(14.0, 1)] * 3)  # tree steps that do not pay: drafting stops
    assert not guard.pays
    # the request changed: a tree step now emits 5 tokens in 10 ms, but the first tree step after plain
    # steps also feeds the draft (catch-up) and takes 500 ms; measured, it would stop drafting for good
    kinds, prev = [], False
    for _ in range(12):
        ok = guard.allow()
        clock.now += (500.0 if ok and not prev else 10.0 if ok else 8.0) / 1000
        guard.observe(verified=4 if ok else 0, accepted=4 if ok else 0)
        kinds.append(ok)
        prev = ok
    assert guard.pays and all(kinds[-5:])


def test_the_prefill_step_is_not_measured() -> None:
    clock = Clock()
    guard = PayoffGuard(plain_ms=8.0, warmup=2, clock=clock)
    guard.start()
    allowed = _run(guard, clock, [(500.0, 1)] + [(12.0, 3)] * 10)  # a huge first step
    assert all(allowed)


def test_measured_plain_steps_replace_the_prior() -> None:
    clock = Clock()
    guard = PayoffGuard(plain_ms=8.0, warmup=1, probe_every=2, weight=1.0, clock=clock)
    guard.start()
    # tree steps: 1 token in 14 ms = 0.071/ms, under the prior's 0.125: refused at first
    allowed = []
    for _ in range(4):
        ok = guard.allow()
        allowed.append(ok)
        clock.now += (0.014 if ok else 0.020)  # this request's plain steps really take 20 ms (0.05/ms)
        guard.observe(verified=3 if ok else 0, accepted=0)
    assert allowed == [True, True, False, True]  # once a plain step was measured at 20 ms, the tree pays


def test_start_forgets_the_previous_request() -> None:
    clock = Clock()
    guard = PayoffGuard(plain_ms=8.0, warmup=1, clock=clock)
    guard.start()
    _run(guard, clock, [(30.0, 1)] * 6)
    assert not guard.pays
    guard.start()
    assert guard.pays and guard.allow()



@pytest.fixture(scope="module")
def dec(tokenizer) -> TreeDecoder:
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None
    return TreeDecoder(target, make_model("llama", 1, layers=1), tokenizer)  # an unrelated draft: little accepted


def _never_pays() -> PayoffGuard:
    # margin 1e9: no tree step can reach the plain rate, whatever this machine's timings
    return PayoffGuard(plain_ms=1.0, margin=1e9, warmup=1, probe_every=5)


@pytest.mark.parametrize("kind", ["learned", "budgeted"])
def test_policies_decode_plain_steps_when_the_guard_refuses_and_stay_lossless(dec, kind: str) -> None:
    budget = DomainBudget(policy="learned", node_budget=8, max_depth=3, max_width=3, threshold=0.0, cost_scale=0.0)
    if kind == "learned":
        policy = LearnedTree(DraftProb(), BudgetsFile(default=budget), guard=_never_pays(), probe_every=1000)
    else:
        policy = BudgetedTree(BudgetsFile(default=budget), DraftProb(), LatencyProfile.flat(1.0, 0.1),
                              guard=_never_pays())
    ref = dec.generate_plain("hello tree", max_new_tokens=40)
    out = dec.generate("hello tree", max_new_tokens=40, tree=policy)
    assert out.token_ids == ref.token_ids
    drafted = [s.draft_forwards > 0 for s in out.stats.steps]
    assert drafted[:3] == [True, True, False]  # step 0 unmeasured, step 1 the warm-up, step 2 judged on it
    later = "".join("T" if d else "p" for d in drafted[2:])
    assert later.startswith("ppppp") and "pTTp" in later and "TTT" not in later  # probes of two steps
