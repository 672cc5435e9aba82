"""The decoder on a feature draft (decoder/feature_draft.py): exact output, and the draft reads the right features.

A feature draft's slot j reads the target's feature at position j beside token j + 1; a tree node reads the
draft's own guess at its parent. The reference below recomputes both by teacher-forcing the whole sequence, so a
feature taken from the wrong position, a stale cache slot or a node fed its grandparent's guess fails it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import VOCAB, make_model, make_tokenizer

from treewise.controller import ConfidenceTree, Hybrid, LearnedTree
from treewise.decoder import Chain, NodeLogWriter, StaticTree, TreeDecoder, TreewiseError, read_node_logs
from treewise.decoder.candidates.lookup import LookupConfig
from treewise.decoder.feature_draft import FeatureDraft
from treewise.decoder.policy import Candidates, Frontier, LevelPlan, RequestInfo, StepOutcome

PROMPTS = ["hello world, this is", "def f(x): return x +", "a b a b a b a", "(){}[]=+ (){}[]"]


@pytest.fixture(scope="module")
def pair():
    target = make_model("llama", 0)
    torch.manual_seed(3)
    draft = FeatureDraft.from_target(target, torch.arange(4, VOCAB - 8)).eval()
    with torch.no_grad():  # weights far from init: a feature or a position off by one changes every distribution
        for name, weight in draft.named_parameters():
            if name.endswith("proj.weight") or name == "fc.weight":
                weight.normal_(0.0, 0.5)
    return target, draft, make_tokenizer()


@pytest.fixture(scope="module")
def dec(pair):
    return TreeDecoder(*pair)


class Recording:
    """A policy that remembers every frontier it is shown (and otherwise is ``inner``)."""

    reads_draft_entropy = False

    def __init__(self, inner: StaticTree) -> None:
        self.inner, self.seen = inner, []

    def start(self, info: RequestInfo) -> None:
        self.inner.start(info)

    def plan(self, frontier: Frontier) -> LevelPlan:
        self.seen.append((frontier.position, frontier.depth, {k: np.array(v) for k, v in frontier.columns.items()}))
        return self.inner.plan(frontier)

    def finalize(self, candidates: Candidates) -> torch.Tensor | None:
        return self.inner.finalize(candidates)

    def observe(self, outcome: StepOutcome) -> None:
        self.inner.observe(outcome)


def _policies() -> dict[str, object]:
    return {"static": StaticTree(2, 3), "chain": Chain(4), "confidence": ConfidenceTree(budget=8, max_depth=4, top_k=2),
            "learned": LearnedTree.default(), "hybrid": Hybrid(StaticTree(2, 2), LookupConfig(max_nodes=8, max_depth=6),
                                                               min_value=0.0)}


@pytest.mark.parametrize("name", list(_policies()))
def test_greedy_equals_plain_solo_and_batched(dec, name: str) -> None:
    policy = _policies()[name]
    refs = [dec.generate_plain(p, max_new_tokens=24).token_ids for p in PROMPTS]
    solo = [dec.generate(p, max_new_tokens=24, tree=policy, domain="code").token_ids for p in PROMPTS]
    batch = dec.generate_batch(PROMPTS, max_new_tokens=[24, 5, 24, 9], tree=policy, max_batch=2)
    assert solo == refs
    assert [o.token_ids for o in batch] == [r[:m] for r, m in zip(refs, [24, 5, 24, 9], strict=True)]


def test_seeded_batch_equals_solo_sampling(dec) -> None:
    """Both sampling modes: each batched row draws what it draws alone (same seed, same draft features)."""
    for mode in ("topk", "sampled"):
        solo = [dec.generate(p, max_new_tokens=16, tree=StaticTree(2, 2), temperature=1.0, seed=i,
                             draft_mode=mode).token_ids for i, p in enumerate(PROMPTS)]
        batch = dec.generate_batch(PROMPTS, max_new_tokens=16, tree=StaticTree(2, 2), temperature=1.0,
                                   seed=list(range(len(PROMPTS))), draft_mode=mode, max_batch=3)
        # A row that joins a running batch reads its prompt alone first and drafts its first step, as a solo run
        # does; the batch's first rows carry their prompts in that step, which is then a plain one and draws
        # differently (both are samples of the target): the rows that joined later must equal solo.
        assert [o.token_ids for o in batch][3:] == solo[3:]


def _reference(pair, seq: list[int], extra: list[int]) -> torch.Tensor:
    """Log-probabilities over the target's vocabulary at the last of ``extra`` (tree tokens after ``seq``'s root),
    from one teacher-forced draft forward: true target features along ``seq``, the draft's guesses along ``extra``."""
    target, draft, _ = pair
    with torch.no_grad():
        feats = target(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states[-1][0]
        tokens, inputs = seq[1:], feats[:-1]
        step = draft(torch.tensor([tokens]), inputs[None])
        for token in extra:
            tokens, inputs = tokens + [token], torch.cat([inputs, step.features[0, -1:]])
            step = draft(torch.tensor([tokens]), inputs[None])
        return torch.log_softmax(draft.target_logits(step.logits[0, -1]), dim=-1)


def test_draft_distributions_equal_a_teacher_forced_reference(pair, dec) -> None:
    policy = Recording(StaticTree(2, 3))
    prompt = dec.tokenizer(PROMPTS[0]).input_ids
    out = dec.generate(prompt, max_new_tokens=20, tree=policy)
    checked = 0
    tokens: list[int] = []  # this step's candidates so far, by candidate index (levels in order)
    parents: list[int] = []
    for position, depth, cols in policy.seen:
        if depth == 0:
            tokens, parents = [], []
            continue
        seq = prompt + out.token_ids[:position]
        for token, parent, logprob in zip(cols["tokens"], cols["parent"], cols["draft_logprob"], strict=True):
            extra, p = [], int(parent)
            while p >= 0:  # the candidate's ancestors inside the tree, root excluded
                extra.insert(0, tokens[p])
                p = parents[p]
            ref = _reference(pair, seq, extra)
            assert float(logprob) == pytest.approx(float(ref[int(token)]), abs=1e-4)
            checked += 1
        tokens += [int(t) for t in cols["tokens"]]
        parents += [int(q) for q in cols["parent"]]
    assert checked >= 40


def test_an_oracle_feature_draft_is_always_accepted(tokenizer) -> None:
    """A bigram target (attention writes nothing, so its next token depends on the current one) and a draft that
    is its own layer: every drafted top-1 chain is the target's, so a chain of 4 is accepted whole; a draft cache
    holding a wrong token or position would break that."""
    target = make_model("llama", 0, layers=1)
    with torch.no_grad():
        target.model.layers[0].self_attn.o_proj.weight.zero_()
    draft = FeatureDraft.from_target(target, torch.arange(VOCAB)).eval()
    draft.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
    with torch.no_grad():
        hidden = target.config.hidden_size
        draft.fc.weight.zero_()
        draft.fc.weight[:, :hidden] = torch.eye(hidden)  # the token's embedding alone
        draft.fc.bias.zero_()
    dec = TreeDecoder(target, draft, tokenizer)
    out = dec.generate("abcabc", max_new_tokens=40, tree=Chain(4))
    assert out.token_ids == dec.generate_plain("abcabc", max_new_tokens=40).token_ids
    full = [s for s in out.stats.steps if s.verified == 4]
    assert full and all(s.accepted == 4 for s in full)


def test_node_logs_and_loading(pair, dec, tmp_path) -> None:
    target, draft, tok = pair
    log = NodeLogWriter(tmp_path / "logs")
    out = dec.generate(PROMPTS[1], max_new_tokens=16, tree=StaticTree(2, 2), log=log, domain="code")
    log.close()
    assert read_node_logs(tmp_path / "logs").num_rows == out.stats.drafted > 0
    target.save_pretrained(tmp_path / "target")
    tok.save_pretrained(tmp_path / "target")
    draft.save(tmp_path / "draft")
    loaded = TreeDecoder.from_pretrained(tmp_path / "target", tmp_path / "draft")
    assert loaded.reads_features
    assert loaded.generate(PROMPTS[1], max_new_tokens=16, tree=StaticTree(2, 2)).token_ids == out.token_ids


def test_assisted_generation_refuses_a_feature_draft(dec) -> None:
    with pytest.raises(TreewiseError, match="standalone"):
        dec.generate_plain(PROMPTS[0], max_new_tokens=4, assistant=dec.draft)
