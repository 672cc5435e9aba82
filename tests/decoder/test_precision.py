"""Precision modes: "exact" is float32 anywhere (and decodes the target's own greedy output token for token),
"fast" is bfloat16 only where the hardware does bf16 arithmetic; a CPU without it is refused, with the fix."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from treewise.decoder import TreeDecoder, TreewiseError
from treewise.decoder.loading import cpu_flags, pick_device_dtype

XEON = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"
EPYC = "processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n"


def test_fast_is_bf16_only_where_the_cpu_has_bf16_hardware() -> None:
    assert pick_device_dtype("cpu", None, "fast", cpu_flags(XEON)) == (torch.device("cpu"), torch.bfloat16)
    with pytest.raises(TreewiseError, match="needs bfloat16 hardware .* use precision='exact'"):
        pick_device_dtype("cpu", None, "fast", cpu_flags(EPYC))
    assert cpu_flags("") == frozenset() and "amx_bf16" in cpu_flags(XEON)


def test_exact_is_float32_and_the_default_is_unchanged() -> None:
    assert pick_device_dtype("cpu", None, "exact", cpu_flags(XEON))[1] == torch.float32
    assert pick_device_dtype("cpu", None)[1] == torch.float32


def test_precision_and_dtype_together_or_an_unknown_precision_are_refused() -> None:
    with pytest.raises(TreewiseError, match="dtype or precision, not both"):
        pick_device_dtype("cpu", "bf16", "exact")
    with pytest.raises(TreewiseError, match="unknown precision 'quick'"):
        pick_device_dtype("cpu", None, "quick")


def test_the_exact_mode_decodes_the_targets_greedy_output(tiny_pair_dir: Path) -> None:
    dec = TreeDecoder.from_pretrained(tiny_pair_dir / "target", tiny_pair_dir / "draft", precision="exact")
    assert dec.target_dtype == torch.float32
    for prompt in ("code prompt 0:", "dialogue prompt 1:"):
        assert dec.generate(prompt, max_new_tokens=12).token_ids == dec.generate_plain(prompt, 12).token_ids
