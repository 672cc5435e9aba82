"""LightGBM acceptance predictor: P(target accepts a drafted node | its parent is accepted).

Reads node logs (the decoder's schema) and knows nothing of trees at run time beyond a feature batch
in, probabilities out. See docs/predictor.md.
"""

from .config import DEFAULT_FEATURES, FEATURE_GROUPS, LightGBMParams, PredictorConfig
from .features import FeatureSchema, FeatureSchemaError, FeatureSpec, NodeRows, select_rows
from .model import AcceptancePredictor, PredictorError, fit, train

__all__ = [
    "DEFAULT_FEATURES",
    "FEATURE_GROUPS",
    "AcceptancePredictor",
    "FeatureSchema",
    "FeatureSchemaError",
    "FeatureSpec",
    "LightGBMParams",
    "NodeRows",
    "PredictorConfig",
    "PredictorError",
    "fit",
    "select_rows",
    "train",
]
