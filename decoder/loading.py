"""Loading a target/draft pair from Hugging Face ids or local folders, with clear errors."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from treewise.decoder.kernels.linears import choose_linears
from treewise.decoder.kernels.mapped import (
    output_vocab,  # also registers the mapped draft class with AutoModelForCausalLM
)
from treewise.decoder.records.atomic import recover_dir

from .errors import TreewiseError
from .feature_draft import CONFIG as FEATURE_CONFIG
from .feature_draft import FeatureDraft

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}


# CPU features with bfloat16 arithmetic in hardware: without them a bf16 matmul is emulated, slower than float32.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")
PRECISIONS = ("exact", "fast")


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo; empty where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        if line.startswith("flags") and ":" in line:
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def pick_device_dtype(device: str | None, dtype: str | torch.dtype | None, precision: str | None = None,
                      flags: frozenset[str] | None = None) -> tuple[torch.device, torch.dtype]:
    """CUDA + bf16 when present, else CPU + float32; either can be overridden, or chosen by ``precision``:
    "exact" float32 anywhere (tree verification then reproduces plain greedy decoding token for token), "fast"
    bfloat16 on CUDA or on a CPU with bf16 hardware (``BF16_FLAGS``; ``flags``: the CPU's, read when None), whose
    batched verification may round a near-tie differently from one-token steps (docs/real-pair.md)."""
    dev = torch.device(device) if device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise TreewiseError("device 'cuda' was asked for but no CUDA GPU is visible: use device='cpu'")
    if precision is not None:
        if dtype is not None:
            raise TreewiseError(f"pass dtype or precision, not both (got dtype={dtype!r}, precision={precision!r})")
        return dev, _precision_dtype(dev, precision, flags)
    if dtype is None:
        return dev, torch.bfloat16 if dev.type == "cuda" else torch.float32
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise TreewiseError(f"unknown dtype {dtype!r}: use one of {sorted(_DTYPES)}")
        return dev, _DTYPES[dtype]
    return dev, dtype


def _precision_dtype(dev: torch.device, precision: str, flags: frozenset[str] | None) -> torch.dtype:
    if precision not in PRECISIONS:
        raise TreewiseError(f"unknown precision {precision!r}: use 'exact' (float32, the target's own greedy output "
                            "token for token) or 'fast' (bfloat16 where the hardware has it)")
    if precision == "exact":
        return torch.float32
    if dev.type == "cuda":
        return torch.bfloat16
    have = cpu_flags() if flags is None else flags
    if not any(f in have for f in BF16_FLAGS):
        raise TreewiseError("precision='fast' needs bfloat16 hardware (AMX-BF16 or AVX512-BF16), which this CPU "
                            "lacks: bfloat16 would run slower than float32 here; use precision='exact'")
    return torch.bfloat16


def load_pair(target: str | Path, draft: str | Path, device: str | None = None,
              dtype: str | torch.dtype | None = None, trust_remote_code: bool = False, precision: str | None = None,
              ) -> tuple[PreTrainedModel, PreTrainedModel, PreTrainedTokenizerBase]:
    dev, dt = pick_device_dtype(device, dtype, precision)
    tok = _load_tokenizer(target, trust_remote_code)
    draft_tok = _load_tokenizer(draft, trust_remote_code, required=False)
    if draft_tok is not None and draft_tok.get_vocab() != tok.get_vocab():
        raise TreewiseError(
            f"the draft's tokenizer ({draft}, {len(draft_tok)} tokens) differs from the target's ({target}, "
            f"{len(tok)} tokens): tree speculative decoding needs one shared vocabulary; pick a draft "
            "trained with the target's tokenizer"
        )
    model = _load_model(target, dev, dt, trust_remote_code)
    if (Path(draft) / FEATURE_CONFIG).is_file():  # a feature draft reads this target: it is loaded onto it
        return model, FeatureDraft.load(Path(draft), model).to(device=dev, dtype=dt), tok
    return model, _load_model(draft, dev, dt, trust_remote_code), tok


def check_pair(target: PreTrainedModel, draft: PreTrainedModel) -> None:
    vt, vd = output_vocab(target), output_vocab(draft)
    # Embedding tables are often padded to a multiple of 64/128; a larger gap means another tokenizer.
    if abs(vt - vd) > 128:
        raise TreewiseError(
            f"target vocabulary ({vt}) and draft vocabulary ({vd}) differ: the pair must share a tokenizer"
        )
    dt, dd = next(target.parameters()).device, next(draft.parameters()).device
    if dt != dd:
        raise TreewiseError(f"target is on {dt} but draft is on {dd}: move both to one device")


def _load_tokenizer(path: str | Path, trust_remote_code: bool, required: bool = True,
                    ) -> PreTrainedTokenizerBase | None:
    _check_local(path)
    try:
        with _quiet_loading():
            return AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        if not required:
            return None
        raise TreewiseError(f"cannot load a tokenizer from {path}: {_first_line(err)}; pass a model folder or "
                            "hub id that holds tokenizer files") from None


def _load_model(path: str | Path, device: torch.device, dtype: torch.dtype, trust_remote_code: bool,
                ) -> PreTrainedModel:
    _check_local(path)
    folder = Path(path)
    if folder.is_dir() and not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise TreewiseError(f"cannot load a causal LM from {path}: the folder holds no weights (*.safetensors or "
                            "*.bin); save the model there with model.save_pretrained(folder)")
    try:
        with _quiet_loading():
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as err:
        raise TreewiseError(f"cannot load a causal LM from {path}: {_first_line(err)}; pass a local model "
                            "folder (config.json + weights) or a reachable hub id") from None
    model = model.to(device).eval()
    if device.type == "cpu":
        choose_linears(model)  # few-row products as this CPU runs them faster (decoder/kernels/linears.py)
    return model


def _check_local(path: str | Path) -> None:
    """A path that can only be a local folder (absolute, relative, several parts) must exist.

    Without this, Hugging Face reads a missing folder as a malformed hub id and says so.
    """
    text = str(path)
    if not Path(text).exists():
        recover_dir(text)  # an export killed between its two renames (atomic_dir): the previous folder comes back
    if Path(text).exists():
        return
    looks_local = isinstance(path, Path) or text.startswith((".", "/", "~")) or text.count("/") > 1 or "\\" in text
    if looks_local:
        raise TreewiseError(f"the model folder {text} does not exist: check the path (or pass a hub id "
                            "such as 'org/name')")


@contextmanager
def _quiet_loading() -> Iterator[None]:
    """No weight-loading progress bars from library calls; the previous setting comes back afterwards."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _first_line(err: Exception) -> str:
    return str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
