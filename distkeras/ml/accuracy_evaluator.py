"""`AccuracyEvaluator`: the fraction of rows whose predicted class equals the label,
computed by Spark aggregations, as Keras's accuracy metrics count it.

Example::

    accuracy = AccuracyEvaluator(prediction_col="prediction_index",
                                 label_col="label_index").evaluate(predicted)
"""

from pyspark.ml.evaluation import Evaluator
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasLabelCol, HasPredictionCol, HasWeightCol
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import functions as F
from pyspark.sql import types as T

from distkeras.data.frame_columns import column
from distkeras.ml.columns import argmax, column_kind, double_array
from distkeras.ml.params import getter, set_given, set_params, setter
from distkeras.ml.scoring import (array_sum, checked_mean, is_nested, nested_rows,
                                  refuse_row, refusing_nulls, row_weights, step_mean)


def _class_index(dataset, name, role, label=False, threshold=0.5):
    """A column as a class index: numbers as they are, arrays and vectors by their argmax,
    except one-element arrays (a sigmoid output, a binary label): 1 above ``threshold``
    (0.5; a logit's is 0), else 0, as Keras's binary accuracy reads them. A label's
    one-element array holding a whole number is that class (Keras never thresholds labels:
    CIFAR-10's labels have shape ``(n, 1)``, and ``[6]`` is class 6, not 1). A fractional
    number is no class index (a probability taken out of its array would never equal a
    label): it stops the job."""
    if column_kind(dataset, name, role) == "scalar":
        value = column(name).cast(T.DoubleType())
        return F.when(value.isNull() | (value == F.floor(value)), value).otherwise(refuse_row(
            f"AccuracyEvaluator: the {role} {name!r} holds a fractional number, not a class "
            "index. For the probability of one sigmoid unit, pass its one-value array "
            "(ModelPredictor's prediction column, thresholded at 0.5) or threshold it "
            "first; for class probabilities, pass the arrays or vectors (argmax)."))
    values = double_array(dataset, name, role)
    first = F.element_at(values, 1)
    one_value = (first > threshold).cast(T.DoubleType())
    if label:
        one_value = F.when(first == F.floor(first), first).otherwise(one_value)
    return F.when(F.size(values) == 1, one_value) \
        .otherwise(argmax(values).cast(T.DoubleType()))


def _binary_accuracy(dataset, prediction_col, label_col, threshold=0.5):
    """Per row, the fraction of label elements equal to the predictions thresholded at
    ``threshold`` (Keras's ``binary_accuracy``), and a job error for a row whose two arrays
    differ in length."""
    predictions = double_array(dataset, prediction_col, "prediction column")
    labels = double_array(dataset, label_col, "label column")
    matches = F.transform(F.arrays_zip(predictions.alias("p"), labels.alias("y")),
                          lambda pair: ((pair["p"] > threshold).cast(T.DoubleType())
                                        == pair["y"]).cast(T.DoubleType()))
    same_length = (F.size(predictions) == F.size(labels)) & (F.size(labels) > 0)
    per_row = F.when(same_length, array_sum(matches) / F.size(labels)).otherwise(refuse_row(
        f"AccuracyEvaluator(multi_label=True): a row's prediction array ({prediction_col!r})"
        f" and label array ({label_col!r}) differ in length (or are empty); multi-label "
        "accuracy compares them element by element."))
    return per_row


def _refusing_multi_hot(labels, label, name):
    """``label`` (a class index), or a job error for a row of 0s and 1s that is not one-hot
    (several 1s, or none): a multi-label row, whose argmax would name only its first
    class. Soft labels (fractions summing to 1) and a single sigmoid label pass."""
    zeros_and_ones = F.forall(labels, lambda x: (x == 0.0) | (x == 1.0))
    multi_hot = (F.size(labels) > 1) & zeros_and_ones & (array_sum(labels) != 1.0)
    return F.when(multi_hot, refuse_row(
        f"AccuracyEvaluator: the label column {name!r} holds multi-hot labels (several "
        "1s, or none, in one row), whose argmax would count only the first class. For a "
        "multi-label model, pass AccuracyEvaluator(..., multi_label=True): Keras's binary "
        "accuracy, each element thresholded at 0.5.")).otherwise(label)


class AccuracyEvaluator(Evaluator, HasPredictionCol, HasLabelCol, HasWeightCol,
                        DefaultParamsReadable, DefaultParamsWritable):
    """The fraction of rows whose predicted class equals the label.

    Each column may hold class indices (numbers) or vectors (arrays or Spark ML vectors,
    one-hot labels or predicted probabilities), which count by their argmax; a vector of
    one value (a sigmoid output) is class 1 above 0.5, else class 0, as in Keras's binary
    accuracy. A label array shorter than the prediction arrays holds a class index per
    step (a tagger's output of shape ``(steps, classes)``, flattened by ModelPredictor):
    each row counts the fraction of its steps right, as Keras's accuracy over every step
    (padded steps too: a ``mask_zero`` model's Keras metrics skip them); one-hot labels per
    step (``array<array<...>>``) count by each step's argmax. A null prediction or label
    (or a null inside its array) stops the job, naming the column, as in LossEvaluator:
    Keras's ``evaluate`` has no such row to count.

    Multi-label outputs (sigmoid units with multi-hot labels, trained with
    ``binary_crossentropy``) need ``multi_label=True``: each row then counts the fraction
    of its labels matched by its predictions thresholded at 0.5, as Keras's binary
    accuracy does. Without it, a multi-hot label (several 1s, or none) stops the job with
    that advice, since its argmax would name only its first class.

    Units without activation (a loss with ``from_logits=True``) predict logits, whose
    probability 0.5 is 0: ``from_logits=True`` thresholds one-value arrays and multi-label
    predictions at 0, as ``BinaryAccuracy(threshold=0.0)`` does (Keras's ``"accuracy"``
    thresholds at 0.5 whatever it gets). The argmax of logits is that of their
    probabilities.

    Args:
        prediction_col: Predicted classes (default ``"prediction_index"``).
        label_col: True classes (default ``"label_index"``).
        multi_label: Score arrays element by element (default False).
        weight_col: A column of per-row weights (as ``sample_weight`` in Keras's
            ``evaluate``): the weighted mean, ``sum(w * right) / sum(w)``, as Keras's
            ``weighted_metrics`` and Spark's evaluators give (default: none).
        from_logits: Whether the predictions are logits (thresholded at 0; default False).
    """

    multiLabel = Param(Params._dummy(), "multiLabel",
                       "score multi-hot labels element by element (Keras's binary "
                       "accuracy, threshold 0.5) instead of by their argmax",
                       typeConverter=TypeConverters.toBoolean)
    setParams = set_params
    setPredictionCol = setter("predictionCol")
    setLabelCol = setter("labelCol")
    fromLogits = Param(Params._dummy(), "fromLogits", "whether the predictions are logits "
                       "(thresholded at 0 rather than 0.5)",
                       typeConverter=TypeConverters.toBoolean)
    setMultiLabel = setter("multiLabel")
    setWeightCol = setter("weightCol")
    setFromLogits = setter("fromLogits")
    getFromLogits = getter("fromLogits")

    def __init__(self, prediction_col="prediction_index", label_col="label_index",
                 multi_label=None, weight_col=None, from_logits=None):
        super().__init__()
        self._setDefault(predictionCol="prediction_index", labelCol="label_index",
                         multiLabel=False, fromLogits=False)
        set_given(self, predictionCol=prediction_col, labelCol=label_col,
                   multiLabel=multi_label, weightCol=weight_col, fromLogits=from_logits)

    def getMultiLabel(self):
        """Whether arrays are scored element by element (Keras's binary accuracy)."""
        return self.getOrDefault(self.multiLabel)

    def _evaluate(self, dataset):
        return checked_mean(dataset, lambda: self._terms(dataset), "the accuracy")

    def _terms(self, dataset):
        prediction_col, label_col = self.getPredictionCol(), self.getLabelCol()
        self._check_default_columns(dataset)
        weight_col = self.getWeightCol() if self.isDefined(self.weightCol) else None
        weight = row_weights(dataset, weight_col, "AccuracyEvaluator")
        correct = refusing_nulls(dataset, self._correct(dataset, prediction_col, label_col),
                                  "AccuracyEvaluator", prediction_col, label_col)
        return correct, weight, None

    def _check_default_columns(self, dataset):
        """A default column missing from ``dataset`` is named with dist-keras's defaults,
        which differ (``prediction`` and ``label``): a script written for those meets
        this first."""
        for param, theirs in ((self.predictionCol, "prediction"), (self.labelCol, "label")):
            name = self.getOrDefault(param)
            if name == self._defaultParamMap.get(param) and name not in dataset.columns:
                raise ValueError(
                    f"AccuracyEvaluator: column {name!r} (the default {param.name}) is not "
                    f"in the DataFrame {dataset.columns}. dist-keras's default was "
                    f"{theirs!r}; name the column: AccuracyEvaluator("
                    "prediction_col='prediction_index', label_col='label'), for example.")

    def _correct(self, dataset, prediction_col, label_col):
        """Per row, 1 for a right prediction and 0 for a wrong one (for arrays scored per
        step or per element, the fraction right)."""
        # Where a logit or a probability says 0.5.
        threshold = 0.0 if self.getFromLogits() else 0.5
        if self.getMultiLabel():
            return _binary_accuracy(dataset, prediction_col, label_col, threshold)
        if is_nested(dataset, label_col):
            # One-hot labels per step: each step's class is its argmax.
            predictions = double_array(dataset, prediction_col, "prediction column")
            labels = F.transform(nested_rows(dataset, label_col),
                                 lambda step: argmax(step).cast(T.DoubleType()))
            return step_mean(labels, predictions,
                              lambda y, p: (argmax(p) == y).cast(T.DoubleType()),
                              "AccuracyEvaluator")
        prediction = _class_index(dataset, prediction_col, "prediction column",
                                  threshold=threshold)
        label = _class_index(dataset, label_col, "label column", label=True)
        if column_kind(dataset, label_col, "label column") != "scalar":
            label = _refusing_multi_hot(
                double_array(dataset, label_col, "label column"), label, label_col)
        correct = (prediction == label).cast(T.DoubleType())
        if "scalar" not in (column_kind(dataset, prediction_col, "prediction column"),
                            column_kind(dataset, label_col, "label column")):
            # Arrays of different lengths are a class index per step (a tagger): their
            # argmaxes are no classes of each other.
            predictions = double_array(dataset, prediction_col, "prediction column")
            labels = double_array(dataset, label_col, "label column")
            per_step = step_mean(labels, predictions,
                                  lambda y, p: (argmax(p) == y).cast(T.DoubleType()),
                                  "AccuracyEvaluator")
            correct = F.when(F.size(predictions) == F.size(labels), correct) \
                .otherwise(per_step)
        return correct

    def isLargerBetter(self):
        """Accuracy: larger is better."""
        return True
