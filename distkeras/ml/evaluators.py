"""Metrics of predictions in a DataFrame, computed by Spark aggregations.

Both evaluators are `pyspark.ml.evaluation.Evaluator` objects (usable with Spark's model
selection tools) and return a Python float.

A thin face: `AccuracyEvaluator` lives in `distkeras.ml.accuracy_evaluator`,
`LossEvaluator` in `distkeras.ml.loss_evaluator` (the losses it reads in
`distkeras.ml.loss_specs`), and the scoring they share in `distkeras.ml.scoring`.

Example::

    accuracy = AccuracyEvaluator(prediction_col="prediction_index",
                                 label_col="label_index").evaluate(predicted)
    loss = LossEvaluator("categorical_crossentropy", prediction_col="prediction",
                         label_col="label").evaluate(predicted)
"""

from distkeras.ml.accuracy_evaluator import AccuracyEvaluator
from distkeras.ml.loss_evaluator import EPSILON, LossEvaluator
from distkeras.ml.loss_specs import HUBER_DELTA, LOSSES

__all__ = ["AccuracyEvaluator", "LossEvaluator", "EPSILON", "LOSSES", "HUBER_DELTA"]
