"""`train-draft`: distillation from teacher shards on a tiny target. A kill -9 mid-training resumes from the last
checkpoint (step count, elapsed budget, weights), a finished run trains no further, held-out prompts stay out,
and the exported folder loads through AutoModelForCausalLM as a draft that reads and writes target ids."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from treewise.decoder.errors import TreewiseError
from treewise.decoder.kernels.mapped import MappedLlamaForCausalLM
from treewise.studies.pair.config import DistillConfig
from treewise.studies.pair.distill import heldout, kept_tokens, load_teacher, train_draft
from treewise.studies.pair.teacher import TeacherConfig, run_teacher

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
HELD_EVERY = 3

DRIVER = """
import sys
from pathlib import Path
from treewise.studies.pair.config import DistillConfig
from treewise.studies.pair.distill import train_draft
teacher, target, work, out = (Path(a) for a in sys.argv[1:5])
cfg = DistillConfig(teacher=teacher, target=target, work=work, out=out, layers=1, vocab=24, minutes=0.25,
                    batch_tokens=256, heldout_every=3, checkpoint_every_s=0.0, threads=1)
train_draft(cfg)
"""


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory, tiny_pair_dir: Path) -> tuple[Path, Path]:
    """Teacher shards of the tiny chat target: ten train prompts over two domains, greedy and sampled."""
    root = tmp_path_factory.mktemp("distill")
    target = root / "target"
    shutil.copytree(tiny_pair_dir / "target", target)
    tok = AutoTokenizer.from_pretrained(target)
    tok.chat_template = TEMPLATE
    tok.save_pretrained(target)
    suite = root / "suite"
    suite.mkdir()
    for dom in ("code", "math"):
        rows = [{"id": f"{dom}{i}", "domain": dom, "prompt": f"{dom} task {i}", "split": "train"} for i in range(5)]
        (suite / f"{dom}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    run_teacher(TeacherConfig(target=target, out=root / "teacher", suite=suite, max_new_tokens=12, batch_size=5,
                              top_k=4, threads=1))
    return root / "teacher", target


def _cfg(teacher: tuple[Path, Path], tmp: Path, minutes: float) -> DistillConfig:
    return DistillConfig(teacher=teacher[0], target=teacher[1], work=tmp / "work", out=tmp / "out", layers=1,
                         vocab=24, minutes=minutes, batch_tokens=256, heldout_every=HELD_EVERY,
                         checkpoint_every_s=0.0, threads=1)


def test_held_out_prompts_train_neither_weights_nor_the_kept_vocabulary(teacher) -> None:
    examples = load_teacher(teacher[0])
    held = {e.key for e in examples if heldout(e.key, HELD_EVERY)}
    assert held and len(held) < len(examples)
    assert all((e.key.replace("greedy", "sampled") in held) == (e.key in held) for e in examples)
    train = [e for e in examples if e.key not in held]
    kept = kept_tokens(train, 24, always=[2])
    assert 2 in kept and len(kept) == 24 and list(kept) == sorted(set(kept.tolist()))
    counts = np.bincount(np.concatenate([e.answer for e in train]), minlength=200)
    unkept = np.setdiff1d(np.arange(counts.size), kept)
    assert counts[np.setdiff1d(kept, [2])].min() >= counts[unkept].max()  # the most frequent in train answers


def test_kill_9_mid_training_then_the_rerun_resumes(teacher, tmp_path: Path) -> None:
    cfg = _cfg(teacher, tmp_path, 0.25)
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, "-c", DRIVER, str(cfg.teacher), str(cfg.target), str(cfg.work),
                              str(cfg.out)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = cfg.work / "draft.pt"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None and not ckpt.exists():
        time.sleep(0.01)
    time.sleep(1.0)  # more checkpoints, so the kill can land in the middle of one
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL, first.stderr.read()[-2000:]
    assert not cfg.out.exists(), "the kill should land during training, before the export"
    saved = torch.load(ckpt, weights_only=True)
    killed_at = saved["state"]["step"]
    assert killed_at > 0 and 0 < saved["state"]["elapsed"] < cfg.minutes * 60

    steps: list[int] = []
    card = train_draft(cfg, lambda p: steps.append(p.step))
    assert steps[0] == killed_at + 1, "the rerun starts after the last checkpoint, not from step 1"
    assert card["steps"] == steps[-1] and card["cpu_minutes"] >= cfg.minutes * 0.99

    # The budget is spent: the same command again trains no step and exports the same weights.
    again: list[int] = []
    before = (cfg.out / "model.safetensors").read_bytes()
    assert train_draft(cfg, lambda p: again.append(p.step))["steps"] == card["steps"] and not again
    assert (cfg.out / "model.safetensors").read_bytes() == before


def test_the_export_loads_as_a_draft_over_target_ids(teacher, tmp_path: Path) -> None:
    cfg = _cfg(teacher, tmp_path, 0.02)
    card = train_draft(cfg)
    assert json.loads((cfg.out / "training.json").read_text())["steps"] == card["steps"] > 0
    assert set(card["heldout"]) <= {"code", "math"} and card["heldout"]
    assert "top-1 agreement" in (cfg.out / "README.md").read_text()
    draft = AutoModelForCausalLM.from_pretrained(cfg.out)
    target = AutoModelForCausalLM.from_pretrained(cfg.target)
    assert isinstance(draft, MappedLlamaForCausalLM) and draft.to_target.numel() == 24
    assert not any(".lm_head" in k for k in draft.state_dict() if k != "lm_head.weight")
    ids = torch.tensor([[5, 40, 7, 60, 2]])
    logits = draft(input_ids=ids).logits
    assert logits.shape[-1] == target.config.vocab_size
    unkept = torch.ones(logits.shape[-1], dtype=torch.bool)
    unkept[draft.to_target] = False
    assert torch.isneginf(logits[..., unkept]).all() and torch.isfinite(logits[..., ~unkept]).all()


def test_a_foreign_checkpoint_is_one_clear_error(teacher, tmp_path: Path) -> None:
    cfg = _cfg(teacher, tmp_path, 0.02)
    cfg.work.mkdir(parents=True)
    (cfg.work / "draft.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(TreewiseError, match="not a train-draft checkpoint.*delete"):
        train_draft(cfg)


def test_the_export_is_the_checkpoint_with_the_lowest_held_out_loss(teacher, tmp_path: Path) -> None:
    cfg = _cfg(teacher, tmp_path, 0.05).model_copy(update={"select_every_s": 0.0, "lr": 0.05})
    card = train_draft(cfg)
    scores = card["selections"]
    assert len(scores) >= 2 and [s[0] for s in scores] == sorted(s[0] for s in scores)
    best = min(scores, key=lambda s: s[2])
    assert card["selected_step"] == best[0]
    saved = torch.load(cfg.work / "best.pt", weights_only=True)
    assert saved["step"] == best[0] and abs(saved["loss"] - best[2]) < 1e-3
    draft = AutoModelForCausalLM.from_pretrained(cfg.out)
    for name, value in saved["model"].items():
        if name != "lm_head.weight" and value.is_floating_point():
            torch.testing.assert_close(draft.state_dict()[name], value.to(torch.bfloat16).float())
    assert f"those of step {best[0]}" in (cfg.out / "README.md").read_text()
