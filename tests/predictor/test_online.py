"""The per-request online correction: calibrator, labels inferred from step counts, and in-order replay."""

import itertools

import numpy as np
import pytest

from treewise.predictor.metrics import binary_metrics
from treewise.predictor.online import OnlineCalibrator, OnlineConfig, infer_step_labels, logit

WIDTHS = (3, 2, 1)  # children per node by level: 3 + 6 + 6 nodes


def _tree() -> np.ndarray:
    parent, level = [], [-1]
    for w in WIDTHS:
        nxt = []
        for p in level:
            for _ in range(w):
                nxt.append(len(parent))
                parent.append(p)
        level = nxt
    return np.asarray(parent)


def _request(rng: np.random.Generator, ease: float, steps: int, bias: float):
    """One request's steps: true conditional acceptance per node (siblings exclusive: at most one child of
    an accepted node is accepted, child i with probability p_i), the predictor's output (true logit + bias),
    the tried mask, the accept labels, and the two counts a policy sees."""
    parent = _tree()
    n = len(parent)
    for _ in range(steps):
        p = 1 / (1 + np.exp(-(rng.normal(ease, 1.5, n))))
        for par in np.unique(parent):  # siblings' probabilities must sum to at most 1
            kids = parent == par
            p[kids] *= min(1.0, 0.95 / p[kids].sum())
        on_path = np.zeros(n, dtype=bool)
        tried = np.zeros(n, dtype=bool)
        for par in [-1, *range(n)]:
            if par >= 0 and not on_path[par]:
                continue
            kids = np.flatnonzero(parent == par)
            tried[kids] = True
            u, edges = rng.random(), np.cumsum(p[kids])
            hit = np.searchsorted(edges, u, side="right")
            if hit < len(kids):
                on_path[kids[hit]] = True
        pred = 1 / (1 + np.exp(-(logit(p) + bias)))
        yield parent, p, pred, tried, on_path, int(on_path.sum()), int(tried.sum())


def _stream(bias: float, labels: str, requests: int = 40, steps: int = 30, seed: int = 0):
    """Replay a synthetic stream; return (global, corrected, label) over tried rows after warm-up, and
    the final corrections."""
    rng = np.random.default_rng(seed)
    before, after, ys, params = [], [], [], []
    cal = OnlineCalibrator(OnlineConfig())
    for _ in range(requests):
        cal.reset()
        for k, (parent, _, pred, tried, on_path, acc, n_tried) in enumerate(
                _request(rng, rng.normal(0.0, 1.0), steps, bias)):
            corrected = cal(pred)
            if k >= steps // 3:
                before.append(pred[tried])
                after.append(corrected[tried])
                ys.append(on_path[tried].astype(float))
            if labels == "exact":
                cal.update(pred[tried], on_path[tried].astype(float))
            else:
                inferred = infer_step_labels(parent, corrected, acc, n_tried)
                assert inferred is not None  # the counts always fit the tree they came from
                m = inferred.weight > 0
                cal.update(pred[m], inferred.label[m], inferred.weight[m])
        params.append((cal.offset, cal.slope))
    return np.concatenate(before), np.concatenate(after), np.concatenate(ys), np.asarray(params)


@pytest.mark.parametrize("labels", ["exact", "counts"])
def test_correction_moves_a_miscalibrated_predictor_toward_the_observed_rate(labels: str) -> None:
    before, after, y, params = _stream(bias=1.5, labels=labels)  # the predictor is overconfident by 1.5 logits
    rate = y.mean()
    assert before.mean() - rate > 0.1  # deliberately miscalibrated
    assert abs(after.mean() - rate) < 0.4 * abs(before.mean() - rate)
    assert binary_metrics(after, y).ece < 0.5 * binary_metrics(before, y).ece
    assert binary_metrics(after, y).log_loss < binary_metrics(before, y).log_loss
    assert np.median(params[:, 0]) < -0.5  # the offset learned the bias's sign


@pytest.mark.parametrize("labels", ["exact", "counts"])
def test_correction_leaves_a_calibrated_predictor_alone(labels: str) -> None:
    before, after, y, params = _stream(bias=0.0, labels=labels)
    assert abs(after.mean() - before.mean()) < 0.02
    assert binary_metrics(after, y).ece < binary_metrics(before, y).ece + 0.01
    assert binary_metrics(after, y).log_loss < binary_metrics(before, y).log_loss + 0.005
    assert abs(np.median(params[:, 0])) < 0.2 and abs(np.median(params[:, 1]) - 1) < 0.2


def test_calibrator_starts_at_identity_and_resets() -> None:
    cal = OnlineCalibrator(OnlineConfig(gate=0.0))
    p = np.array([0.1, 0.5, 0.9])
    np.testing.assert_array_equal(cal(p), p)
    cal.update(p, np.zeros(3))
    assert cal.offset < 0 and cal.rows == 3
    assert cal(p).mean() < p.mean() - 0.02  # all-rejected evidence lowers the predictions
    cal.reset()
    assert (cal.offset, cal.slope, cal.rows) == (0.0, 1.0, 0)
    np.testing.assert_array_equal(cal(p), p)


def test_calibrator_weights_and_history_limit() -> None:
    p = np.full(4, 0.5)
    a, b = OnlineCalibrator(), OnlineCalibrator()
    a.update(p, np.array([1.0, 1.0, 0.0, 0.0]), np.array([1.0, 1.0, 0.0, 0.0]))  # zero weight: ignored
    b.update(p[:2], np.array([1.0, 1.0]))
    assert a.offset == pytest.approx(b.offset) and a.slope == pytest.approx(b.slope)
    c = OnlineCalibrator()
    for _ in range(10):
        c.update(p, np.ones(4))
    assert c.rows == 40


def _brute_force(parent: np.ndarray, p: np.ndarray, accepted: int, tried: int):
    """Enumerate every outcome (one accepted child or none under each accepted node) with its probability."""
    n = len(parent)
    kids = {v: [i for i in range(n) if parent[i] == v] for v in [-1, *range(n)]}
    on = np.zeros(n)
    parent_on = np.zeros(n)
    total = 0.0

    def walk(node: int, path: list[int], prob: float) -> None:
        nonlocal total
        options = [*kids[node], None]
        for c in options:
            q = p[c] if c is not None else 1 - sum(p[k] for k in kids[node])
            if c is not None:
                walk(c, [*path, c], prob * q)
                continue
            n_tried = len(kids[-1]) + sum(len(kids[v]) for v in path)
            if len(path) == accepted and n_tried == tried:
                w = prob * q
                total += w
                for v in path:
                    on[v] += w
                for i in range(n):
                    if parent[i] < 0 or parent[i] in path:
                        parent_on[i] += w

    walk(-1, [], 1.0)
    return (on / total, parent_on / total) if total > 0 else None


def test_inferred_labels_match_brute_force_enumeration() -> None:
    rng = np.random.default_rng(3)
    parent = np.array([-1, -1, 0, 0, 1, 2, 4, -1])  # ragged, a late root child; parents precede children
    fitted = 0
    for _ in range(20):
        p = rng.uniform(0.05, 0.3, len(parent))  # siblings sum below 1
        for accepted, tried in itertools.product(range(5), range(2, 10)):
            got = infer_step_labels(parent, p, accepted, tried)
            expected = _brute_force(parent, p, accepted, tried)
            if expected is None:
                assert got is None
                continue
            fitted += 1
            on, parent_on = expected
            assert got is not None
            np.testing.assert_allclose(got.weight, parent_on, atol=1e-9)
            np.testing.assert_allclose(got.label * got.weight, on, atol=1e-9)
    assert fitted >= 20 * 5  # most (accepted, tried) pairs that can happen were checked


def test_inferred_labels_are_exact_when_the_counts_decide() -> None:
    parent = np.array([-1, -1, 0, 1])  # two root children, one child each
    got = infer_step_labels(parent, np.full(4, 0.4), accepted=0, tried=2)
    np.testing.assert_array_equal(got.label, [0, 0, 0, 0])
    np.testing.assert_array_equal(got.weight, [1, 1, 0, 0])
    chain = np.array([-1, 0, 1])
    got = infer_step_labels(chain, np.full(3, 0.5), accepted=2, tried=3)
    np.testing.assert_array_equal(got.label, [1, 1, 0])
    np.testing.assert_array_equal(got.weight, [1, 1, 1])
    assert infer_step_labels(chain, np.full(3, 0.5), accepted=2, tried=5) is None  # counts that cannot happen


@pytest.mark.parametrize("n", [1, 7, 32, 33, 200])
def test_correction_is_sigmoid_of_offset_plus_slope_logit_at_every_size(n: int) -> None:
    cal = OnlineCalibrator(OnlineConfig(gate=0.0))
    cal.offset, cal.slope = 0.7, 1.8
    p = np.random.default_rng(n).uniform(0, 1, n)
    p[0] = 0.0  # clipped, not a division by zero
    want = 1 / (1 + np.exp(-(0.7 + 1.8 * logit(p))))
    np.testing.assert_allclose(cal(p), want, rtol=1e-12, atol=1e-15)


def test_gate_applies_the_correction_only_on_enough_evidence() -> None:
    """Under the default gate a few rejections leave the predictions alone; a run of them switches the
    correction on, and the same evidence without a gate corrects from the first update."""
    p = np.array([0.6, 0.7, 0.8])
    gated, open_ = OnlineCalibrator(), OnlineCalibrator(OnlineConfig(gate=0.0))
    for cal in (gated, open_):
        cal.update(p, np.zeros(3))
    assert gated.evidence < gated.config.gate and not gated.active
    np.testing.assert_array_equal(gated(p), p)
    assert open_.active and open_(p).mean() < p.mean() - 0.02
    assert gated.offset == open_.offset and gated.slope == open_.slope  # the gate changes the use, not the fit
    for _ in range(6):
        gated.update(p, np.zeros(3))
    assert gated.evidence >= gated.config.gate and gated.active
    assert gated(p).mean() < p.mean() - 0.1


def test_slope_floor_bounds_the_fitted_slope() -> None:
    rng = np.random.default_rng(0)
    p = rng.uniform(0.05, 0.95, 400)
    y = (rng.random(400) < 0.5).astype(float)  # labels unrelated to p: the free fit flattens the slope
    free, floored = OnlineCalibrator(OnlineConfig(gate=0.0)), OnlineCalibrator(OnlineConfig(gate=0.0, slope_floor=0.9))
    for k in range(0, 400, 8):
        free.update(p[k:k + 8], y[k:k + 8])
        floored.update(p[k:k + 8], y[k:k + 8])
    assert free.slope < 0.9 and floored.slope == pytest.approx(0.9)
