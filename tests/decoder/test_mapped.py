"""A draft with a cut vocabulary (MappedLlamaForCausalLM): the id map, loading, and exact output when the
target says tokens the draft can never propose."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import make_model, make_tokenizer
from test_sampling import P_MIN, TV_BOUND, _tv_and_p
from transformers import AutoModelForCausalLM

from treewise.decoder import StaticTree, TreeDecoder
from treewise.decoder.kernels.mapped import MappedLlamaConfig, MappedLlamaForCausalLM, output_vocab
from treewise.decoder.verify import Sampling


def mapped_draft(target_vocab: int, kept: list[int], seed: int = 3) -> MappedLlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = MappedLlamaConfig(target_vocab_size=target_vocab, vocab_size=len(kept) + 1, hidden_size=32,
                            intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=256, tie_word_embeddings=True, eos_token_id=2, pad_token_id=0)
    draft = MappedLlamaForCausalLM(cfg).eval()
    draft.set_map(torch.tensor(kept))
    return draft


def test_ids_map_both_ways_and_unkept_tokens_get_no_mass() -> None:
    draft = mapped_draft(20, [7, 3, 12, 0])
    assert draft.draft_ids(torch.tensor([7, 3, 12, 0, 5, 19])).tolist() == [0, 1, 2, 3, 4, 4]  # 4: ``other``
    logits = draft(input_ids=torch.tensor([[7, 5, 12]])).logits
    assert logits.shape == (1, 3, 20) and output_vocab(draft) == 20
    finite = torch.isfinite(logits[0]).nonzero()[:, 1].unique().tolist()
    assert finite == [0, 3, 7, 12]


def test_set_map_rejects_bad_maps() -> None:
    draft = mapped_draft(20, [1, 2, 3])
    with pytest.raises(ValueError, match="distinct"):
        draft.set_map(torch.tensor([1, 1, 2]))
    with pytest.raises(ValueError, match="lie in"):
        draft.set_map(torch.tensor([1, 2, 20]))


def test_saved_folder_loads_through_the_auto_class(tmp_path: Path) -> None:
    draft = mapped_draft(30, [29, 4, 8, 15, 16])
    draft.save_pretrained(tmp_path)
    back = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    ids = torch.tensor([[4, 9, 29, 15]])
    assert type(back) is MappedLlamaForCausalLM and back.to_target.tolist() == [29, 4, 8, 15, 16]
    torch.testing.assert_close(back(input_ids=ids).logits, draft(input_ids=ids).logits)


def test_greedy_output_is_exact_when_the_target_says_unkept_tokens() -> None:
    tok = make_tokenizer()
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None
    prompt = [5, 6, 7, 8]
    plain = TreeDecoder(target, make_model("llama", 1, layers=1), tok).generate_plain(prompt, max_new_tokens=32)
    said = sorted(set(plain.token_ids))
    # Keep half of what the target says and a few tokens it never says: many target tokens are undraftable.
    kept = said[::2] + [t for t in range(4, 96) if t not in said][:10]
    dec = TreeDecoder(target, mapped_draft(96, kept), tok)
    out = dec.generate(prompt, max_new_tokens=32, tree=StaticTree(width=2, depth=3))
    assert any(t not in kept for t in out.token_ids)
    assert out.token_ids == plain.token_ids


def test_hf_assisted_generation_takes_it_as_the_targets_assistant() -> None:
    """``generate(assistant_model=...)`` pairs models by the logits' width: the draft must report the target's."""
    target = make_model("llama", 0)
    target.generation_config.eos_token_id = None
    prompt = torch.tensor([[5, 6, 7, 8]])
    plain = target.generate(prompt, max_new_tokens=24, do_sample=False)
    said = sorted(set(plain[0, 4:].tolist()))
    kept = said[::2] + [t for t in range(4, 96) if t not in said][:3]
    draft = mapped_draft(96, kept)
    assert draft.config.vocab_size == len(kept) + 1 and draft.config.get_text_config().vocab_size == 96
    draft.generation_config.eos_token_id = None
    assisted = target.generate(prompt, max_new_tokens=24, do_sample=False, assistant_model=draft)
    assert assisted.tolist() == plain.tolist()


def test_sampling_follows_the_target_with_a_cut_draft() -> None:
    vocab = 8
    tok = make_tokenizer(vocab)
    target = make_model("llama", 0, vocab=vocab)
    with torch.no_grad():
        target.get_output_embeddings().weight.mul_(0.15)
    target.generation_config.eos_token_id = None
    draft = mapped_draft(vocab, [4, 6], seed=5)  # tokens 5 and 7 are never drafted
    tv, p_value = _tv_and_p(TreeDecoder(target, draft, tok), [5, 6, 7], Sampling(temperature=1.0), "topk")
    assert tv < TV_BOUND and p_value > P_MIN
