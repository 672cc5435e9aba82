"""`train-pair` killed with SIGKILL mid-training: what finished is intact and the rerun continues from the
last checkpoint (step count and elapsed budget), not from scratch; checkpoints load with weights_only=True."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from treewise.decoder.errors import TreewiseError
from treewise.studies.pair.corpus.build import DOMAINS, Corpus
from treewise.studies.pair.train import save_corpus

ROOT = Path(__file__).resolve().parents[2]

# The same function `treewise train-pair` runs, on a toy corpus and shapes, checkpointing every 0.2 s;
# it prints the first step of each stage so the test sees where a rerun starts.
DRIVER = """
import sys
from pathlib import Path
from treewise.studies.pair.config import ModelShape, PairConfig
from treewise.studies.pair.train import train_pair
work, out, minutes = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
tiny = ModelShape(layers=1, hidden=32, heads=2, ffn=64)
cfg = PairConfig(minutes=minutes, threads=1, work=work, out=out, vocab_size=300, window=16, context=32, batch=4,
                 long_every=3, target=tiny, draft=ModelShape(layers=1, hidden=16, heads=2, ffn=32), device="cpu",
                 checkpoint_every_s=0.2)
seen = set()
def progress(p):
    if p.stage not in seen:
        seen.add(p.stage)
        print(p.stage, "first step", p.step, flush=True)
train_pair(cfg, progress)
print("done", flush=True)
"""


def _corpus() -> Corpus:
    rng = np.random.default_rng(0)
    vocab = "alpha beta gamma delta epsilon zeta eta theta".split()
    docs = {d: [" ".join(rng.choice(vocab, 60)) for _ in range(20)] for d in DOMAINS}
    return Corpus(train=docs, valid={d: docs[d][:2] for d in DOMAINS})


def _driver(work: Path, out: Path, minutes: float, **kw: object) -> subprocess.Popen:
    env = os.environ | {"OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(work), str(out), str(minutes)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def test_kill_9_mid_training_then_the_rerun_continues(tmp_path: Path) -> None:
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    save_corpus(_corpus(), work)  # a toy corpus instead of the Debian sources
    first = _driver(work, out, 0.2)  # 8.6 s of target training: killed long before it ends
    ckpt = work / "target.pt"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and first.poll() is None and not ckpt.exists():
        time.sleep(0.005)
    time.sleep(0.5)  # a few more checkpoints, so the kill can land in the middle of one
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert first.returncode == -signal.SIGKILL, first.stderr.read()[-2000:]
    assert not (out / "target").exists(), "the kill should land during target training"
    # Everything finished before the kill is intact: the prep stages and the last checkpoint.
    tok = PreTrainedTokenizerFast.from_pretrained(work / "tokenizer")
    assert len(tok) > 10 and set(np.load(work / "tokens.npz").files) >= {f"train/{d}" for d in DOMAINS}
    state = torch.load(ckpt, weights_only=True)["state"]
    assert state["step"] > 0 and 0 < state["elapsed"] < 0.2 * 60 * 0.72
    # The same command again: it resumes the target from the checkpoint, then finishes both models.
    again = _driver(work, out, 0.2)
    stdout, stderr = again.communicate(timeout=300)
    assert again.returncode == 0, stderr[-2000:]
    assert f"target first step {state['step'] + 1}" in stdout and "draft first step 1" in stdout
    assert torch.load(ckpt, weights_only=True)["state"]["elapsed"] >= 0.2 * 60 * 0.72  # one budget, not two
    for name in ("target", "draft"):
        AutoModelForCausalLM.from_pretrained(out / name)
    assert not list(work.glob(".*")), "no temporaries left behind"


def test_checkpoint_with_pickled_code_or_another_shape_is_refused(tmp_path: Path) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from treewise.studies.pair.train import restore_checkpoint

    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    opt = torch.optim.AdamW(model.parameters())
    evil = tmp_path / "target.pt"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "state": {"step": Path("x")}}, evil)
    with pytest.raises(TreewiseError, match="not a train-pair checkpoint.*delete .*target.pt"):
        restore_checkpoint(evil, model, opt, torch.device("cpu"))
    other = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    torch.save({"model": other.state_dict(), "opt": {}, "state": {"step": 1}}, evil)
    with pytest.raises(TreewiseError, match="another model shape"):
        restore_checkpoint(evil, model, opt, torch.device("cpu"))
    evil.write_bytes(b"truncated")
    with pytest.raises(TreewiseError, match="not a train-pair checkpoint"):
        restore_checkpoint(evil, model, opt, torch.device("cpu"))
