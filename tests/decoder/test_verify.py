"""Verification is pure: exactness of each rule checked against the target distribution directly."""

import torch

from treewise.decoder import Acceptance, DraftTree, Sampling, VerifyInput, verify

V = 6


def _probs(seed: int, sharp: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(sharp * torch.randn(V, generator=g), -1)


def _tree_and_logits(mode: str, seed: int, g: torch.Generator | None = None,
                     ) -> tuple[DraftTree, torch.Tensor, dict[int, torch.Tensor]]:
    """Root with 3 children, the first of which has 2 children; target logits per node.

    In ``sampled`` mode the children are fresh i.i.d. draws from q on every call (using ``g``):
    SpecInfer's rule is exact in expectation over those draws.
    """
    q_root, q_child = _probs(seed + 1), _probs(seed + 2)
    if mode == "topk":
        c = torch.topk(q_root, 3).indices.tolist()
        gc = torch.topk(q_child, 2).indices.tolist()
    else:
        c = torch.multinomial(q_root, 3, replacement=True, generator=g).tolist()
        gc = torch.multinomial(q_child, 2, replacement=True, generator=g).tolist()
    tree = DraftTree.from_parents([-1, 0, 0, 0, 1, 1], [0, *c, *gc])
    p_nodes = torch.stack([_probs(seed + 10 + i) for i in range(tree.size)])
    return tree, torch.log(p_nodes), {0: q_root, 1: q_child}


def _first_two(acc: Acceptance, tree: DraftTree) -> tuple[int, int | None]:
    toks = tree.tokens[acc.path[1:]].tolist() + [acc.bonus]
    return toks[0], (toks[1] if len(toks) > 1 else None)


def _empirical(verifier, mode: str, n: int = 20000) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(V)
    for _ in range(n):
        tree, logits, q = _tree_and_logits(mode, seed=5, g=gen)
        acc = verifier(VerifyInput(tree, logits, Sampling(temperature=1.0), mode, q, gen))
        counts[_first_two(acc, tree)[0]] += 1
    return counts / n, torch.softmax(logits[0], -1)


def _always_accept(inp: VerifyInput) -> Acceptance:
    deepest = int(torch.argmax(inp.tree.depth))
    path = inp.tree.path_to(deepest)
    nan = torch.full((inp.tree.size,), float("nan"))
    return Acceptance(path, int(inp.target_logits[deepest].argmax()), torch.softmax(inp.target_logits, -1), nan)


def _tv(a: torch.Tensor, b: torch.Tensor) -> float:
    return 0.5 * float((a - b).abs().sum())


def test_topk_rule_is_exact() -> None:
    emp, exact = _empirical(verify, "topk")
    assert _tv(emp, exact) < 0.02


def test_sampled_rule_is_exact() -> None:
    emp, exact = _empirical(verify, "sampled")
    assert _tv(emp, exact) < 0.02


def test_broken_verifier_fails_the_same_check() -> None:
    emp, exact = _empirical(_always_accept, "topk", n=2000)
    assert _tv(emp, exact) > 0.05


def test_mixing_rules_loses_exactness() -> None:
    # Children drawn as top-k but verified with the SpecInfer rule: the known way to lose exactness.
    tree, logits, q = _tree_and_logits("topk", seed=5)
    assert _tv(_empirical(verify, "topk", n=2000)[0], torch.softmax(logits[0], -1)) < 0.05
    gen = torch.Generator().manual_seed(0)
    counts = torch.zeros(V)
    for _ in range(20000):
        acc = verify(VerifyInput(tree, logits, Sampling(temperature=1.0), "sampled", q, gen))
        counts[_first_two(acc, tree)[0]] += 1
    assert _tv(counts / 20000, torch.softmax(logits[0], -1)) > 0.03


def test_greedy_picks_longest_matching_path() -> None:
    # root(0) -> 1 (tok 3) -> 3 (tok 4); root -> 2 (tok 5)
    tree = DraftTree.from_parents([-1, 0, 0, 1], [9, 3, 5, 4])
    logits = torch.full((4, V), -5.0)
    logits[0, 3] = 5  # root argmax 3 -> node 1 accepted
    logits[1, 4] = 5  # node 1 argmax 4 -> node 3 accepted
    logits[3, 2] = 5  # bonus after node 3
    logits[2, 0] = 5
    acc = verify(VerifyInput(tree, logits, Sampling()))
    assert acc.path == [0, 1, 3] and acc.bonus == 2 and acc.accepted == 2
    logits[1, 4], logits[1, 1] = -5, 5  # now node 3 is wrong: bonus is node 1's argmax
    acc = verify(VerifyInput(tree, logits, Sampling()))
    assert acc.path == [0, 1] and acc.bonus == 1
