"""Feature data for a feature draft: the target teacher-forced over conversations, held-out text kept out,
resumable."""

import json
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from treewise.studies.pair.features import (
    Conversation,
    FeaturesConfig,
    frame,
    read_manifest,
    read_sharegpt,
    run_features,
)

HELD_OUT = "the quick brown fox jumps over the lazy dog while seven wise owls count every falling star"


def sharegpt(tmp_path: Path, n: int = 6) -> Path:
    """A ShareGPT-shaped array cut off inside its last element, as the shipped file is."""
    items = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"question {i} about code"},
        {"from": "gpt", "value": f"answer {i} with some words"},
        {"from": "human", "value": "and more?"},
        {"from": "gpt", "value": f"more {i}"}]} for i in range(n)]
    items[2]["conversations"][1]["value"] = f"as told: {HELD_OUT}."  # shares text with a test prompt
    items[3]["conversations"] = [{"from": "system", "value": "x"}]  # no user turn first: not a conversation
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(items)[:-40])
    return path


def suite(tmp_path: Path) -> Path:
    d = tmp_path / "suite"
    d.mkdir()
    rows = [{"id": "t0", "domain": "code", "prompt": f"Repeat: {HELD_OUT}", "split": "test"},
            {"id": "t1", "domain": "code", "prompt": "answer 4 with some words and more", "split": "train"}]
    (d / "code.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return d


def shards(out: Path) -> list[dict]:
    return [dict(np.load(p)) for p in sorted(out.glob("shard-*.npz"))]


def test_read_sharegpt_keeps_whole_conversations_of_a_cut_file(tmp_path) -> None:
    convs = list(read_sharegpt(sharegpt(tmp_path)))
    assert [c.key for c in convs] == ["sharegpt/c0", "sharegpt/c1", "sharegpt/c2", "sharegpt/c4"]  # c5 is cut
    assert convs[0].turns[1] == ("assistant", "answer 0 with some words")


def test_frame_marks_the_assistants_tokens_only(chat_target) -> None:
    tok = AutoTokenizer.from_pretrained(chat_target)
    conv = Conversation("k", "sharegpt", (("user", "hello there"), ("assistant", "general kenobi"),
                                          ("user", "again"), ("assistant", "bold one")))
    ids, learned = frame(tok, conv, 1000)
    assert ids == tok.apply_chat_template([{"role": r, "content": t} for r, t in conv.turns], tokenize=True,
                                          return_dict=False)
    answers = tok.decode([i for i, keep in zip(ids, learned, strict=True) if keep])
    # the turns and their ends are learned (the test tokenizer reads a newline as unk), the prompts are not
    assert answers.replace(" ", "").replace("<unk>", "\n") == "generalkenobi\nboldone\n"
    cut = frame(tok, conv, 10)
    assert cut is None or len(cut[0]) == 10


def test_features_are_the_targets_own_and_held_out_text_stays_out(chat_target, tmp_path) -> None:
    cfg = FeaturesConfig(target=chat_target, out=tmp_path / "feat", sharegpt=sharegpt(tmp_path),
                         exclude=(suite(tmp_path),), batch_tokens=64, top_k=4)
    progress = run_features(cfg)
    data = shards(cfg.out)
    keys = [k for s in data for k in s["keys"].tolist()]
    assert sorted(keys) == ["sharegpt/c0", "sharegpt/c1", "sharegpt/c4"]  # c2 shares 12 words with a test prompt
    assert progress.dropped == 1 and progress.tokens == sum(int(s["predict"].sum()) for s in data) > 0

    model = AutoModelForCausalLM.from_pretrained(chat_target).eval()
    for s in data:
        starts = np.concatenate([[0], np.cumsum(s["seq_len"])])
        for row in range(len(s["keys"])):
            a, b = starts[row], starts[row + 1]
            ids = torch.tensor(s["ids"][a:b], dtype=torch.long)[None]
            with torch.no_grad():
                hidden = model.base_model(input_ids=ids).last_hidden_state[0]
                logp = torch.log_softmax(model(input_ids=ids).logits[0], dim=-1)
            np.testing.assert_allclose(s["hidden"][a:b], hidden.numpy(), atol=2e-2, rtol=1e-2)
            at = int(s["predict"][:a].sum())
            want = logp[torch.from_numpy(s["predict"][a:b])]
            got = s["topk_logp"][at:at + len(want)].astype(np.float32)
            np.testing.assert_allclose(got, want.topk(4, dim=-1).values.numpy(), atol=1e-2)
            assert not s["predict"][b - 1] and s["learned"][a + 1:b][s["predict"][a:b - 1]].all()


def test_a_stopped_build_resumes_without_repeating_a_conversation(chat_target, tmp_path) -> None:
    base = dict(target=chat_target, sharegpt=sharegpt(tmp_path, n=10), batch_tokens=40, top_k=2)
    whole = FeaturesConfig(out=tmp_path / "whole", **base)
    run_features(whole)
    parts = FeaturesConfig(out=tmp_path / "parts", max_tokens=1, **base)
    first = run_features(parts)  # stops after its first batch: the build has its token budget
    assert 0 < first.done < read_manifest(whole.out)["shards"] * 10
    resumed = run_features(parts.model_copy(update={"max_tokens": 10**9}))
    keys = [k for s in shards(parts.out) for k in s["keys"].tolist()]
    assert len(keys) == len(set(keys)) and sorted(keys) == sorted(k for s in shards(whole.out) for k in s["keys"])
    assert resumed.tokens == read_manifest(whole.out)["tokens"]
