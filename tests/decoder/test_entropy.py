"""The drafter's per-node entropy (a logged feature and a predictor input) is the draft distribution's
Shannon entropy in nats, rows with zeros (top-k / top-p cuts, padded vocabularies) included."""

import math

import numpy as np
import torch

from treewise.decoder.draft import _entropy


def _reference(p: torch.Tensor) -> np.ndarray:
    q = p.double()
    return -torch.where(q > 0, q * torch.log(q.clamp_min(1e-300)), torch.zeros_like(q)).sum(-1).numpy()


def test_entropy_matches_a_float64_reference() -> None:
    g = torch.Generator().manual_seed(0)
    v = 6144
    logits = torch.randn(6, v, generator=g) * 3
    logits[1, 7] += 40.0  # nearly one-hot
    logits[2] = 0.0  # uniform: log V
    logits[3, 100:] = float("-inf")  # a top-k cut: 100 tokens left
    logits[4, v // 2:] = float("-inf")  # a padded vocabulary
    p = torch.softmax(logits, -1)
    h = _entropy(p)
    assert h.dtype == np.float32 and h.shape == (6,)
    np.testing.assert_allclose(h, _reference(p), rtol=1e-5, atol=1e-6)
    assert abs(float(h[2]) - math.log(v)) < 1e-4
    assert np.all(np.isfinite(h))


def test_entropy_of_a_one_hot_row_is_zero() -> None:
    p = torch.zeros(2, 50)
    p[0, 3] = 1.0
    p[1, :2] = 0.5
    np.testing.assert_allclose(_entropy(p), [0.0, math.log(2)], atol=1e-7)
