"""Loading and limits: clear errors for bad folders, quiet loading, and a baseline held to the same context."""

from __future__ import annotations

import pytest
from conftest import make_model, make_tokenizer
from transformers import AutoConfig, AutoModelForCausalLM

from treewise.decoder import StaticTree, TreeDecoder, TreewiseError


def test_missing_folder_is_named(tmp_path) -> None:
    for missing in (tmp_path / "nope", str(tmp_path / "nope"), "runs/some/where"):
        with pytest.raises(TreewiseError, match="does not exist"):
            TreeDecoder.from_pretrained(missing, missing)


def test_folder_without_weights(tiny_pair_dir, tmp_path) -> None:
    AutoConfig.from_pretrained(tiny_pair_dir / "draft").save_pretrained(tmp_path / "empty")
    make_tokenizer().save_pretrained(tmp_path / "empty")
    with pytest.raises(TreewiseError, match="no weights"):
        TreeDecoder.from_pretrained(tiny_pair_dir / "target", tmp_path / "empty")


def test_loading_prints_no_progress_bars(tiny_pair_dir, capfd) -> None:
    capfd.readouterr()
    dec = TreeDecoder.from_pretrained(tiny_pair_dir / "target", tiny_pair_dir / "draft")
    assert dec.generate("hi", max_new_tokens=4, tree=StaticTree(2, 2)).token_ids
    out, err = capfd.readouterr()
    assert "Loading" not in err + out and "%|" not in err + out


def _model(seed: int, layers: int) -> AutoModelForCausalLM:
    model = make_model("llama", seed, layers=layers, max_pos=40)
    model.generation_config.eos_token_id = None
    return model


def test_plain_baseline_obeys_the_context_limit(tokenizer) -> None:
    """generate and its reference stop at the same context limit, with the same reason."""
    dec = TreeDecoder(_model(0, 2), _model(1, 1), tokenizer)
    prompt = "x" * 30
    plain, tree = dec.generate_plain(prompt, max_new_tokens=32), dec.generate(prompt, max_new_tokens=32)
    assert plain.finish_reason == tree.finish_reason == "context"
    assert plain.token_ids == tree.token_ids and len(plain.token_ids) == 40 - len(tokenizer(prompt).input_ids)
    assert dec.generate_plain(prompt, max_new_tokens=4).finish_reason == "length"


def test_folder_swapped_out_by_a_killed_export_comes_back(tiny_pair_dir, tmp_path) -> None:
    """A kill between atomic_dir's two renames leaves only `.NAME.old-*`: loading puts it back."""
    import shutil

    shutil.copytree(tiny_pair_dir / "target", tmp_path / ".target.old-1234")
    dec = TreeDecoder.from_pretrained(tmp_path / "target", tiny_pair_dir / "draft")
    assert (tmp_path / "target" / "config.json").exists() and not (tmp_path / ".target.old-1234").exists()
    assert dec.generate("hi", max_new_tokens=4).token_ids
