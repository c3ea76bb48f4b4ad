"""The Keras estimator for Spark ML Pipelines under its import path.

A thin face: the stages live in `distkeras.ml.estimators` (see there).
"""

from distkeras.keras_io.compile_config import with_learning_rate as optimizer_config
from distkeras.ml.estimators import KerasEstimator, KerasModel

__all__ = ["KerasEstimator", "KerasModel", "optimizer_config"]
