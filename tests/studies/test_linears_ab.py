"""`treewise latency --linears-ab`: both kinds timed at every size, and the model left as the decoder loads it."""

from __future__ import annotations

from conftest import make_model
from torch import nn

from treewise.controller.latency import SIZES
from treewise.decoder.kernels.linears import SkinnyLinear
from treewise.studies.bench.linears import linears_table, measure_linears


def test_measures_both_and_leaves_skinny_linears() -> None:
    model = make_model("llama", 0, layers=1)
    ab = measure_linears(model, context=8, rounds=2, repeats=1)
    assert ab.sizes == SIZES and len(ab.stock_ms) == len(ab.skinny_ms) == len(SIZES)
    assert min(ab.stock_ms + ab.skinny_ms) > 0
    assert any(type(m) is SkinnyLinear for m in model.modules())
    assert not any(type(m) is nn.Linear for m in model.modules())
    assert linears_table(ab).row_count == len(SIZES)
