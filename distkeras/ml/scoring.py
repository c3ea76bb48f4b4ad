"""The scoring machinery the evaluators share: a per-row column averaged over a DataFrame
by Spark aggregations, rows that cannot be scored counted and refused on the driver, and
the checks of the prediction, label and weight columns (nulls, nested labels, steps).

A row that cannot be scored (`refuse_row`) is null while `checked_mean` builds the
evaluation, and stops the job with its message anywhere else.
"""

import contextlib
import contextvars

from pyspark.sql import functions as F
from pyspark.sql import types as T

from distkeras.data.frame_columns import column
from distkeras.ml.columns import column_kind, fail


# While an evaluator builds its per-row column (`checked_mean`): what `refuse_row` writes for
# a row that cannot be scored, given the error's message. Unset: a job error.
_UNSCORED = contextvars.ContextVar("distkeras_unscored", default=None)


def refuse_row(message):
    """A column for a row that cannot be scored: null while `checked_mean` builds the
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


def checked_mean(dataset, terms, what, per_weight=True):
    """`mean_of` the per-row column that ``terms()`` builds, refusing rows that cannot be
    scored (nulls, arrays that do not fit, fractional class indices) with a ValueError on
    the driver.

    Such a row stopped the Spark job (``F.raise_error``), so Spark ran its task again,
    up to 4 times (each retry reading the partition again up to that row: predicting it
    again, for the lazy output of a `ModelPredictor`), and the message came inside a
    long Java trace. The rows are now scored as null and counted in the same job; only
    when some are, a second job finds which check they failed, to name it.

    Args:
        dataset: The DataFrame.
        terms: Builds ``(per_row, weight, share)`` (see `mean_of`).
        what: What the mean is, for the errors.
        per_weight: See `mean_of`.
    """
    messages = []

    def unscored(message):
        messages.append(message)
        return F.lit(None)

    with _unscored_as(unscored):
        per_row, weight, share = terms()
    value, unscored_rows = mean_of(dataset, per_row, what, weight, per_weight, share)
    if unscored_rows:
        raise ValueError(_unscored_reason(dataset, terms, messages, unscored_rows, what))
    return value


def _unscored_reason(dataset, terms, messages, count, what):
    """The error of the first of ``messages`` (`refuse_row`'s, in the order built) that some
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


def step_mean(labels, predictions, term, evaluator):
    """The mean over steps of ``term(label, step_predictions)`` for a row holding one class
    index per step (a tagger's labels, ``(steps,)``) against its flattened predictions
    (``(steps, classes)``, as ModelPredictor writes them); a row whose prediction length is
    not a multiple of its label length stops the job."""
    steps = F.size(labels)
    classes = (F.size(predictions) / steps).cast(T.IntegerType())
    terms = F.transform(labels, lambda y, i: term(
        y, F.slice(predictions, i * classes + 1, classes)))
    valid = (steps > 0) & (F.size(predictions) % steps == 0)
    return F.when(valid, array_sum(terms) / steps).otherwise(refuse_row(
        f"{evaluator}: a row's prediction array is not a whole number of steps of its "
        "label array (one class index per step, against the flattened (steps, classes) "
        "predictions); check that the label and prediction columns belong together."))


def is_nested(dataset, name):
    """Whether column ``name`` holds arrays of arrays (a tagger's one-hot labels,
    ``(steps, classes)``, as the trainers read them)."""
    data_type = dataset.schema[name].dataType if name in dataset.columns else None
    return isinstance(data_type, T.ArrayType) and isinstance(data_type.elementType,
                                                             T.ArrayType)


def nested_rows(dataset, name):
    """Column ``name`` (arrays of arrays of numbers) as ``array<array<double>>``."""
    inner = dataset.schema[name].dataType.elementType
    if not isinstance(inner.elementType, (T.NumericType, T.BooleanType)):
        raise TypeError(f"Column {name!r} (the label column) has type "
                        f"{dataset.schema[name].dataType.simpleString()}; expected arrays "
                        "(of arrays) of numbers.")
    return column(name).cast(T.ArrayType(T.ArrayType(T.DoubleType())))


def mean_of(dataset, per_row, what, weight=None, per_weight=True, share=None):
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


def row_weights(dataset, name, evaluator):
    """Column ``name`` as per-row weights (doubles), refusing null rows as
    `refusing_nulls` does (checked on the weight itself: ``value * null`` is folded to
    null before the value's check would run); None for no column; a TypeError for a
    column that is not one number per row."""
    if not name:  # unset or "", as Spark's evaluators read weightCol
        return None
    if column_kind(dataset, name, "weight column") != "scalar":
        raise TypeError(f"Column {name!r} (the weight column) must hold one number per row; "
                        f"it has type {dataset.schema[name].dataType.simpleString()}.")
    return refusing_nulls(dataset, column(name).cast(T.DoubleType()), evaluator, name)


def refusing_nulls(dataset, per_row, evaluator, *names):
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
        if is_nested(dataset, name):
            values = F.flatten(column(name))
        elif column_kind(dataset, name, "column") == "array":
            values = column(name)
        else:  # a number, or a Spark ML vector (whose values are never null)
            values = None
        checked = F.when(column(name).isNull(), refuse_row(
            f"{evaluator}: column {name!r} holds null rows; drop them first, for example "
            f"`dataset.dropna(subset=[{name!r}])`.")).otherwise(
            checked if values is None else F.when(
                F.exists(values, lambda x: x.isNull()), refuse_row(
                    f"{evaluator}: column {name!r} holds arrays with a null value; drop "
                    "those rows first (dropna does not look inside arrays), for example "
                    f"`dataset.where(~F.exists({name!r}, lambda x: x.isNull()))`.")
            ).otherwise(checked))
    return checked


def array_sum(array):
    """The sum of an array column's elements (0 for an empty array)."""
    return F.aggregate(array, F.lit(0.0), lambda total, x: total + x)
