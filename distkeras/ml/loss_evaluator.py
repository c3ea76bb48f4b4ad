"""`LossEvaluator`: the mean loss of a prediction column over a DataFrame, computed by
Spark aggregations as Keras computes the loss (its clipping, smoothing and reductions).

Example::

    loss = LossEvaluator("categorical_crossentropy", prediction_col="prediction",
                         label_col="label").evaluate(predicted)
"""

import numpy as np
from pyspark.ml.evaluation import Evaluator
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasLabelCol, HasPredictionCol, HasWeightCol
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import functions as F
from pyspark.sql import types as T

from distkeras.data.frame_columns import column
from distkeras.ml.columns import column_kind, double_array
from distkeras.ml.loss_specs import LOSSES, loss_text, resolve_loss
from distkeras.ml.params import getter, set_given, set_params, setter
from distkeras.ml.scoring import (array_sum, checked_mean, is_nested, nested_rows,
                                  refuse_row, refusing_nulls, row_weights, step_mean)

EPSILON = 1e-7  # keras.config.epsilon(): predictions are clipped to [EPSILON, 1 - EPSILON]
# The clip bounds as Keras applies them, to float32 predictions: 1 - 1e-7 rounds to
# 1 - 2**-23 there, so a saturated sigmoid (1.0) with label 0 costs -log(2**-23) = 15.94 in
# Keras's binary cross-entropy, not the -log(1e-7) = 16.12 of the bound in doubles.
_CLIP_LOW = float(np.float32(EPSILON))
_CLIP_HIGH = float(np.float32(1.0 - EPSILON))


def _clip(value):
    return F.least(F.greatest(value, F.lit(_CLIP_LOW)), F.lit(_CLIP_HIGH))


def _log_probabilities(predictions, from_logits):
    """Per element, the log of a row's class probabilities, as Keras's cross-entropies
    take them: probabilities scaled to sum to 1 and clipped; logits through a log-softmax
    (shifted by their largest, so no ``exp`` overflows), not clipped."""
    if not from_logits:
        total = array_sum(predictions)
        return F.transform(predictions, lambda p: F.log(_clip(p / total)))
    top = F.array_max(predictions)
    log_total = F.log(array_sum(F.transform(predictions, lambda z: F.exp(z - top)))) + top
    return F.transform(predictions, lambda z: z - log_total)


def _categorical_cross_entropy(labels, predictions, spec):
    """The categorical cross-entropy of one row (or step): its labels smoothed towards
    ``1 / classes`` by the loss's ``label_smoothing``, as Keras's are."""
    smoothing = spec.label_smoothing
    if smoothing:
        labels = F.transform(labels, lambda y: y * (1.0 - smoothing)
                             + smoothing / F.size(labels))
    return -array_sum(F.zip_with(labels, _log_probabilities(predictions, spec.from_logits),
                                 lambda y, log_p: y * log_p))


def _binary_cross_entropy(y, p, from_logits):
    """The binary cross-entropy of one element: of a probability clipped as Keras clips
    it, or of a logit, ``-y*log(sigmoid(z)) - (1-y)*log(sigmoid(-z))``, written without
    overflow."""
    if from_logits:
        return F.greatest(p, F.lit(0.0)) - p * y + F.log1p(F.exp(-F.abs(p)))
    p = _clip(p)
    return -(y * F.log(p) + (1.0 - y) * F.log(1.0 - p))


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
                 "loss's config (JSON)", typeConverter=loss_text)
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
        spec = resolve_loss(self.getOrDefault(self.loss), self.getFromLogits(),
                             self.isSet(self.fromLogits))
        loss = spec.name
        if spec.from_logits and not loss.endswith("crossentropy"):
            raise ValueError(f"`from_logits=True` applies to the cross-entropies, not to "
                             f"{loss}, whose predictions are the values themselves.")
        return checked_mean(dataset, lambda: self._terms(dataset, spec), f"the {loss} loss",
                             per_weight=spec.per_weight)

    def _terms(self, dataset, spec):
        loss = spec.name
        share = None
        prediction_col, label_col = self.getPredictionCol(), self.getLabelCol()
        prediction_kind = column_kind(dataset, prediction_col, "prediction column")
        nested = is_nested(dataset, label_col) and loss != "sparse_categorical_crossentropy"
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
        weight = row_weights(dataset, weight_col, "LossEvaluator")
        per_row = refusing_nulls(dataset, per_row, "LossEvaluator", prediction_col,
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
        return F.when(F.size(predictions) == 1, per_row).otherwise(refuse_row(
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
            per_row = array_sum(terms) / F.size(terms)
        return F.when(F.size(labels) == F.size(predictions), per_row).otherwise(refuse_row(
            f"LossEvaluator: label column {label_col!r} and prediction column "
            f"{prediction_col!r} hold arrays of different lengths in some row."))

    def _nested(self, dataset, spec, prediction_col, label_col):
        """Labels of shape ``(steps, classes)`` (a tagger's one-hot labels) against the
        flattened predictions: categorical cross-entropy per step, the others per element,
        each the mean over the row as Keras's."""
        predictions = double_array(dataset, prediction_col, "prediction column")
        labels = nested_rows(dataset, label_col)
        if spec.name != "categorical_crossentropy":
            flat = F.flatten(labels)
            terms = F.zip_with(flat, predictions, lambda y, p: self._term(spec, y, p))
            mean = array_sum(terms) / F.size(terms)
            return F.when(F.size(flat) == F.size(predictions), mean).otherwise(refuse_row(
                f"LossEvaluator: label column {label_col!r} and prediction column "
                f"{prediction_col!r} hold different numbers of values in some row."))

        def term(y, p):
            cross = _categorical_cross_entropy(y, p, spec)
            return F.when(F.size(y) == F.size(p), cross).otherwise(refuse_row(
                f"LossEvaluator: label column {label_col!r} holds steps of another number of "
                f"classes than prediction column {prediction_col!r}."))

        return step_mean(labels, predictions, term, "LossEvaluator")

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
        per_row = F.when(valid, per_row).otherwise(refuse_row(
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
            value = F.when(valid, -picked).otherwise(refuse_row(
                f"LossEvaluator: label column {label_col!r} holds a class index that is "
                "fractional or outside a step's predictions."))
            return value if ignored is None else \
                F.when(y != float(ignored), value).otherwise(F.lit(0.0))

        per_row = step_mean(labels, predictions, term, "LossEvaluator")
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
