"""The evaluators under their dist-keras import path.

A thin face: the stages live in `distkeras.ml.evaluators` (see there).
"""

from distkeras.ml.evaluators import AccuracyEvaluator, LossEvaluator

__all__ = ["AccuracyEvaluator", "LossEvaluator"]
