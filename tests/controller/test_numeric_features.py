"""The lean feature path: ``Frontier.numeric_features`` (integer codes, no object arrays) equals ``features()``,
and the shipped predictor gives the same probabilities on both."""

import numpy as np
import pytest
import torch

from treewise.decoder import Frontier
from treewise.decoder.paths import data_dir
from treewise.decoder.records.nodelog import SOURCES, TOKEN_TYPES


def _frontier(domain: str, table: bool = True) -> Frontier:
    g = torch.Generator().manual_seed(0)
    m = 7
    lp = -torch.rand(m, generator=g) * 3
    return Frontier.of(
        depth=2, step=5, position=11, prompt_len=30, domain=domain, temperature=0.0, tree_size=3, max_depth=6,
        tokens=torch.randint(0, 50, (m,), generator=g), parent=torch.tensor([0, 0, 0, 1, 1, 2, 2]),
        sibling_rank=torch.tensor([0, 1, 2, 0, 1, 0, 1]), draft_logprob=lp,
        draft_entropy=torch.rand(m, generator=g) * 4, draft_margin=torch.rand(m, generator=g),
        path_logprob=lp - 0.5, parent_draft_prob=torch.rand(m, generator=g), running_accept_rate=0.4,
        prev_accepted=2, token_type_table=np.arange(50) % len(TOKEN_TYPES) if table else None,
    )


@pytest.mark.parametrize("table", [True, False])
def test_numeric_features_equal_the_logged_features(table: bool) -> None:
    f = _frontier("code", table)
    named, numeric = f.features(), f.numeric_features()
    assert set(numeric) == set(named) - {"domain"}
    assert [TOKEN_TYPES[i] for i in numeric["token_type"]] == list(named["token_type"])
    assert [SOURCES[i] for i in numeric["source"]] == list(named["source"])
    for name in set(numeric) - {"token_type", "source"}:
        np.testing.assert_allclose(np.asarray(numeric[name], dtype=np.float64),
                                   np.asarray(named[name], dtype=np.float64), rtol=0, atol=0, err_msg=name)


@pytest.mark.parametrize("domain", ["code", "dialogue", "never-seen"])
def test_shipped_predictor_gives_the_same_probabilities_on_codes(domain: str) -> None:
    from treewise.predictor import AcceptancePredictor

    model = AcceptancePredictor.load(data_dir() / "predictor")
    f = _frontier(domain)
    extra = {"recent_accepted": 1.5, "recent_accept_rate": 0.5, "parent_margin": 0.3, "parent_entropy": 1.0}
    named = f.features() | {k: np.full(f.size, v, dtype=np.float32) for k, v in extra.items()}
    numeric = f.numeric_features() | {k: np.full(f.size, v, dtype=np.float32) for k, v in extra.items()}
    code = model.category_code("domain", domain)
    numeric["domain"] = np.full(f.size, float(code) if code >= 0 else np.nan)
    want = model.predict_batch({n: named[n] for n in model.feature_names})
    got = model.predict_batch({n: numeric[n] for n in model.feature_names})
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
