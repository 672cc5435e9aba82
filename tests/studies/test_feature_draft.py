"""The feature draft: save/load with its id map, and its training (it learns; a kill -9 resumes)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import make_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from treewise.decoder.errors import TreewiseError
from treewise.decoder.feature_draft import FeatureDraft
from treewise.studies.pair.feature_train import (
    FeatureTrainConfig,
    load_features,
    losses,
    make_batch,
    train_feature_draft,
)
from treewise.studies.pair.features import FeaturesConfig, run_features

ROOT = Path(__file__).resolve().parents[2]
KEPT = torch.tensor([2, 5, 7, 9, 11, 40, 41, 42, 43, 44, 50, 60, 70, 72, 75, 80, 81, 82, 83, 84, 85, 86, 87, 88])


def draft_folder(tmp_path: Path) -> Path:
    """A standalone draft's folder as far as the feature draft reads it: its kept-token map."""
    folder = tmp_path / "standalone"
    folder.mkdir()
    save_file({"to_target": KEPT}, str(folder / "model.safetensors"))
    return folder


def test_save_and_load_keep_the_draft_and_its_map(tmp_path) -> None:
    target = make_model("llama", 0)
    draft = FeatureDraft.from_target(target, KEPT)
    torch.manual_seed(1)
    tokens, feats = torch.randint(0, 96, (2, 7)), torch.randn(2, 7, 32)
    before = draft(tokens, feats)
    draft.save(tmp_path / "fd")
    saved = set(load_file(str(tmp_path / "fd" / "feature_draft.safetensors")))
    assert "to_target" in saved and not {"embed", "head"} & saved, "the target's embedding and head are not saved"
    again = FeatureDraft.load(tmp_path / "fd", target)
    after = again(tokens, feats)
    assert torch.equal(again.to_target, KEPT)
    torch.testing.assert_close(after.logits, before.logits)
    torch.testing.assert_close(after.features, before.features)
    full = again.target_logits(after.logits)
    assert full.shape[-1] == 96 and torch.isinf(full[..., 3]).all() and torch.equal(full[..., KEPT], after.logits)
    assert torch.equal(full.argmax(-1), KEPT[after.logits.argmax(-1)])
    with pytest.raises(TreewiseError, match="trained for a target of vocabulary 96"):
        FeatureDraft.load(tmp_path / "fd", make_model("llama", 0, vocab=120))
    with pytest.raises(TreewiseError, match="holds no feature draft"):
        FeatureDraft.load(tmp_path, target)


def conversations(tmp_path: Path, n: int = 24) -> Path:
    words = "alpha beta gamma delta".split()
    items = [{"id": f"c{i}", "conversations": [
        {"from": "human", "value": f"say {words[i % 4]}"},
        {"from": "gpt", "value": " ".join(words[(i + j) % 4] for j in range(12))}]} for i in range(n)]
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(items))
    return path


@pytest.fixture
def features(chat_target, tmp_path) -> Path:
    cfg = FeaturesConfig(target=chat_target, out=tmp_path / "feat", sharegpt=conversations(tmp_path), top_k=4,
                         batch_tokens=256)
    run_features(cfg)
    return cfg.out


def config(chat_target: Path, features: Path, tmp_path: Path, **kw: object) -> FeatureTrainConfig:
    return FeatureTrainConfig(features=(features,), target=chat_target, to_target=draft_folder(tmp_path),
                              work=tmp_path / "work", out=tmp_path / "out", threads=1, batch_tokens=512,
                              heldout_every=6, **kw)


def test_the_draft_learns_the_targets_next_token(chat_target, features, tmp_path) -> None:
    cfg = config(chat_target, features, tmp_path, minutes=0.15, lr=3e-3, passes=2)
    convs = load_features((features,))
    target = AutoModelForCausalLM.from_pretrained(chat_target)
    to_draft = torch.full((96,), -1, dtype=torch.long)
    to_draft[KEPT] = torch.arange(len(KEPT))
    batch = make_batch(convs, to_draft.numpy(), cfg.max_len)
    start = FeatureDraft.from_target(target, KEPT)
    with torch.no_grad():
        before, first = losses(start, batch, 2, 1.0)
    card = train_feature_draft(cfg)
    trained = FeatureDraft.load(cfg.out, target)
    with torch.no_grad():
        after, last = losses(trained, batch, 2, 1.0)
    assert float(after) < 0.7 * float(before)
    assert last[0]["hits"] > first[0]["hits"] and last[0]["slots"] == first[0]["slots"] > 0
    assert card["steps"] > 0 and card["heldout"]["sharegpt"]["tokens"] > 0
    assert len(card["heldout"]["sharegpt"]["top1_agreement"]) == 2
    assert "| held-out conversations | sharegpt |" in (cfg.out / "README.md").read_text()


DRIVER = """
import sys
from pathlib import Path
from treewise.studies.pair.feature_train import FeatureTrainConfig, train_feature_draft
cfg = FeatureTrainConfig.model_validate_json(Path(sys.argv[1]).read_text())
train_feature_draft(cfg, lambda p: print("step", p.step, flush=True) if p.step == 1 else None)
print("done", flush=True)
"""


def test_kill_9_mid_training_then_the_rerun_continues(chat_target, features, tmp_path) -> None:
    cfg = config(chat_target, features, tmp_path, minutes=0.12, checkpoint_every_s=0.2)
    (tmp_path / "cfg.json").write_text(cfg.model_dump_json())
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    run = [sys.executable, "-c", DRIVER, str(tmp_path / "cfg.json")]
    first = subprocess.Popen(run, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ckpt = cfg.work / "feature_draft.pt"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None and not ckpt.exists():
        time.sleep(0.01)
    time.sleep(0.3)
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL, first.stderr.read()[-2000:]
    assert not (cfg.out / "feature_draft.json").exists(), "the kill should land during training"
    state = torch.load(ckpt, weights_only=True)["state"]
    assert state["step"] > 0 and 0 < state["elapsed"] < cfg.minutes * 60
    again = subprocess.run(run, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "step 1\n" not in again.stdout, "the rerun continues from the checkpoint, not from step 1"
    final = torch.load(ckpt, weights_only=True)["state"]
    assert final["step"] > state["step"] and final["elapsed"] >= cfg.minutes * 60
    FeatureDraft.load(cfg.out, AutoModelForCausalLM.from_pretrained(chat_target))


def test_the_cli_gives_the_feature_draft_its_own_defaults_and_every_option(tmp_path) -> None:
    from treewise.studies.pair.distill_cli import feature_config
    from treewise.studies.shared.config import given as _given

    plain = feature_config([tmp_path / "f"], [], tmp_path / "t", 2, 2, _given({"out": None, "work": None, "lr": None}))
    assert plain.out.name == "smollm2-feature-draft" and plain.work == Path("runs/smollm2-feature-draft")
    fields = FeatureTrainConfig.model_fields
    assert (plain.lr, plain.minutes) == (fields["lr"].default, fields["minutes"].default) != (2e-3, 24.0)
    chosen = _given({"out": tmp_path / "o", "work": tmp_path / "w", "lr": 0.003, "minutes": 5.0, "batch_tokens": 1024})
    cfg = feature_config([tmp_path / "f"], [], tmp_path / "t", 2, 2, chosen)
    assert (cfg.out, cfg.work, cfg.lr, cfg.minutes, cfg.batch_tokens) == (tmp_path / "o", tmp_path / "w", 0.003, 5.0,
                                                                          1024)


def test_a_fresh_run_can_start_from_an_earlier_draft_and_its_minutes_add_up(chat_target, features, tmp_path) -> None:
    from treewise.studies.pair.feature_train import _start

    for run in ("a", "b"):
        (tmp_path / run).mkdir()
    first = train_feature_draft(config(chat_target, features, tmp_path / "a", minutes=0.05, passes=1))
    cfg = config(chat_target, features, tmp_path / "b", minutes=0.05, passes=1, init=tmp_path / "a" / "out")
    started = _start(cfg).draft.state_dict()
    earlier = FeatureDraft.load(tmp_path / "a" / "out", AutoModelForCausalLM.from_pretrained(chat_target)).state_dict()
    assert started.keys() == earlier.keys() and all(torch.equal(started[k], earlier[k]) for k in started)
    card = train_feature_draft(cfg)
    assert card["init"] == str(tmp_path / "a" / "out")
    assert card["total_cpu_minutes"] == pytest.approx(first["cpu_minutes"] + card["cpu_minutes"], abs=0.11)
    assert "training minutes in all" in (cfg.out / "README.md").read_text()
