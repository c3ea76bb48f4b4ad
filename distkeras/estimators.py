"""The Keras estimator for Spark ML Pipelines under its import path.

A thin face: the stages live in `distkeras.ml.estimators` (see there).
"""

from distkeras.ml.estimators import KerasEstimator, KerasModel, optimizer_config

__all__ = ["KerasEstimator", "KerasModel", "optimizer_config"]
