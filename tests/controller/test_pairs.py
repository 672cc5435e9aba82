"""The pair registry: names resolve to folders and data files, a pair missing its own files borrows and says so,
and a chat pair's decoder frames text prompts by the chat template while the micro pair's does not."""

from __future__ import annotations

import pytest
from conftest import make_model, make_tokenizer

from treewise.controller.pairs import PAIR_ENV, default_pair_name, pair_files, pair_spec
from treewise.decoder import TreeDecoder, TreewiseError
from treewise.decoder.chat import chat_ids

TEMPLATE = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}</s>{% endfor %}" \
           "{% if add_generation_prompt %}<assistant>{% endif %}"


def test_default_is_the_real_pair_unless_the_variable_says_otherwise(monkeypatch) -> None:
    monkeypatch.delenv(PAIR_ENV, raising=False)
    assert default_pair_name() == "smollm2" and pair_spec().name == "smollm2" and pair_spec().chat
    monkeypatch.setenv(PAIR_ENV, "micro")
    assert pair_spec().name == "micro" and not pair_spec().chat
    monkeypatch.setenv(PAIR_ENV, "gpt5")
    with pytest.raises(TreewiseError, match=r"unknown model pair 'gpt5' \(from \$TREEWISE_PAIR\): choose one of "
                                            r"smollm2, micro"):
        pair_spec()
    with pytest.raises(TreewiseError, match="unknown model pair 'nope': choose"):
        pair_files("nope")


def test_micro_keeps_todays_files_and_smollm2_borrows_them_until_its_own_exist(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path))
    micro = pair_files("micro")
    assert (micro.latency, micro.budgets, micro.predictor, micro.borrowed) == (
        tmp_path / "latency.json", tmp_path / "budgets.json", tmp_path / "predictor", ())
    assert pair_spec("micro").draft_dir() == tmp_path / "models" / "draft"
    assert pair_spec("smollm2").draft_dir() == tmp_path / "models" / "smollm2-draft"
    real = pair_files("smollm2")
    assert (real.latency, real.budgets, real.predictor) == (micro.latency, micro.budgets, micro.predictor)
    assert [n.split(":")[0] for n in real.borrowed] == ["latency.json", "budgets.json", "predictor"]
    assert "borrowed from the micro pair" in real.borrowed[0] and "treewise latency --pair smollm2" in real.borrowed[0]
    (tmp_path / "smollm2").mkdir()
    (tmp_path / "smollm2" / "latency.json").write_text("{}")
    own = pair_files("smollm2")
    assert own.latency == tmp_path / "smollm2" / "latency.json" and own.budgets == micro.budgets
    assert [n.split(":")[0] for n in own.borrowed] == ["budgets.json", "predictor"]


@pytest.fixture(scope="module")
def chat_tokenizer():
    tok = make_tokenizer()
    tok.chat_template = TEMPLATE
    return tok


def test_chat_decoder_frames_text_prompts_and_plain_decoder_does_not(chat_tokenizer) -> None:
    target, draft = make_model("llama", 0), make_model("llama", 1, layers=1)
    framed = chat_ids(chat_tokenizer, "hi")
    assert chat_tokenizer.decode(framed) == "<user>hi</s><assistant>"
    chat = TreeDecoder(target, draft, chat_tokenizer, chat=True)
    plain = TreeDecoder(target, draft, chat_tokenizer)
    for run in (lambda d, p: d.generate(p, max_new_tokens=4), lambda d, p: d.generate_plain(p, max_new_tokens=4),
                lambda d, p: d.generate_batch([p], max_new_tokens=4)[0]):
        assert run(chat, "hi").prompt_ids == framed
        assert run(plain, "hi").prompt_ids == chat_tokenizer("hi").input_ids != framed
        assert run(chat, [5, 6]).prompt_ids == [5, 6]  # token ids are taken as given
    assert chat_tokenizer.decode(chat_ids(chat_tokenizer, "hello", max_tokens=3)) == "nt>"  # the last 3 kept


def test_chat_without_a_template_is_named(tokenizer) -> None:
    dec = TreeDecoder(make_model("llama", 0), make_model("llama", 1, layers=1), tokenizer, chat=True)
    with pytest.raises(TreewiseError, match="no chat template.*--pair micro"):
        dec.generate("hi", max_new_tokens=2)
