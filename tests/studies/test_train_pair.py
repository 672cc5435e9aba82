"""The pair recipe on a toy corpus: tokenizer, resumable training stage, HF export and warm start."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

from treewise.decoder.errors import TreewiseError
from treewise.studies.pair.corpus.build import DOMAINS, Corpus
from treewise.studies.pair.train import (
    ModelShape,
    PairConfig,
    encode_docs,
    export_model,
    llama_config,
    load_init,
    train_stage,
    train_tokenizer,
)

TINY = ModelShape(layers=1, hidden=32, heads=2, ffn=64)


def _corpus(words: str) -> Corpus:
    rng = np.random.default_rng(0)
    vocab = words.split()
    docs = {d: [" ".join(rng.choice(vocab, 60)) for _ in range(20)] for d in DOMAINS}
    return Corpus(train=docs, valid={d: docs[d][:2] for d in DOMAINS})


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    tok = train_tokenizer(_corpus("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu"), 300)
    tokens = {d: encode_docs(tok, docs) for d, docs in _corpus("alpha beta gamma delta epsilon").train.items()}
    cfg = PairConfig(
        work=tmp_path_factory.mktemp("work"),
        window=16,
        context=32,
        batch=4,
        long_every=3,
        checkpoint_every_s=1e9,
        target=TINY,
        draft=TINY,
    )
    return tok, tokens, cfg


def _model(cfg: PairConfig, tok, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    return LlamaForCausalLM(llama_config(cfg.target, cfg, tok))


def test_stage_trains_and_resumes_from_its_checkpoint(toy):
    tok, tokens, cfg = toy
    quiet = lambda p: None  # noqa: E731
    model = _model(cfg, tok)
    first = train_stage("target", model, cfg, tokens, budget_s=1.5, peak_lr=3e-3, on_progress=quiet)
    assert first.steps > 0 and (cfg.work / "target.pt").exists()
    again = _model(cfg, tok, seed=1)  # other init: the checkpoint must overwrite it
    same = train_stage("target", again, cfg, tokens, budget_s=1.5, peak_lr=3e-3, on_progress=quiet)
    assert (same.steps, same.tokens) == (first.steps, first.tokens)  # budget spent: nothing more to do
    for a, b in zip(model.parameters(), again.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    more = train_stage("target", again, cfg, tokens, budget_s=3.0, peak_lr=3e-3, on_progress=quiet)
    assert more.steps > first.steps and more.seconds >= 3.0  # the clock continues from 1.5 s
    assert more.final_loss < np.log(len(tok))  # learned something on a 5-word language


def test_export_loads_with_auto_classes_and_warm_start_restores_it(toy, tmp_path):
    tok, tokens, cfg = toy
    model = _model(cfg, tok, seed=3)
    export_model(model, tok, tmp_path / "target")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "target")
    assert AutoTokenizer.from_pretrained(tmp_path / "target").get_vocab() == tok.get_vocab()
    warm = _model(cfg, tok, seed=4)
    load_init(warm, tmp_path / "target", tok)
    ids = torch.tensor([tok.encode("alpha beta gamma delta")])
    torch.testing.assert_close(warm(input_ids=ids).logits, loaded(input_ids=ids).logits)
    assert warm.lm_head.weight.data_ptr() == warm.model.embed_tokens.weight.data_ptr()  # still tied


def test_warm_start_refuses_other_tokenizer_shape_or_folder(toy, tmp_path):
    tok, _, cfg = toy
    export_model(_model(cfg, tok), tok, tmp_path / "ok")
    other = train_tokenizer(_corpus("one two three four five six seven eight nine ten"), 280)
    with pytest.raises(TreewiseError, match="another tokenizer"):
        load_init(LlamaForCausalLM(llama_config(TINY, cfg, other)), tmp_path / "ok", other)
    wider = cfg.model_copy(update={"target": ModelShape(layers=2, hidden=32, heads=2, ffn=64)})
    with pytest.raises(TreewiseError, match="another model shape"):
        load_init(LlamaForCausalLM(llama_config(wider.target, cfg, tok)), tmp_path / "ok", tok)
    with pytest.raises(TreewiseError, match="--init-from"):
        load_init(_model(cfg, tok), tmp_path / "missing", tok)


def test_card_lists_every_run_of_a_warm_started_pair():
    from treewise.studies.pair.card import train_rows

    run = {"stage": "target", "steps": 10, "tokens": 1000, "seconds": 60.0, "final_loss": 3.0, "params": 10}
    meta = {"shapes": {"target": "1 x 32", "draft": "1 x 16"}}
    results = [run, {**run, "stage": "draft"}]
    assert [r.split(" | ")[0] for r in train_rows(results, meta)] == ["| target", "| draft"]
    meta["history"] = [{**r, "label": f"{r['stage']} (run 1)"} for r in results]
    labels = [r.split(" | ")[0] for r in train_rows(results, meta)]
    assert labels == ["| target (run 1)", "| draft (run 1)", "| target (run 2)", "| draft (run 2)"]


def test_loop_detector_and_card_verdict():
    from treewise.studies.pair.card import checks
    from treewise.studies.pair.evaluate import ends_in_loop, repeated_ngram_fraction

    rng = np.random.default_rng(0)
    varied = rng.integers(0, 5000, 96).tolist()
    looped = varied[:40] + [7, 8, 9, 10, 11] * 12
    assert not ends_in_loop(varied) and ends_in_loop(looped)
    assert not ends_in_loop([1, 2] * 10)  # too short: it stopped at EOS, not stuck
    assert repeated_ngram_fraction(looped) > 0.5 > repeated_ngram_fraction(varied)
    row = {"domain": "code", "target_ppl": 9.0, "draft_ppl": 12.0, "repeated_4gram": 0.3, "reference_4gram": 0.2}
    assert "Not met" not in " ".join(checks([{**row, "looping": 0.0}], 10**6, "a CPU"))
    assert "Not met" in " ".join(checks([{**row, "looping": 0.5}], 10**6, "a CPU"))
    assert "Not met" in " ".join(checks([{**row, "repeated_4gram": 0.6, "looping": 0.0}], 10**6, "a CPU"))


def test_whole_recipe_on_a_toy_corpus_then_warm_start(tmp_path):
    from treewise.studies.pair.train import resolve_device, save_corpus, train_pair

    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    save_corpus(_corpus("alpha beta gamma delta epsilon zeta eta theta"), work)  # skips the Debian sources
    cfg = PairConfig(
        minutes=0.04,
        work=work,
        out=out,
        vocab_size=300,
        window=16,
        context=32,
        batch=4,
        target=TINY,
        draft=ModelShape(layers=1, hidden=16, heads=2, ffn=32),
        device="cpu",
    )
    results = train_pair(cfg)
    assert [r.stage for r in results] == ["target", "draft"] and all(r.steps > 0 for r in results)
    for name in ("target", "draft"):
        AutoModelForCausalLM.from_pretrained(out / name)
    meta = json.loads((work / "train_meta.json").read_text())
    assert meta["device"].startswith("CPU") and meta["config"]["target"]["hidden"] == TINY.hidden
    again = cfg.model_copy(update={"work": tmp_path / "work2", "init_from": out, "out": tmp_path / "out2"})
    again.work.mkdir()
    for f in ("corpus_train.jsonl", "corpus_valid.jsonl"):
        (again.work / f).write_bytes((work / f).read_bytes())
    (again.work / "tokenizer").mkdir()
    for f in (work / "tokenizer").iterdir():
        (again.work / "tokenizer" / f.name).write_bytes(f.read_bytes())
    assert all(r.steps > 0 for r in train_pair(again))  # warm-started from the first run's export
    if not torch.cuda.is_available():
        with pytest.raises(TreewiseError, match="no CUDA"):
            resolve_device("cuda")
