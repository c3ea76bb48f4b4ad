"""Metrics of predictions in a DataFrame, computed by Spark aggregations.

Both evaluators are `pyspark.ml.evaluation.Evaluator` objects (usable with Spark's model
selection tools) and return a Python float.

Example::

    accuracy = AccuracyEvaluator(prediction_col="prediction_index",
                                 label_col="label_index").evaluate(predicted)
    loss = LossEvaluator("categorical_crossentropy", prediction_col="prediction",
                         label_col="label").evaluate(predicted)
"""

import collections
import contextlib
import contextvars
import json
import logging

import numpy as np
from pyspark.ml.evaluation import Evaluator
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasLabelCol, HasPredictionCol, HasWeightCol
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import functions as F
from pyspark.sql import types as T

from distkeras.data.dataframes import column
from distkeras.ml.columns import argmax, column_kind, double_array, fail
from distkeras.ml.params import getter, set_given, set_params, setter

logger = logging.getLogger(__name__)

EPSILON = 1e-7  # keras.config.epsilon(): predictions are clipped to [EPSILON, 1 - EPSILON]
# The clip bounds as Keras applies them, to float32 predictions: 1 - 1e-7 rounds to
# 1 - 2**-23 there, so a saturated sigmoid (1.0) with label 0 costs -log(2**-23) = 15.94 in
# Keras's binary cross-entropy, not the -log(1e-7) = 16.12 of the bound in doubles.
_CLIP_LOW = float(np.float32(EPSILON))
_CLIP_HIGH = float(np.float32(1.0 - EPSILON))

LOSSES = ("categorical_crossentropy", "sparse_categorical_crossentropy",
          "binary_crossentropy", "mse", "mean_squared_error", "mae", "mean_absolute_error",
          "huber", "log_cosh")
# Keras's long names of the regression losses, read as their short ones.
_ALIASES = {"mean_squared_error": "mse", "mean_absolute_error": "mae"}
HUBER_DELTA = 1.0  # keras.losses.huber's default
# Keras's loss classes, by the name of the loss they compute here.
_CLASSES = {"CategoricalCrossentropy": "categorical_crossentropy",
            "SparseCategoricalCrossentropy": "sparse_categorical_crossentropy",
            "BinaryCrossentropy": "binary_crossentropy", "MeanSquaredError": "mse",
            "MeanAbsoluteError": "mae", "Huber": "huber", "LogCosh": "log_cosh"}
# Keras's reductions whose value is the same whatever the batch size (evaluate's loss is
# the mean over batches, weighted by their sizes, of each batch's reduced loss): the sum
# of the weighted losses over the number of rows, or over the sum of the weights.
_REDUCTIONS = {"sum_over_batch_size": False, "mean": False, "mean_with_sample_weight": True}

# A loss as computed here: its name (one of LOSSES), whether the predictions are logits,
# the labels' smoothing, the class index left out (sparse categorical cross-entropy),
# Huber's delta, and whether a weighted mean divides by the weights' sum.
_Loss = collections.namedtuple(
    "_Loss", "name from_logits label_smoothing ignore_class delta per_weight")


# While an evaluator builds its per-row column (`_checked_mean`): what `_fail` writes for
# a row that cannot be scored, given the error's message. Unset: a job error.
_UNSCORED = contextvars.ContextVar("distkeras_unscored", default=None)


def _fail(message):
    """A column for a row that cannot be scored: null while `_checked_mean` builds the
    evaluation (the rows are counted and the error raised on the driver), else one that
    stops the job with ``message``."""
    unscored = _UNSCORED.get()
    return fail(message) if unscored is None else unscored(message)


@contextlib.contextmanager
def _unscored_as(value):
    token = _UNSCORED.set(value)
    try:
        yield
    finally:
        _UNSCORED.reset(token)


def _checked_mean(dataset, terms, what, per_weight=True):
    """`_mean_of` the per-row column that ``terms()`` builds, refusing rows that cannot be
    scored (nulls, arrays that do not fit, fractional class indices) with a ValueError on
    the driver.

    Such a row stopped the Spark job (``F.raise_error``), so Spark ran its task again,
    up to 4 times (each retry reading the partition again up to that row: predicting it
    again, for the lazy output of a `ModelPredictor`), and the message came inside a
    long Java trace. The rows are now scored as null and counted in the same job; only
    when some are, a second job finds which check they failed, to name it.

    Args:
        dataset: The DataFrame.
        terms: Builds ``(per_row, weight, share)`` (see `_mean_of`).
        what: What the mean is, for the errors.
        per_weight: See `_mean_of`.
    """
    messages = []

    def unscored(message):
        messages.append(message)
        return F.lit(None)

    with _unscored_as(unscored):
        per_row, weight, share = terms()
    value, unscored_rows = _mean_of(dataset, per_row, what, weight, per_weight, share)
    if unscored_rows:
        raise ValueError(_unscored_reason(dataset, terms, messages, unscored_rows, what))
    return value


def _unscored_reason(dataset, terms, messages, count, what):
    """The error of the first of ``messages`` (`_fail`'s, in the order built) that some
    row failed, and of how many rows (one job: a column per message, scored null only
    where that check failed)."""
    distinct = list(dict.fromkeys(messages))
    counts = []
    for message in distinct:
        with _unscored_as(lambda met, chosen=message: F.lit(None) if met == chosen
                          else F.lit(0.0)):
            per_row, weight, _ = terms()
        scored = per_row if weight is None else per_row * weight
        counts.append(F.count(F.when(scored.isNull(), 1)))
    row = dataset.select(*counts).first() if counts else ()
    for message, rows in zip(distinct, row):
        if rows:
            return f"{message} ({rows} row{'s' if rows > 1 else ''} in all.)"
    return (f"{count} row{'s' if count > 1 else ''} could not be scored for {what} (an empty "
            "array?); check that the prediction and label columns belong together.")


def _loss_text(value):
    """The ``loss`` Param's value as text: a name as it is, a Keras loss (an object, a
    function, or its config) as the JSON of its Keras config, so that the evaluator
    saves and copies as Spark's do and the loss is rebuilt with all its arguments."""
    if isinstance(value, str):
        return value
    from distkeras.utils import serialize_keras_object

    try:
        return json.dumps(serialize_keras_object(value))
    except (TypeError, ValueError) as error:
        raise TypeError(f"`loss` must be a loss name or a Keras loss. Received: "
                        f"loss={value!r}") from error


def _resolve_loss(text, from_logits, from_logits_set):
    """The `_Loss` that ``text`` (the ``loss`` Param) names, or a ValueError for a loss or
    an argument whose value this evaluator cannot compute as Keras's ``evaluate`` does.

    Args:
        text: A name of LOSSES, a Keras loss name or class name, or a Keras loss's
            config as JSON.
        from_logits: The ``fromLogits`` Param.
        from_logits_set: Whether it was set (it then has to agree with the loss's own).
    """
    if text in LOSSES:
        return _Loss(_ALIASES.get(text, text), from_logits, 0.0, None, HUBER_DELTA, False)
    import keras

    try:
        loss = keras.losses.get(json.loads(text) if text.startswith("{") else text)
    except (TypeError, ValueError) as error:
        raise ValueError(f"`loss` must be one of {LOSSES} or a Keras loss of one of the "
                         f"classes {sorted(_CLASSES)}. Received: loss={text!r}") from error
    if not isinstance(loss, keras.losses.Loss):  # a function: Keras's own, by its name
        name = getattr(loss, "__name__", None)
        if name not in LOSSES:
            raise ValueError(f"`loss` must be one of {LOSSES} or a Keras loss of one of the "
                             f"classes {sorted(_CLASSES)}. Received: loss={text!r}")
        return _Loss(_ALIASES.get(name, name), from_logits, 0.0, None, HUBER_DELTA, False)
    # Only Keras's own classes: a subclass may compute anything in `call`.
    name = _CLASSES.get(type(loss).__name__) \
        if type(loss).__module__.startswith("keras.") else None
    if name is None:
        raise ValueError(
            f"LossEvaluator computes the losses {sorted(_CLASSES)} (Keras's classes, with "
            f"their arguments) in Spark; it cannot compute {type(loss).__name__}, whose "
            "value only Keras knows. Score such rows with the model's own `evaluate` on "
            "collected data.")
    arguments = getattr(loss, "_fn_kwargs", {})
    if arguments.get("axis", -1) != -1:
        raise ValueError(f"LossEvaluator reads the classes on the last axis; {type(loss).__name__}"
                         f" has axis={arguments['axis']}.")
    if loss.reduction not in _REDUCTIONS:
        # Keras's `evaluate` reports the mean over batches of each batch's loss: a sum (or
        # no reduction) depends on the batch size, which a DataFrame does not have.
        raise ValueError(
            f"LossEvaluator computes a loss reduced to a mean (reduction one of "
            f"{sorted(_REDUCTIONS)}); {type(loss).__name__} has "
            f"reduction={loss.reduction!r}, whose value in Keras's `evaluate` depends on the "
            "batch size.")
    own = bool(arguments.get("from_logits", False))
    if from_logits_set and "from_logits" in arguments and own != from_logits:
        raise ValueError(f"`from_logits={from_logits}` contradicts the loss's own "
                         f"from_logits={own} ({type(loss).__name__}); set one of them.")
    return _Loss(name, own or from_logits, float(arguments.get("label_smoothing") or 0.0),
                 arguments.get("ignore_class"), float(arguments.get("delta", HUBER_DELTA)),
                 _REDUCTIONS[loss.reduction])


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
        return F.when(value.isNull() | (value == F.floor(value)), value).otherwise(_fail(
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


def _step_mean(labels, predictions, term, evaluator):
    """The mean over steps of ``term(label, step_predictions)`` for a row holding one class
    index per step (a tagger's labels, ``(steps,)``) against its flattened predictions
    (``(steps, classes)``, as ModelPredictor writes them); a row whose prediction length is
    not a multiple of its label length stops the job."""
    steps = F.size(labels)
    classes = (F.size(predictions) / steps).cast(T.IntegerType())
    terms = F.transform(labels, lambda y, i: term(
        y, F.slice(predictions, i * classes + 1, classes)))
    valid = (steps > 0) & (F.size(predictions) % steps == 0)
    return F.when(valid, _sum(terms) / steps).otherwise(_fail(
        f"{evaluator}: a row's prediction array is not a whole number of steps of its "
        "label array (one class index per step, against the flattened (steps, classes) "
        "predictions); check that the label and prediction columns belong together."))


def _is_nested(dataset, name):
    """Whether column ``name`` holds arrays of arrays (a tagger's one-hot labels,
    ``(steps, classes)``, as the trainers read them)."""
    data_type = dataset.schema[name].dataType if name in dataset.columns else None
    return isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType,
                                                            T.ArrayType)


def _nested_rows(dataset, name):
    """Column ``name`` (arrays of arrays of numbers) as ``array<array<double>>``."""
    inner = dataset.schema[name].dataType.elementType
    if not isinstance(inner.elementType, (T.NumericType, T.BooleanType)):
        raise TypeError(f"Column {name!r} (the label column) has type "
                        f"{dataset.schema[name].dataType.simpleString()}; expected arrays "
                        "(of arrays) of numbers.")
    return column(name).cast(T.ArrayType(T.ArrayType(T.DoubleType())))


def _mean_of(dataset, per_row, what, weight=None, per_weight=True, share=None):
    """The mean of a per-row column over the DataFrame and the number of its rows left
    null (not scored), or a ValueError if it has no rows.

    Args:
        dataset: The DataFrame.
        per_row: The column to average.
        what: What the mean is, for the error.
        weight: A column of per-row weights, or None.
        per_weight: With ``weight``, divide the weighted sum by the sum of the weights (0
            where they sum to 0), as Keras's weighted metrics do; else by the number of
            rows, as Keras's losses do with ``sample_weight`` (reduction
            ``"sum_over_batch_size"``), which ``evaluate`` reports.
        share: A column of the share (0 to 1) of each row's elements that count, or None
            for all of them: the sum is divided by the rows (or weights) counted so, as
            Keras's losses divide by the elements their mask leaves (``ignore_class``);
            0 where none is left, as Keras's ``divide_no_nan``.
    """
    share = F.lit(1.0) if share is None else share
    weight_sum = share if weight is None else share * weight
    scored = per_row if weight is None else per_row * weight
    value = dataset.select(
        F.sum(scored).alias("sum"),
        F.sum(weight_sum if per_weight else share).alias("total"),
        F.count(F.lit(1)).alias("rows"), F.count(scored).alias("scored")).first()
    if not value["rows"]:
        raise ValueError(f"Cannot compute {what} of an empty DataFrame.")
    total = value["total"]
    mean = float(value["sum"]) / total if total and value["sum"] is not None else 0.0
    return mean, value["rows"] - value["scored"]


def _weight(dataset, name, evaluator):
    """Column ``name`` as per-row weights (doubles), refusing null rows as
    `_refusing_nulls` does (checked on the weight itself: ``value * null`` is folded to
    null before the value's check would run); None for no column; a TypeError for a
    column that is not one number per row."""
    if not name:  # unset or "", as Spark's evaluators read weightCol
        return None
    if column_kind(dataset, name, "weight column") != "scalar":
        raise TypeError(f"Column {name!r} (the weight column) must hold one number per row; "
                        f"it has type {dataset.schema[name].dataType.simpleString()}.")
    return _refusing_nulls(dataset, column(name).cast(T.DoubleType()), evaluator, name)


def _refusing_nulls(dataset, per_row, evaluator, *names):
    """``per_row``, or a job error naming the column for a row whose value in one of
    ``names`` is null or an array holding a null.

    Keras's ``evaluate`` has no row without a prediction or a label: a null row scored as
    wrong (or as a loss of 0), or left out of Spark's mean unsaid, would give another
    number than Keras's on the same data. As the training feed does, the error names the
    column and the rows to drop (only those null in it: ``dropna()`` without a subset also
    drops the rows null in any other column).
    """
    checked = per_row
    for name in reversed(names):
        if _is_nested(dataset, name):
            values = F.flatten(column(name))
        elif column_kind(dataset, name, "column") == "array":
            values = column(name)
        else:  # a number, or a Spark ML vector (whose values are never null)
            values = None
        checked = F.when(column(name).isNull(), _fail(
            f"{evaluator}: column {name!r} holds null rows; drop them first, for example "
            f"`dataset.dropna(subset=[{name!r}])`.")).otherwise(
            checked if values is None else F.when(
                F.exists(values, lambda x: x.isNull()), _fail(
                    f"{evaluator}: column {name!r} holds arrays with a null value; drop "
                    "those rows first (dropna does not look inside arrays), for example "
                    f"`dataset.where(~F.exists({name!r}, lambda x: x.isNull()))`.")
            ).otherwise(checked))
    return checked


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
    per_row = F.when(same_length, _sum(matches) / F.size(labels)).otherwise(_fail(
        f"AccuracyEvaluator(multi_label=True): a row's prediction array ({prediction_col!r})"
        f" and label array ({label_col!r}) differ in length (or are empty); multi-label "
        "accuracy compares them element by element."))
    return per_row


def _refusing_multi_hot(labels, label, name):
    """``label`` (a class index), or a job error for a row of 0s and 1s that is not one-hot
    (several 1s, or none): a multi-label row, whose argmax would name only its first
    class. Soft labels (fractions summing to 1) and a single sigmoid label pass."""
    zeros_and_ones = F.forall(labels, lambda x: (x == 0.0) | (x == 1.0))
    multi_hot = (F.size(labels) > 1) & zeros_and_ones & (_sum(labels) != 1.0)
    return F.when(multi_hot, _fail(
        f"AccuracyEvaluator: the label column {name!r} holds multi-hot labels (several "
        "1s, or none, in one row), whose argmax would count only the first class. For a "
        "multi-label model, pass AccuracyEvaluator(..., multi_label=True): Keras's binary "
        "accuracy, each element thresholded at 0.5.")).otherwise(label)


def _sum(array):
    return F.aggregate(array, F.lit(0.0), lambda total, x: total + x)


def _clip(value):
    return F.least(F.greatest(value, F.lit(_CLIP_LOW)), F.lit(_CLIP_HIGH))


def _log_probabilities(predictions, from_logits):
    """Per element, the log of a row's class probabilities, as Keras's cross-entropies
    take them: probabilities scaled to sum to 1 and clipped; logits through a log-softmax
    (shifted by their largest, so no ``exp`` overflows), not clipped."""
    if not from_logits:
        total = _sum(predictions)
        return F.transform(predictions, lambda p: F.log(_clip(p / total)))
    top = F.array_max(predictions)
    log_total = F.log(_sum(F.transform(predictions, lambda z: F.exp(z - top)))) + top
    return F.transform(predictions, lambda z: z - log_total)


def _categorical_cross_entropy(labels, predictions, spec):
    """The categorical cross-entropy of one row (or step): its labels smoothed towards
    ``1 / classes`` by the loss's ``label_smoothing``, as Keras's are."""
    smoothing = spec.label_smoothing
    if smoothing:
        labels = F.transform(labels, lambda y: y * (1.0 - smoothing)
                             + smoothing / F.size(labels))
    return -_sum(F.zip_with(labels, _log_probabilities(predictions, spec.from_logits),
                            lambda y, log_p: y * log_p))


def _binary_cross_entropy(y, p, from_logits):
    """The binary cross-entropy of one element: of a probability clipped as Keras clips
    it, or of a logit, ``-y*log(sigmoid(z)) - (1-y)*log(sigmoid(-z))``, written without
    overflow."""
    if from_logits:
        return F.greatest(p, F.lit(0.0)) - p * y + F.log1p(F.exp(-F.abs(p)))
    p = _clip(p)
    return -(y * F.log(p) + (1.0 - y) * F.log(1.0 - p))


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
        return _checked_mean(dataset, lambda: self._terms(dataset), "the accuracy")

    def _terms(self, dataset):
        prediction_col, label_col = self.getPredictionCol(), self.getLabelCol()
        self._check_default_columns(dataset)
        weight_col = self.getWeightCol() if self.isDefined(self.weightCol) else None
        weight = _weight(dataset, weight_col, "AccuracyEvaluator")
        correct = _refusing_nulls(dataset, self._correct(dataset, prediction_col, label_col),
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
        if _is_nested(dataset, label_col):
            # One-hot labels per step: each step's class is its argmax.
            predictions = double_array(dataset, prediction_col, "prediction column")
            labels = F.transform(_nested_rows(dataset, label_col),
                                 lambda step: argmax(step).cast(T.DoubleType()))
            return _step_mean(labels, predictions,
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
            per_step = _step_mean(labels, predictions,
                                  lambda y, p: (argmax(p) == y).cast(T.DoubleType()),
                                  "AccuracyEvaluator")
            correct = F.when(F.size(predictions) == F.size(labels), correct) \
                .otherwise(per_step)
        return correct

    def isLargerBetter(self):
        """Accuracy: larger is better."""
        return True


class LossEvaluator(Evaluator, HasPredictionCol, HasLabelCol, HasWeightCol,
                    DefaultParamsReadable, DefaultParamsWritable):
    """The mean loss of the predictions over the rows, as Keras computes it.

    Predictions are probabilities, clipped to ``[1e-7, 1 - 1e-7]`` in float32 as Keras
    does; for ``categorical_crossentropy`` they are first scaled to sum to 1 per row, as
    Keras does too. The predictions of a model whose last layer has no activation (trained
    with ``from_logits=True``) are logits: pass ``from_logits=True`` too, as to its Keras
    loss (read as probabilities, they would give another loss without a word).

    - ``categorical_crossentropy``: one-hot (or soft) label arrays, prediction arrays.
    - ``sparse_categorical_crossentropy``: integer labels, prediction arrays; or, for an
      output of shape ``(steps, classes)`` (a tagger), an array of one class index per step
      against the flattened predictions: the mean over steps (padded steps too, which a
      ``mask_zero`` model's Keras loss skips).
    - Labels of shape ``(steps, classes)`` (``array<array<...>>``, a tagger's one-hot labels)
      against the flattened predictions: ``categorical_crossentropy`` per step, the others
      per element, each the mean over the row.
    - ``binary_crossentropy``: numbers or arrays of 0/1 labels and probabilities (arrays:
      the mean over elements).
    - ``mse`` (or ``mean_squared_error``), ``mae`` (or ``mean_absolute_error``), ``huber``
      (delta 1, Keras's default) and ``log_cosh``: numbers or arrays (arrays: the mean over
      elements).

    ``loss`` may also be the Keras loss the model was compiled with (an object of one of
    those classes, or its config), whose arguments count as in ``evaluate``:
    ``from_logits``, ``label_smoothing`` (``CategoricalCrossentropy``,
    ``BinaryCrossentropy``), ``delta`` (``Huber``), ``ignore_class``
    (``SparseCategoricalCrossentropy``: the rows, or steps, of that class are left out of
    the mean, as Keras's mask leaves them out of a batch's; ``evaluate`` gives that value
    when one batch holds every row, and over several batches weighs each batch's mean by its
    size) and ``reduction`` (``"sum_over_batch_size"`` or ``"mean"``; or
    ``"mean_with_sample_weight"``, whose weighted sum is divided by the weights' sum).
    Other losses (focal losses, classes of your own) and reductions whose value depends on
    the batch size (``"sum"``, ``None``) are refused, naming what is computed.

    Args:
        loss: One of the names above, or a Keras loss of one of those classes.
        prediction_col: The predictions (default ``"prediction"``).
        label_col: The targets (default ``"label"``).
        weight_col: A column of per-row weights (as ``sample_weight`` in Keras's
            ``evaluate``): ``sum(w * loss) / rows``, the loss ``evaluate`` reports with
            them (Keras divides by the number of rows, not by the sum of the weights)
            (default: none).
        from_logits: Whether the predictions are logits, as the Keras loss's
            ``from_logits`` (the cross-entropies only; default False).
    """

    loss = Param(Params._dummy(), "loss", f"the loss: one of {', '.join(LOSSES)}, or a Keras "
                 "loss's config (JSON)", typeConverter=_loss_text)
    fromLogits = Param(Params._dummy(), "fromLogits", "whether the predictions are logits "
                       "(the cross-entropies' from_logits)",
                       typeConverter=TypeConverters.toBoolean)
    setParams = set_params
    setLoss = setter("loss")
    getLoss = getter("loss")
    setFromLogits = setter("fromLogits")
    getFromLogits = getter("fromLogits")
    setPredictionCol = setter("predictionCol")
    setLabelCol = setter("labelCol")
    setWeightCol = setter("weightCol")

    def __init__(self, loss="categorical_crossentropy", prediction_col="prediction",
                 label_col="label", weight_col=None, from_logits=None):
        super().__init__()
        self._setDefault(loss="categorical_crossentropy", predictionCol="prediction",
                         labelCol="label", fromLogits=False)
        set_given(self, loss=loss, predictionCol=prediction_col, labelCol=label_col,
                   weightCol=weight_col, fromLogits=from_logits)

    def _evaluate(self, dataset):
        spec = _resolve_loss(self.getOrDefault(self.loss), self.getFromLogits(),
                             self.isSet(self.fromLogits))
        loss = spec.name
        if spec.from_logits and not loss.endswith("crossentropy"):
            raise ValueError(f"`from_logits=True` applies to the cross-entropies, not to "
                             f"{loss}, whose predictions are the values themselves.")
        return _checked_mean(dataset, lambda: self._terms(dataset, spec), f"the {loss} loss",
                             per_weight=spec.per_weight)

    def _terms(self, dataset, spec):
        loss = spec.name
        share = None
        prediction_col, label_col = self.getPredictionCol(), self.getLabelCol()
        prediction_kind = column_kind(dataset, prediction_col, "prediction column")
        nested = _is_nested(dataset, label_col) and loss != "sparse_categorical_crossentropy"
        label_kind = "array" if nested else column_kind(dataset, label_col, "label column")
        if nested:
            per_row = self._nested(dataset, spec, prediction_col, label_col)
        elif loss == "sparse_categorical_crossentropy":
            per_row, share = self._sparse_categorical(dataset, prediction_col, label_col,
                                                      label_kind, spec)
        else:
            scalars = prediction_kind == "scalar"
            mismatched = scalars != (label_kind == "scalar")
            if mismatched and label_kind == "scalar" and loss != "categorical_crossentropy":
                # A one-unit output's predictions (arrays of one value, as ModelPredictor
                # writes them) against numbers: Keras reads the labels as (n, 1) too.
                per_row = self._one_value_term(dataset, spec, prediction_col, label_col)
            elif mismatched or (scalars and loss == "categorical_crossentropy"):
                raise TypeError(
                    f"{loss} needs prediction column {prediction_col!r} and label column "
                    f"{label_col!r} to both hold arrays (or vectors)"
                    + ("" if loss == "categorical_crossentropy" else ", or both numbers")
                    + f"; they hold {prediction_kind} and {label_kind} values.")
            elif scalars:
                per_row = self._term(spec, column(label_col).cast(T.DoubleType()),
                                     column(prediction_col).cast(T.DoubleType()))
            else:
                per_row = self._elementwise(dataset, spec, prediction_col, label_col)
        weight_col = self.getWeightCol() if self.isDefined(self.weightCol) else None
        weight = _weight(dataset, weight_col, "LossEvaluator")
        per_row = _refusing_nulls(dataset, per_row, "LossEvaluator", prediction_col,
                                  label_col)
        return per_row, weight, share

    @staticmethod
    def _term(spec, y, p):
        """The loss of one element (before the mean over a row's elements)."""
        loss = spec.name
        if loss == "binary_crossentropy":
            # Keras smooths binary labels towards 0.5.
            y = y * (1.0 - spec.label_smoothing) + 0.5 * spec.label_smoothing
            return _binary_cross_entropy(y, p, spec.from_logits)
        error = p - y
        if loss == "mae":
            return F.abs(error)
        if loss == "huber":
            delta = spec.delta
            return F.when(F.abs(error) <= delta, 0.5 * error * error) \
                .otherwise(delta * (F.abs(error) - 0.5 * delta))
        if loss == "log_cosh":  # log(cosh(x)) = |x| + log1p(exp(-2|x|)) - log(2): no overflow
            return F.abs(error) + F.log1p(F.exp(-2.0 * F.abs(error))) - F.log(F.lit(2.0))
        return error * error

    def _one_value_term(self, dataset, spec, prediction_col, label_col):
        predictions = double_array(dataset, prediction_col, "prediction column")
        per_row = self._term(spec, column(label_col).cast(T.DoubleType()),
                             F.element_at(predictions, 1))
        return F.when(F.size(predictions) == 1, per_row).otherwise(_fail(
            f"LossEvaluator: label column {label_col!r} holds numbers, so prediction column "
            f"{prediction_col!r} must hold one value per row (a one-unit output); some row "
            "holds another number of values."))

    def _elementwise(self, dataset, spec, prediction_col, label_col):
        predictions = double_array(dataset, prediction_col, "prediction column")
        labels = double_array(dataset, label_col, "label column")
        if spec.name == "categorical_crossentropy":
            per_row = _categorical_cross_entropy(labels, predictions, spec)
        else:
            terms = F.zip_with(labels, predictions, lambda y, p: self._term(spec, y, p))
            per_row = _sum(terms) / F.size(terms)
        return F.when(F.size(labels) == F.size(predictions), per_row).otherwise(_fail(
            f"LossEvaluator: label column {label_col!r} and prediction column "
            f"{prediction_col!r} hold arrays of different lengths in some row."))

    def _nested(self, dataset, spec, prediction_col, label_col):
        """Labels of shape ``(steps, classes)`` (a tagger's one-hot labels) against the
        flattened predictions: categorical cross-entropy per step, the others per element,
        each the mean over the row as Keras's."""
        predictions = double_array(dataset, prediction_col, "prediction column")
        labels = _nested_rows(dataset, label_col)
        if spec.name != "categorical_crossentropy":
            flat = F.flatten(labels)
            terms = F.zip_with(flat, predictions, lambda y, p: self._term(spec, y, p))
            return F.when(F.size(flat) == F.size(predictions), _sum(terms) / F.size(terms)) \
                .otherwise(_fail(f"LossEvaluator: label column {label_col!r} and prediction "
                                 f"column {prediction_col!r} hold different numbers of "
                                 "values in some row."))

        def term(y, p):
            cross = _categorical_cross_entropy(y, p, spec)
            return F.when(F.size(y) == F.size(p), cross).otherwise(_fail(
                f"LossEvaluator: label column {label_col!r} holds steps of another number of "
                f"classes than prediction column {prediction_col!r}."))

        return _step_mean(labels, predictions, term, "LossEvaluator")

    @staticmethod
    def _sparse_categorical(dataset, prediction_col, label_col, label_kind, spec):
        """Per row, the loss and the share of its elements that count (None: all; less
        with ``ignore_class``, whose rows or steps Keras's mask leaves out)."""
        predictions = double_array(dataset, prediction_col, "prediction column")
        ignored = spec.ignore_class
        if label_kind != "scalar":
            LossEvaluator._check_not_one_hot(dataset, predictions, label_col)
            return LossEvaluator._sparse_per_step(dataset, predictions, label_col, spec)
        label = column(label_col).cast(T.DoubleType())
        index = label.cast(T.LongType())
        per_row = -F.element_at(_log_probabilities(predictions, spec.from_logits),
                                (index + 1).cast(T.IntegerType()))
        # A fractional label is no class: refused, not truncated to one.
        valid = (index >= 0) & (index < F.size(predictions)) & (label == F.floor(label))
        per_row = F.when(valid, per_row).otherwise(_fail(
            f"LossEvaluator: label column {label_col!r} holds a class index that is null, "
            f"fractional or outside the prediction arrays of column {prediction_col!r}."))
        if ignored is None:
            return per_row, None
        # The ignored class may lie outside the predictions (-1, 255): checked first.
        kept = label != float(ignored)
        return F.when(kept, per_row).otherwise(F.lit(0.0)), kept.cast(T.DoubleType())

    @staticmethod
    def _sparse_per_step(dataset, predictions, label_col, spec):
        """A tagger's loss: one class index per step against its ``(steps, classes)``
        predictions, the mean over steps (as Keras's, without a mask), and the share of
        the steps that count (those not of ``ignore_class``; None for all)."""
        labels = double_array(dataset, label_col, "label column")
        ignored = spec.ignore_class

        def term(y, p):
            picked = F.element_at(_log_probabilities(p, spec.from_logits),
                                  (y.cast(T.LongType()) + 1).cast(T.IntegerType()))
            valid = (y >= 0) & (y < F.size(p)) & (y == F.floor(y))
            value = F.when(valid, -picked).otherwise(_fail(
                f"LossEvaluator: label column {label_col!r} holds a class index that is "
                "fractional or outside a step's predictions."))
            return value if ignored is None else \
                F.when(y != float(ignored), value).otherwise(F.lit(0.0))

        per_row = _step_mean(labels, predictions, term, "LossEvaluator")
        if ignored is None:
            return per_row, None
        kept = F.size(F.filter(labels, lambda y: y != float(ignored)))
        return per_row, kept / F.size(labels)

    @staticmethod
    def _check_not_one_hot(dataset, predictions, label_col):
        """Refuses label arrays as long as the predictions (one-hot labels, judged on the
        first row holding both) on the driver: class indices per step are fewer."""
        labels = double_array(dataset, label_col, "label column")
        row = dataset.where(predictions.isNotNull() & labels.isNotNull()) \
            .select(F.size(labels).alias("labels"), F.size(predictions).alias("predictions")) \
            .first()
        if row is not None and row["labels"] >= row["predictions"]:
            raise TypeError(
                f"sparse_categorical_crossentropy needs class indices in label column "
                f"{label_col!r}: numbers, or an array of one per step for a model with an "
                f"output of shape (steps, classes); it holds arrays of {row['labels']} "
                f"values against predictions of {row['predictions']}. Use "
                "categorical_crossentropy for one-hot labels.")

    def isLargerBetter(self):
        """A loss: smaller is better."""
        return False
