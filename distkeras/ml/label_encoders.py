"""Label transformers: class indices as one-hot arrays (`OneHotTransformer`,
`BinaryLabelTransformer`) and prediction vectors as class indices
(`LabelIndexTransformer`), from Spark's own column functions."""

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.sql import functions as F
from pyspark.sql import types as T

from distkeras.data.frame_columns import column
from distkeras.ml.column_stage import ColumnTransformer
from distkeras.ml.columns import (argmax, as_output_type, column_kind, column_type,
                                  double_array, fail, null_or)
from distkeras.ml.params import (HasOutputType, getter, one_of, require, set_given, setter,
                                 to_int, to_label, to_number)


class OneHotTransformer(ColumnTransformer, HasOutputType):
    """Turns a class index into a one-hot ``array<float>`` of length ``output_dim``.

    An index that is null, negative, fractional or ``>= output_dim`` stops the job with an
    error naming the column.

    Args:
        output_dim: Number of classes (length of the output arrays).
        input_col: Column of class indices (any numeric type).
        output_col: Name of the new column.
        output_type: ``"array"`` (``array<float>``) or ``"vector"`` (Spark ML
            ``DenseVector``s, as dist-keras wrote: ``row[col].toArray()`` works).
    """

    outputDim = Param(Params._dummy(), "outputDim", "number of classes (length of the output "
                      "array)", typeConverter=to_int)
    setOutputDim = setter("outputDim")
    getOutputDim = getter("outputDim")

    def __init__(self, output_dim=None, input_col=None, output_col=None, output_type="array"):
        super().__init__()
        self._setDefault(outputType="array")
        set_given(self, outputDim=output_dim, inputCol=input_col, outputCol=output_col,
                   outputType=output_type)

    def _expression(self, dataset, input_col):
        size = require(self, self.outputDim)
        if size < 1:
            raise ValueError(f"`output_dim` must be an integer >= 1. Received: output_dim={size}")
        if column_kind(dataset, input_col) != "scalar":
            raise TypeError(
                f"OneHotTransformer expects column {input_col!r} to hold class indices "
                f"(numbers); it has type {dataset.schema[input_col].dataType.simpleString()}."
            )
        index = column(input_col).cast(T.DoubleType())
        valid = (index >= 0) & (index < size) & (index == F.floor(index))
        one_hot = F.transform(F.sequence(F.lit(0), F.lit(size - 1)),
                              lambda i: F.when(i == index, 1.0).otherwise(0.0))
        return F.when(valid, as_output_type(one_hot, self.getOutputType())).otherwise(fail(
            f"OneHotTransformer: column {input_col!r} holds a value that is not a class "
            f"index in [0, {size - 1}] (null, negative, fractional or too large)."))


class LabelIndexTransformer(ColumnTransformer):
    """Turns a prediction vector into a class index (``double``).

    As in dist-keras: the first position whose value reaches ``activation_threshold``;
    when none does, the position of the largest value (ties: the first); ``default_index``
    when no value is positive. With ``output_dim=1`` (one sigmoid unit) the class is 1
    when the value is above 0.5, else 0, as Keras's binary accuracy reads it.

    That rule reads probabilities. A model whose last layer has no activation (a loss
    with ``from_logits=True``) outputs logits, several of which may pass the threshold
    and all of which may be negative: ``from_logits=True`` takes the position of the
    largest logit (one unit: class 1 above 0), as Keras's accuracy metrics do.

    Args:
        output_dim: Length of the prediction vectors (checked on every row).
        input_col: Column of predictions (arrays of numbers or vectors).
        output_col: Name of the new column.
        default_index: The index when no value is positive.
        activation_threshold: The smallest winning value.
        from_logits: Whether the predictions are logits (the threshold and the default
            index are then not used).
    """

    outputDim = Param(Params._dummy(), "outputDim", "length of the prediction vectors",
                      typeConverter=to_int)
    defaultIndex = Param(Params._dummy(), "defaultIndex", "index when no value is positive",
                         typeConverter=to_int)
    activationThreshold = Param(Params._dummy(), "activationThreshold", "smallest winning "
                                "value", typeConverter=to_number)
    fromLogits = Param(Params._dummy(), "fromLogits", "whether the predictions are logits",
                       typeConverter=TypeConverters.toBoolean)
    setOutputDim = setter("outputDim")
    getOutputDim = getter("outputDim")
    setFromLogits = setter("fromLogits")
    getFromLogits = getter("fromLogits")
    setDefaultIndex = setter("defaultIndex")
    getDefaultIndex = getter("defaultIndex")
    setActivationThreshold = setter("activationThreshold")
    getActivationThreshold = getter("activationThreshold")

    def __init__(self, output_dim=None, input_col="prediction", output_col="prediction_index",
                 default_index=0, activation_threshold=0.55, from_logits=False):
        super().__init__()
        self._setDefault(inputCol="prediction", outputCol="prediction_index", defaultIndex=0,
                         activationThreshold=0.55, fromLogits=False)
        set_given(self, outputDim=output_dim, inputCol=input_col, outputCol=output_col,
                   defaultIndex=default_index, activationThreshold=activation_threshold,
                   fromLogits=from_logits)

    def _expression(self, dataset, input_col):
        size = require(self, self.outputDim)
        if size < 1:  # else every row would fail the job as of the wrong length
            raise ValueError(f"`output_dim` must be an integer >= 1. Received: output_dim={size}")
        values = double_array(dataset, input_col)
        threshold = self.getOrDefault(self.activationThreshold)
        first_above = F.array_position(F.transform(values, lambda v: v >= threshold), True)
        index = F.when(first_above > 0, first_above - 1) \
            .when(F.array_max(values) > 0, argmax(values)) \
            .otherwise(F.lit(self.getOrDefault(self.defaultIndex)))
        from_logits = self.getOrDefault(self.fromLogits)
        if from_logits:
            index = argmax(values)
        if size == 1:  # one unit: a position would always be 0
            # A sigmoid's 0.5 is a logit's 0.
            index = F.when(F.element_at(values, 1) > (0.0 if from_logits else 0.5), 1) \
                .otherwise(0)
        return null_or(values).when(
            F.size(values) == size, index.cast(T.DoubleType())).otherwise(fail(
            f"LabelIndexTransformer: column {input_col!r} holds a prediction whose length is "
            f"not output_dim={size}."))


class BinaryLabelTransformer(ColumnTransformer, HasOutputType):
    """Turns a column into a two-class one-hot label: ``[1, 0]`` where it equals ``label``,
    ``[0, 1]`` elsewhere (nulls included).

    This is the original dist-keras encoding (first element: "is ``label``"), ready for a
    two-unit softmax output. The output is an ``array<float>`` of length 2.

    Args:
        input_col: Column to compare (strings or numbers); ``input_column`` (dist-keras's
            name) too.
        output_col: Name of the new column; ``output_column`` too.
        label: The value that counts as the positive class.
        output_type: ``"array"`` (``array<float>``) or ``"vector"`` (Spark ML
            ``DenseVector``s, as dist-keras wrote: ``row[col].toArray()`` works).
    """

    label = Param(Params._dummy(), "label", "the value of the positive class",
                  typeConverter=to_label)
    setLabel = setter("label")
    getLabel = getter("label")

    def __init__(self, input_col=None, output_col=None, label=None, *, input_column=None,
                 output_column=None, output_type="array"):
        super().__init__()
        self._setDefault(outputType="array")
        # dist-keras named them input_column and output_column.
        input_col = one_of("input_col", input_col, "input_column", input_column)
        output_col = one_of("output_col", output_col, "output_column", output_column)
        set_given(self, inputCol=input_col, outputCol=output_col, label=label,
                   outputType=output_type)

    def _expression(self, dataset, input_col):
        label = require(self, self.label)
        data_type = column_type(dataset, input_col)
        values = column(input_col)
        if isinstance(label, str) != isinstance(data_type, T.StringType):
            # Spark would cast the strings to numbers, and fail on the first that is not one
            # (or compare "1" with 1.0 as unequal).
            raise TypeError(
                f"BinaryLabelTransformer: column {input_col!r} has type "
                f"{data_type.simpleString()} but label={label!r} is "
                f"{'a string' if isinstance(label, str) else 'a number'}; pass the label as "
                f"{'a string' if isinstance(data_type, T.StringType) else 'a number'}, "
                "of the column's own type.")
        if isinstance(data_type, T.BooleanType):
            values = values.cast(T.DoubleType())  # True is 1, False 0
        matches = F.coalesce(values == F.lit(label), F.lit(False))
        return as_output_type(F.when(matches, F.array(F.lit(1.0), F.lit(0.0)))
                              .otherwise(F.array(F.lit(0.0), F.lit(1.0))),
                              self.getOutputType())
