"""The evaluators under their dist-keras import path.

A thin face: `AccuracyEvaluator` lives in `distkeras.ml.accuracy_evaluator`,
`LossEvaluator` in `distkeras.ml.loss_evaluator` (see there).
"""

from distkeras.ml.accuracy_evaluator import AccuracyEvaluator
from distkeras.ml.loss_evaluator import LossEvaluator

__all__ = ["AccuracyEvaluator", "LossEvaluator"]
