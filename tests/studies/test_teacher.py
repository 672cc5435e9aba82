"""Teacher data for the draft: the target's own answers and top-k logits, test split excluded, resumable."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from treewise.decoder.chat import chat_ids
from treewise.decoder.errors import TreewiseError
from treewise.studies.pair.teacher import MANIFEST, TeacherConfig, read_manifest, run_teacher, teacher_jobs


def suite(tmp_path: Path) -> Path:
    d = tmp_path / "suite"
    d.mkdir()
    rows = [{"id": f"p{i}", "domain": "code", "prompt": f"write code {i}", "split": split}
            for i, split in enumerate(["train", "train", "tune", "test", "train"])]
    (d / "code.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return d


def shards(out: Path) -> list[dict]:
    return [dict(np.load(p)) for p in sorted(out.glob("shard-*.npz"))]


def test_answers_are_the_targets_own_and_the_test_split_stays_out(chat_target, tmp_path) -> None:
    cfg = TeacherConfig(target=chat_target, out=tmp_path / "teacher", suite=suite(tmp_path), max_new_tokens=6,
                        batch_size=3, top_k=5)
    progress = run_teacher(cfg)
    keys = [k for s in shards(cfg.out) for k in s["keys"].tolist()]
    assert sorted(keys) == sorted(f"p{i}/{m}" for i in (0, 1, 2, 4) for m in ("greedy", "sampled"))
    assert progress.done == progress.total == 8 and progress.tokens > 0

    model = AutoModelForCausalLM.from_pretrained(chat_target).eval()
    tok = AutoTokenizer.from_pretrained(chat_target)
    for s in shards(cfg.out):
        starts = np.concatenate([[0], np.cumsum(s["prompt_len"])])
        for row, key in enumerate(s["keys"].tolist()):
            prompt = s["prompt_ids"][starts[row]:starts[row + 1]].tolist()
            assert prompt == chat_ids(tok, f"write code {key.split('/')[0][1:]}", cfg.max_prompt_tokens)
            n = int(s["answer_len"][row])
            answer = s["answer_ids"][row, :n].tolist()
            ids = torch.tensor([prompt + answer])
            with torch.no_grad():
                logits = model(ids).logits[0, len(prompt) - 1:len(prompt) - 1 + n]
            values, indices = logits.topk(cfg.top_k, dim=-1)
            assert np.array_equal(s["topk_ids"][row, :n], indices.numpy())
            np.testing.assert_allclose(s["topk_logits"][row, :n].astype(np.float32), values.numpy(), atol=2e-2)
            if key.endswith("/greedy"):
                assert answer == logits.argmax(-1).tolist()


def test_a_killed_run_resumes_without_repeating_a_prompt(chat_target, tmp_path) -> None:
    cfg = TeacherConfig(target=chat_target, out=tmp_path / "teacher", suite=suite(tmp_path), max_new_tokens=4,
                        batch_size=2, top_k=3, sampled=False)

    def kill(progress) -> None:
        raise KeyboardInterrupt  # after the first batch's shard and manifest are on disk

    with pytest.raises(KeyboardInterrupt):
        run_teacher(cfg, on_progress=kill)
    assert len(read_manifest(cfg.out)["done"]) == 2
    run_teacher(cfg)
    keys = [k for s in shards(cfg.out) for k in s["keys"].tolist()]
    assert sorted(keys) == sorted(f"p{i}/greedy" for i in (0, 1, 2, 4))
    assert json.loads((cfg.out / MANIFEST).read_text())["elapsed_s"] > 0


def test_several_suites_are_answered_in_one_mixed_order_and_colliding_ids_are_refused(chat_target, tmp_path) -> None:
    first = suite(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    rows = [{"id": f"q{i}", "domain": "math", "prompt": f"add {i} and {i}", "split": "train"} for i in range(6)]
    (other / "math.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = TeacherConfig(target=chat_target, out=tmp_path / "teacher", suite=(first, other), sampled=False)
    jobs = teacher_jobs(cfg)
    assert sorted(j.key for j in jobs) == sorted([f"p{i}/greedy" for i in (0, 1, 2, 4)]
                                                 + [f"q{i}/greedy" for i in range(6)])
    assert jobs == teacher_jobs(cfg), "the same order on every restart"
    assert [j.key for j in jobs] != sorted(j.key for j in jobs), "suites and domains are mixed, not in file order"
    (other / "code.jsonl").write_text(json.dumps({"id": "p0", "domain": "code", "prompt": "x", "split": "train"}))
    with pytest.raises(TreewiseError, match="'p0' is in more than one teacher suite"):
        teacher_jobs(cfg)
