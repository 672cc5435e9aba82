"""Training, saving, loading and runtime prediction of the LightGBM acceptance predictor."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import pyarrow as pa
from pydantic import ValidationError

from treewise.decoder.errors import TreewiseError
from treewise.decoder.records.atomic import atomic_dir, recover_dir
from treewise.decoder.records.nodelog import SCHEMA_VERSION

from .calibration import IsotonicCalibrator, fit_isotonic
from .config import PredictorConfig
from .features import (
    ALL_FEATURE_COLUMNS,
    FEATURE_SCHEMA_VERSION,
    FeatureSchema,
    FeatureSchemaError,
    NodeRows,
    build_schema,
    encode,
    select_rows,
)
from .forest import ForestArrays, ForestError, compiled_predict
from .metrics import binary_metrics
from .split import PromptSplit, SplitMasks, split_by_prompt

MODEL_FILE = "model.txt"
SCHEMA_FILE = "feature_schema.json"
METRICS_FILE = "metrics.json"
CONFIG_FILE = "config.json"
SPLIT_FILE = "split.json"
CALIBRATION_FILE = "calibration.json"
BACKENDS: tuple[str, ...] = ("auto", "lightgbm", "numba")
BACKEND_ENV = "TREEWISE_PREDICTOR_BACKEND"  # overrides the default "auto" (A/B runs without code changes)
OWNED_FILES = (MODEL_FILE, SCHEMA_FILE, METRICS_FILE, CONFIG_FILE, SPLIT_FILE, CALIBRATION_FILE)


class PredictorError(TreewiseError):
    """A predictor cannot be trained or loaded; the message says why and what to do."""


class AcceptancePredictor:
    """P(target accepts a drafted node | its parent is accepted), from pre-verification features.

    ``predict_batch`` reuses one feature buffer, so one instance must not be shared between threads.
    Trees are evaluated by ``forest`` (the model's own tree arrays walked by numba-compiled code, see
    ``predictor.forest``) where numba imports, else by the LightGBM booster; ``backend`` says which,
    ``backend_reason`` why. Both give the same numbers (tests/predictor/test_forest.py).
    """

    def __init__(self, booster: lgb.Booster, schema: FeatureSchema, config: PredictorConfig,
                 calibrator: IsotonicCalibrator | None = None, split: PromptSplit | None = None,
                 metrics: dict[str, Any] | None = None, backend: str | None = None) -> None:
        self.booster = booster
        self.forest, self.backend_reason = _forest(booster, resolve_backend(backend))
        self.schema = schema
        self.config = config
        self.calibrator = calibrator
        self.split = split
        self.metrics: dict[str, Any] = metrics or {}
        self._names = frozenset(schema.names)
        self._buffer = np.empty((64, len(schema.names)), dtype=np.float64)
        # Per column: its index, name and (categoricals) the name -> code map, so predict_batch loops once.
        self._columns = [(j, f.name, {c: float(i) for i, c in enumerate(f.categories or [])}
                          if f.kind == "categorical" else None) for j, f in enumerate(schema.features)]

    @property
    def feature_names(self) -> list[str]:
        """The exact keys ``predict_batch`` expects."""
        return self.schema.names

    @property
    def backend(self) -> str:
        """"numba" (the forest's arrays, compiled) or "lightgbm"."""
        return "numba" if self.forest is not None else "lightgbm"

    def category_code(self, feature: str, value: str) -> int:
        """The integer code ``predict_batch`` accepts for a categorical value (-1, a missing value, if unseen),
        so a caller can pass e.g. ``np.full(n, code)`` for the domain instead of an object array."""
        spec = next((f for f in self.schema.features if f.name == feature and f.kind == "categorical"), None)
        if spec is None:
            raise FeatureSchemaError(f"{feature!r} is not a categorical feature: {self.schema.categorical}")
        cats = spec.categories or []
        return cats.index(value) if value in cats else -1

    def predict_batch(self, features: Mapping[str, np.ndarray]) -> np.ndarray:
        """Acceptance probabilities for one frontier: a dict of equal-length arrays keyed by feature name."""
        if features.keys() != self._names:
            self.schema.check_keys(features)
        n = len(next(iter(features.values())))
        if n > self._buffer.shape[0]:
            self._buffer = np.empty((n, self._buffer.shape[1]), dtype=np.float64)
        self._encode_into(features, n)
        return self.predict_prefix(self._buffer, n)

    def predict_prefix(self, x: np.ndarray, n: int) -> np.ndarray:
        """Probabilities for the first ``n`` rows of an encoded float64 matrix: columns in ``feature_names``
        order, categoricals as their ``category_code``. A caller that keeps one C-contiguous matrix per
        request (``controller.features``) skips building a dict of columns per call."""
        p = self.predict_raw(x[:n])
        return self.calibrator(p) if self.calibrator is not None else p

    def _encode_into(self, features: Mapping[str, np.ndarray], n: int) -> None:
        """``features.encode`` into the first n rows of the buffer, with the lookups prepared once instead of
        per call (docs/performance.md); a test keeps both equal."""
        x = self._buffer[:n]
        for j, name, lut in self._columns:
            col = np.asarray(features[name])
            if len(col) != n:
                encode(features, self.schema)  # raises naming the column
            if lut is not None and col.dtype.kind in "OUS":
                x[:, j] = [lut.get(v, math.nan) for v in col.tolist()]
            else:
                x[:, j] = col

    def predict_matrix(self, x: np.ndarray) -> np.ndarray:
        """Probabilities for an encoded feature matrix (rows x schema features)."""
        p = self.predict_raw(x)
        return self.calibrator(p) if self.calibrator is not None else p

    def predict_raw(self, x: np.ndarray) -> np.ndarray:
        """The model's probabilities before calibration, by the compiled forest when there is one."""
        return self.forest.predict(x) if self.forest is not None else self.booster.predict(x, num_threads=1)

    @property
    def isotonic(self) -> tuple[np.ndarray, np.ndarray]:
        """The isotonic map's knots (x, y); empty without calibration (a native caller applies it itself)."""
        if self.calibrator is None:
            return np.zeros(0), np.zeros(0)
        return self.calibrator.x, self.calibrator.y

    def predict_rows(self, rows: NodeRows, calibrated: bool = True) -> np.ndarray:
        x = encode(rows.columns, self.schema)
        return self.predict_matrix(x) if calibrated else self.predict_raw(x)

    def importance(self) -> dict[str, float]:
        """Total split gain per feature."""
        gain = self.booster.feature_importance(importance_type="gain")
        return {n: float(g) for n, g in zip(self.schema.names, gain, strict=True)}

    def save(self, directory: str | Path) -> Path:
        """Write model.txt, feature_schema.json, metrics.json, config.json, split.json (+ calibration).

        The folder is replaced as a whole (``atomic_dir``): a process killed while saving leaves the previous
        predictor loadable, never a new model beside an old schema. Other files in the folder are kept.
        """
        with atomic_dir(directory, OWNED_FILES) as out:
            self._write_files(out)
        return Path(directory)

    def _write_files(self, out: Path) -> None:
        self.booster.save_model(str(out / MODEL_FILE))
        _write_json(out / SCHEMA_FILE, self.schema.to_dict())
        _write_json(out / METRICS_FILE, self.metrics)
        _write_json(out / CONFIG_FILE, self.config.model_dump())
        if self.split is not None:
            _write_json(out / SPLIT_FILE, self.split.to_dict())
        if self.calibrator is not None:
            _write_json(out / CALIBRATION_FILE, self.calibrator.to_dict())

    @classmethod
    def load(cls, directory: str | Path, expected_features: list[str] | None = None,
             backend: str | None = None) -> AcceptancePredictor:
        """Load a saved predictor; raise naming any schema mismatch (with the model, decoder or caller).

        ``backend``: "auto" (the compiled forest where numba imports, else LightGBM), "numba" (raise if it cannot
        be had) or "lightgbm"; None reads ``$TREEWISE_PREDICTOR_BACKEND``, default "auto".
        """
        resolve_backend(backend)  # an unknown name raises before any file is read
        src = Path(directory)
        recover_dir(src, OWNED_FILES)  # a save killed midway: finish or undo it
        for name in (MODEL_FILE, SCHEMA_FILE, CONFIG_FILE):
            if not (src / name).is_file():
                raise PredictorError(
                    f"{src / name} is missing: train a predictor with `treewise train runs/NAME --out {src}`"
                )
        schema = _read(src / SCHEMA_FILE, FeatureSchema.from_dict)
        try:
            booster = lgb.Booster(model_file=str(src / MODEL_FILE))
        except lgb.basic.LightGBMError as err:
            raise PredictorError(f"{src / MODEL_FILE}: not a LightGBM model ({err}); {_retrain(src)}") from None
        _check_schema(schema, booster, src)
        if expected_features is not None and list(expected_features) != schema.names:
            raise FeatureSchemaError(_diff_message("caller's features", expected_features, schema.names, src))
        config = _read(src / CONFIG_FILE, PredictorConfig.model_validate)
        calib_path, split_path, metrics_path = src / CALIBRATION_FILE, src / SPLIT_FILE, src / METRICS_FILE
        calibrator = _read(calib_path, IsotonicCalibrator.from_dict) if calib_path.exists() else None
        split = _read(split_path, PromptSplit.from_dict) if split_path.exists() else None
        metrics = _read(metrics_path, dict) if metrics_path.exists() else {}
        return cls(booster, schema, config, calibrator, split, metrics, backend)


def resolve_backend(backend: str | None) -> str:
    """``backend`` or, when None, ``$TREEWISE_PREDICTOR_BACKEND`` or "auto"; an unknown name raises."""
    name = backend if backend is not None else os.environ.get(BACKEND_ENV, "auto")
    if name not in BACKENDS:
        raise PredictorError(f"predictor backend {name!r}: choose one of {', '.join(BACKENDS)}")
    return name


def _forest(booster: lgb.Booster, backend: str) -> tuple[ForestArrays | None, str]:
    """The forest's arrays for ``backend`` (None: use LightGBM) and why; a forced "numba" that fails raises."""
    if backend == "lightgbm":
        return None, "backend='lightgbm' requested"
    why = "numba is not installed (pip install 'treewise[native]')"
    if compiled_predict() is not None:
        try:
            return ForestArrays.from_booster(booster), "LightGBM's trees as arrays, compiled by numba"
        except ForestError as err:
            why = str(err)
    if backend == "numba":
        raise PredictorError(f"backend 'numba': {why}; load with backend='auto' or 'lightgbm' to use LightGBM")
    return None, f"LightGBM's predict: {why}"


def _retrain(src: Path) -> str:
    return f"retrain with `treewise train runs/NAME --out {src}` (or copy the whole folder again)"


def _read(path: Path, build: Any) -> Any:
    """A JSON file of a predictor folder through its constructor; garbage raises PredictorError naming it."""
    try:
        return build(json.loads(path.read_text(encoding="utf-8")))
    except FeatureSchemaError:
        raise
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        if isinstance(err, KeyError):
            why = f"no field {err}"
        elif isinstance(err, ValidationError):
            first = err.errors()[0]
            why = f"field {'.'.join(str(x) for x in first['loc'])}: {first['msg']}"
        raise PredictorError(f"{path}: unreadable ({why}); {_retrain(path.parent)}") from None


def _write_json(path: Path, data: object) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def _diff_message(what: str, got: list[str], want: list[str], src: Path) -> str:
    missing = [n for n in want if n not in got]
    extra = [n for n in got if n not in want]
    order = "" if missing or extra else " (same names, different order)"
    return (
        f"{what} do not match the feature schema of {src}{order}: missing {missing}, extra {extra}; "
        f"retrain with `treewise train runs/NAME --out {src}` or pass exactly {want}"
    )


def _check_schema(schema: FeatureSchema, booster: lgb.Booster, src: Path) -> None:
    if schema.version != FEATURE_SCHEMA_VERSION:
        raise FeatureSchemaError(
            f"{src / SCHEMA_FILE}: feature schema version {schema.version!r}, this treewise reads "
            f"{FEATURE_SCHEMA_VERSION!r}; retrain with `treewise train runs/NAME --out {src}`"
        )
    if schema.node_log_schema_version != SCHEMA_VERSION:
        raise FeatureSchemaError(
            f"{src}: trained on node-log schema {schema.node_log_schema_version!r}, the decoder now logs "
            f"{SCHEMA_VERSION!r}; re-collect logs and retrain with `treewise train runs/NAME --out {src}`"
        )
    changed = [
        f"{f.name} ({f.dtype} in the schema, {ALL_FEATURE_COLUMNS.get(f.name, 'absent')} in the node log)"
        for f in schema.features
        if str(ALL_FEATURE_COLUMNS.get(f.name)) != f.dtype
    ]
    if changed:
        raise FeatureSchemaError(
            f"{src / SCHEMA_FILE}: features differ from the decoder's node log: {changed}; "
            f"retrain with `treewise train runs/NAME --out {src}`"
        )
    if booster.feature_name() != schema.names:
        raise FeatureSchemaError(_diff_message(f"features of {MODEL_FILE}", booster.feature_name(), schema.names, src))
    cat_model = sorted(int(i) for i in booster.params.get("categorical_feature", []) or [])
    cat_schema = [i for i, f in enumerate(schema.features) if f.kind == "categorical"]
    if cat_model != cat_schema:
        raise FeatureSchemaError(
            f"{src}: categorical features of {MODEL_FILE} ({cat_model}) differ from {SCHEMA_FILE} ({cat_schema}); "
            f"the files come from different trainings: retrain with `treewise train runs/NAME --out {src}`"
        )


def train(logs: pa.Table, config: PredictorConfig | None = None) -> AcceptancePredictor:
    """Select rows, split by prompt, fit LightGBM with early stopping, calibrate on validation."""
    config = config or PredictorConfig()
    rows = select_rows(logs, config.split_by)
    if len(rows) == 0:
        raise PredictorError("the logs hold no verified node with an accepted parent: collect logs with verification")
    split = split_by_prompt(rows.group, rows.columns["domain"], config.train_fraction, config.valid_fraction,
                            config.seed)
    return fit(rows, split, build_schema(logs, config.features), config)


def fit(rows: NodeRows, split: PromptSplit, schema: FeatureSchema, config: PredictorConfig) -> AcceptancePredictor:
    """Fit on a given split (``train`` makes one; studies reuse a model's split for ablations)."""
    masks = split.masks(rows.group)
    if not masks.train.any() or not masks.valid.any():
        raise PredictorError(
            f"the split left {int(masks.train.sum())} training and {int(masks.valid.sum())} validation rows: "
            "collect logs for more prompts (at least 3 per domain)"
        )
    x = encode(rows.columns, schema)
    y = rows.label(config.label)
    dtrain = lgb.Dataset(x[masks.train], y[masks.train], feature_name=schema.names,
                         categorical_feature=schema.categorical, free_raw_data=False)
    dvalid = lgb.Dataset(x[masks.valid], y[masks.valid], reference=dtrain)
    history: dict[str, Any] = {}
    callbacks = [lgb.record_evaluation(history)]
    if config.early_stopping_rounds:
        callbacks.append(lgb.early_stopping(config.early_stopping_rounds, first_metric_only=True, verbose=False))
    booster = lgb.train(config.lightgbm.to_lightgbm(config.objective, config.seed), dtrain,
                        num_boost_round=config.num_boost_round, valid_sets=[dvalid], valid_names=["valid"],
                        callbacks=callbacks)
    best = booster.best_iteration or booster.current_iteration()
    # Keep only the best iteration, in exactly the form `load` rebuilds, so saved == in-memory predictions.
    booster = lgb.Booster(model_str=booster.model_to_string(num_iteration=best))
    raw_valid = booster.predict(x[masks.valid], num_threads=1)
    calibrator = fit_isotonic(raw_valid, y[masks.valid]) if config.calibration == "isotonic" else None
    predictor = AcceptancePredictor(booster, schema, config, calibrator, split)
    predictor.metrics = _training_metrics(predictor, rows, x, masks, raw_valid, best)
    return predictor


def _training_metrics(predictor: AcceptancePredictor, rows: NodeRows, x: np.ndarray, masks: SplitMasks,
                      raw_valid: np.ndarray, best: int) -> dict[str, Any]:
    config = predictor.config
    y = rows.label(config.label)
    p_test = predictor.predict_matrix(x[masks.test]) if masks.test.any() else np.zeros(0)
    p_valid = predictor.predict_matrix(x[masks.valid])

    def metrics(p: np.ndarray, m: np.ndarray) -> dict[str, Any]:
        return binary_metrics(p, y[m], auc_labels=rows.hard[m]).to_dict()

    return {
        "label": config.label,
        "calibration": config.calibration,
        "best_iteration": int(best),
        "num_trees": int(predictor.booster.num_trees()),
        "rows": {"logged": rows.n_logged, "train": int(masks.train.sum()), "valid": int(masks.valid.sum()),
                 "test": int(masks.test.sum())},
        "prompts": {k: len(getattr(predictor.split, k)) for k in ("train", "valid", "test")},
        "soft_label_fallback_rows": rows.n_soft_fallback,
        "valid_uncalibrated": metrics(raw_valid, masks.valid),
        "valid": metrics(p_valid, masks.valid),
        "test": metrics(p_test, masks.test),
        "importance_gain": predictor.importance(),
    }
