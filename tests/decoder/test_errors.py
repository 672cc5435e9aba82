"""Bad input gets a clear error naming the problem and the fix; real loading works on local folders."""

import pytest
from conftest import make_model, make_tokenizer
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from treewise.decoder import Chain, StaticTree, TreeDecoder, TreewiseError


@pytest.fixture(scope="module")
def dec(tokenizer):
    return TreeDecoder(make_model("llama", 0, max_pos=64), make_model("llama", 1, layers=1, max_pos=64), tokenizer)


def test_empty_prompt(dec) -> None:
    with pytest.raises(TreewiseError, match="empty"):
        dec.generate("")
    with pytest.raises(TreewiseError, match="no tokens"):
        dec.generate([])


def test_prompt_longer_than_context(dec) -> None:
    with pytest.raises(TreewiseError, match="context is 64"):
        dec.generate("x" * 80)


def test_bad_shapes_and_settings(dec) -> None:
    for bad in (lambda: StaticTree(width=0, depth=2), lambda: StaticTree(width=2, depth=0), lambda: Chain(0),
                lambda: StaticTree(branching=(2, 0))):
        with pytest.raises(TreewiseError, match=">= 1"):
            bad()
    with pytest.raises(TreewiseError, match="nodes"):
        StaticTree(width=4, depth=6)
    with pytest.raises(TreewiseError, match="max_new_tokens"):
        dec.generate("a", max_new_tokens=0)
    with pytest.raises(TreewiseError, match="temperature"):
        dec.generate("a", temperature=-1)
    with pytest.raises(TreewiseError, match="token ids"):
        dec.generate([5, 10_000])


def test_from_pretrained_local_folders(tiny_pair_dir) -> None:
    dec = TreeDecoder.from_pretrained(tiny_pair_dir / "target", tiny_pair_dir / "draft")
    assert dec.device.type == "cpu"
    out = dec.generate("hello", max_new_tokens=8, tree=StaticTree(2, 2))
    assert out.token_ids == dec.generate_plain("hello", max_new_tokens=8).token_ids


def test_mismatched_tokenizers(tiny_pair_dir, tmp_path) -> None:
    other = Tokenizer(models.WordLevel(vocab={"<unk>": 0, "a": 1, "b": 2}, unk_token="<unk>"))
    other.pre_tokenizer = pre_tokenizers.Whitespace()
    make_model("llama", 2, layers=1).save_pretrained(tmp_path / "draft")
    PreTrainedTokenizerFast(tokenizer_object=other, unk_token="<unk>").save_pretrained(tmp_path / "draft")
    with pytest.raises(TreewiseError, match="tokenizer.*differs"):
        TreeDecoder.from_pretrained(tiny_pair_dir / "target", tmp_path / "draft")


def test_mismatched_vocab_models() -> None:
    with pytest.raises(TreewiseError, match="vocabulary"):
        TreeDecoder(make_model("llama", 0), make_model("llama", 1, vocab=400), make_tokenizer())


def test_missing_model_folder(tmp_path) -> None:
    with pytest.raises(TreewiseError, match="does not exist"):
        TreeDecoder.from_pretrained(tmp_path / "nope", tmp_path / "nope2")


def test_treewise_data_must_name_a_folder(tmp_path, monkeypatch) -> None:
    """$TREEWISE_DATA overrides the installed data/; a folder that is not there is named, with the fix."""
    from treewise.decoder.paths import PACKAGED, data_dir, default_pair

    monkeypatch.delenv("TREEWISE_DATA", raising=False)
    assert data_dir() == PACKAGED and (PACKAGED / "predictor").is_dir()
    monkeypatch.setenv("TREEWISE_DATA", "")  # empty counts as unset
    assert data_dir() == PACKAGED
    monkeypatch.setenv("TREEWISE_DATA", str(tmp_path))
    assert data_dir() == tmp_path and default_pair() == (tmp_path / "models" / "target", tmp_path / "models" / "draft")
    for bad in (tmp_path / "missing", tmp_path / "a-file"):
        if bad.name == "a-file":
            bad.write_text("")
        monkeypatch.setenv("TREEWISE_DATA", str(bad))
        with pytest.raises(TreewiseError, match=r"TREEWISE_DATA=.*is not an existing folder.*unset it") as err:
            data_dir()
        assert str(bad) in str(err.value) and str(PACKAGED) in str(err.value)
