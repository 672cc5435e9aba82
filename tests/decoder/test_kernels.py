"""SkinnyLinear: the few-row CPU product gives nn.Linear's result, and the swap keeps the model as it was."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import make_model
from torch import nn

from treewise.decoder import StaticTree, TreeDecoder
from treewise.decoder.errors import TreewiseError
from treewise.decoder.kernels.linears import (
    LINEARS_ENV,
    SkinnyLinear,
    choose_linears,
    skinny_pays,
    swap_linears,
    use_skinny_linears,
)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(1, 1, 48), (1, 5, 48), (3, 48), (2, 7, 48), (4, 0, 48)])
def test_matches_linear(bias: bool, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    ref = nn.Linear(48, 80, bias=bias)
    skinny = SkinnyLinear(48, 80, bias=bias)
    skinny.load_state_dict(ref.state_dict())
    x = torch.randn(*shape)
    got, want = skinny(x), ref(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_one_row_is_the_plain_kernel() -> None:
    """One row (plain decoding) runs F.linear itself: bit-identical, not merely close."""
    torch.manual_seed(1)
    skinny = SkinnyLinear(64, 96)
    x = torch.randn(1, 1, 64)
    assert torch.equal(skinny(x), F.linear(x, skinny.weight, skinny.bias))


def test_swap_keeps_parameters_ties_and_outputs(tokenizer) -> None:
    model = make_model("llama", 0, layers=2)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ids = torch.tensor([[5, 9, 13, 21, 34]])
    with torch.inference_mode():
        want = model(ids).logits
    linears = sum(type(m) is nn.Linear for m in model.modules())
    assert use_skinny_linears(model) == linears > 0
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert model.state_dict().keys() == before.keys()
    with torch.inference_mode():
        torch.testing.assert_close(model(ids).logits, want, rtol=1e-5, atol=1e-5)
    assert use_skinny_linears(model) == 0  # already swapped: nothing left to do


@pytest.mark.parametrize("choice", ["skinny", "stock", "auto"])
def test_loaded_cpu_models_use_the_chosen_kind_and_stay_exact(tiny_pair_dir, monkeypatch, choice: str) -> None:
    monkeypatch.setenv(LINEARS_ENV, choice)
    dec = TreeDecoder.from_pretrained(tiny_pair_dir / "target", tiny_pair_dir / "draft", device="cpu")
    for model in (dec.target, dec.draft):
        skinny = any(isinstance(m, SkinnyLinear) for m in model.modules())
        assert skinny == (choice == "skinny") or choice == "auto"
        assert not (skinny and any(type(m) is nn.Linear for m in model.modules()))  # one kind throughout
    for prompt in ("hello there", "abc abc abc", "the cat"):
        tree = dec.generate(prompt, max_new_tokens=16, tree=StaticTree(2, 3))
        assert tree.token_ids == dec.generate_plain(prompt, max_new_tokens=16).token_ids


def test_swap_back_to_stock(tokenizer) -> None:
    model = make_model("llama", 2, layers=2)
    ids = torch.tensor([[3, 1, 4, 1, 5, 9]])
    with torch.inference_mode():
        want = model(ids).logits
    n = use_skinny_linears(model)
    assert swap_linears(model, nn.Linear) == n
    assert all(type(m) is not SkinnyLinear for m in model.modules())
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, want)  # the very modules it started with, bit for bit


def test_choice_follows_the_timing_and_the_override(monkeypatch) -> None:
    model = make_model("llama", 2, layers=2)
    monkeypatch.setenv(LINEARS_ENV, "auto")
    assert isinstance(skinny_pays(model), bool)  # a timing: either answer is right on some CPU
    assert choose_linears(model) == any(isinstance(m, SkinnyLinear) for m in model.modules())
    monkeypatch.setenv(LINEARS_ENV, "stock")
    assert not choose_linears(model) and not any(isinstance(m, SkinnyLinear) for m in model.modules())
    monkeypatch.setenv(LINEARS_ENV, "Skinny ")
    assert choose_linears(model) and not any(type(m) is nn.Linear for m in model.modules())
    monkeypatch.setenv(LINEARS_ENV, "fast")
    with pytest.raises(TreewiseError, match="auto, skinny or stock"):
        choose_linears(model)
