"""DataFrame transformers: preprocessing steps that fit in a `pyspark.ml.Pipeline`.

Every class here is a `pyspark.ml.Transformer` (or, for `StandardEstimator`, an
`Estimator`) with Spark ML Params, so it can stand in a Pipeline and be saved and loaded
with it (``Pipeline.save(path)`` / ``PipelineModel.load(path)``). Each one is built from
Spark's own column functions (``transform``, ``aggregate``, ``array_max``, ...): no Python
runs per row, and the work stays in the JVM.

Arrays come out as ``array<float>`` (what the trainers read without a conversion); Spark
ML vectors are accepted wherever an array of numbers is. The element-wise rescalers
(`MinMaxTransformer`, `StandardTransformer`) give a column of the input's kind: dense
vectors for vectors, as Spark's own scalers and dist-keras did, arrays for arrays.
`DenseTransformer` outputs vectors; the others arrays (or numbers).

Example::

    from pyspark.ml import Pipeline
    pipeline = Pipeline(stages=[
        MinMaxTransformer(0.0, 255.0, 0.0, 1.0, input_col="pixels", output_col="features"),
        OneHotTransformer(10, input_col="digit", output_col="label"),
    ])
    prepared = pipeline.fit(dataframe).transform(dataframe)
"""

import logging
import math

import numpy as np
from pyspark.ml import Estimator, Transformer
from pyspark.ml.functions import array_to_vector
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCol, HasOutputCol
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import functions as F
from pyspark.sql import types as T

from distkeras.data.dataframes import (check_output_column_free, column, same_column,
                                       vector_values)
from distkeras.ml.columns import (FLOAT_ARRAY, argmax, as_input_kind, as_output_type,
                                  column_kind, column_type, double_array, fail, null_or)
from distkeras.ml.params import (HasOutputType, getter, one_of, require, set_given,
                                 set_params, setter, to_int, to_ints, to_label, to_number,
                                 to_numbers)

logger = logging.getLogger(__name__)

class _ColumnTransformer(Transformer, HasInputCol, HasOutputCol, DefaultParamsReadable,
                         DefaultParamsWritable):
    """Base of the transformers here: one input column in, one output column added."""

    setParams = set_params
    setInputCol = setter("inputCol")
    setOutputCol = setter("outputCol")

    def _columns(self):
        return require(self, self.inputCol), require(self, self.outputCol)

    def _transform(self, dataset):
        input_col, output_col = self._columns()
        if not same_column(dataset, output_col, input_col):
            # withColumn would replace it without a word: LabelIndexTransformer(...,
            # output_col="label") wrote the predictions over the labels, which then scored
            # an accuracy of 1.0. Replacing the input column itself stays as asked.
            check_output_column_free(dataset, output_col, f"{type(self).__name__}: column")
        return dataset.withColumn(output_col, self._expression(dataset, input_col))

    def _expression(self, dataset, input_col):
        raise NotImplementedError


# -- transformers ---------------------------------------------------------------------------


class OneHotTransformer(_ColumnTransformer, HasOutputType):
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


class MinMaxTransformer(_ColumnTransformer):
    """Rescales values linearly from ``[o_min, o_max]`` to ``[n_min, n_max]``.

    ``x' = n_min + (x - o_min) * (n_max - n_min) / (o_max - o_min)``, the same mapping as
    the original dist-keras. Values outside ``[o_min, o_max]`` are mapped by the same line
    (not clipped).

    Args:
        o_min: Minimum of the original range.
        o_max: Maximum of the original range (must differ from ``o_min``).
        n_min: Minimum of the new range.
        n_max: Maximum of the new range.
        input_col: Column to rescale.
        output_col: Name of the new column.
        is_vector: True when the column holds arrays or vectors (the output is then an
            ``array<float>`` for arrays, a dense vector for vectors); False for a column of
            single numbers (output ``double``).
    """

    oMin = Param(Params._dummy(), "oMin", "minimum of the original range",
                 typeConverter=to_number)
    oMax = Param(Params._dummy(), "oMax", "maximum of the original range",
                 typeConverter=to_number)
    nMin = Param(Params._dummy(), "nMin", "minimum of the new range", typeConverter=to_number)
    nMax = Param(Params._dummy(), "nMax", "maximum of the new range", typeConverter=to_number)
    isVector = Param(Params._dummy(), "isVector", "whether the column holds arrays/vectors "
                     "(else single numbers)", typeConverter=TypeConverters.toBoolean)
    setOMin = setter("oMin")
    getOMin = getter("oMin")
    setOMax = setter("oMax")
    getOMax = getter("oMax")
    setNMin = setter("nMin")
    getNMin = getter("nMin")
    setNMax = setter("nMax")
    getNMax = getter("nMax")
    setIsVector = setter("isVector")
    getIsVector = getter("isVector")

    def __init__(self, o_min=None, o_max=None, n_min=None, n_max=None, input_col=None,
                 output_col=None, is_vector=True):
        super().__init__()
        self._setDefault(isVector=True)
        set_given(self, oMin=o_min, oMax=o_max, nMin=n_min, nMax=n_max, inputCol=input_col,
                   outputCol=output_col, isVector=is_vector)

    def _expression(self, dataset, input_col):
        o_min, o_max, n_min, n_max = (require(self, param) for param in
                                      (self.oMin, self.oMax, self.nMin, self.nMax))
        if o_max == o_min:
            raise ValueError(
                f"`o_min` and `o_max` must differ. Received: o_min={o_min}, o_max={o_max}")
        scale = (n_max - n_min) / (o_max - o_min)
        kind = column_kind(dataset, input_col)
        if self.getOrDefault(self.isVector):
            if kind == "scalar":
                raise TypeError(
                    f"Column {input_col!r} holds single numbers but is_vector=True; pass "
                    "is_vector=False to rescale a column of numbers.")
            rescaled = F.transform(double_array(dataset, input_col),
                                   lambda x: (x - o_min) * scale + n_min)
            return as_input_kind(rescaled, kind, input_col)
        if kind != "scalar":
            raise TypeError(
                f"Column {input_col!r} holds arrays or vectors but is_vector=False; pass "
                "is_vector=True to rescale every element.")
        return (column(input_col).cast(T.DoubleType()) - o_min) * scale + n_min


class StandardTransformer(_ColumnTransformer):
    """Standardizes values: ``(x - mean) / std``, element by element.

    ``mean`` and ``std`` are given (or computed by `StandardEstimator`, which fits them on
    training data and returns this transformer). Each is one number, applied to every
    element, or one number per element of the arrays. Unlike the original dist-keras, this
    transformer never computes statistics on the data it transforms (that would leak test
    statistics into the features).

    Args:
        input_col: Column of numbers, arrays of numbers or vectors.
        output_col: Name of the new column (``array<float>`` for arrays, a dense vector
            for vectors, ``double`` for numbers).
        mean: A number or a list of numbers.
        std: A number or a list of positive numbers.
        columns: dist-keras's form, instead of the four above: a list of columns of
            numbers, each standardized with the mean and (population) standard deviation
            of the DataFrame being transformed, into a new column ``<column><suffix>``
            (a zero deviation counts as 1). ``StandardTransformer(["a", "b"], "_norm")``
            works too.
        suffix: The new columns' suffix in that form (default ``"_normalized"``).
    """

    mean = Param(Params._dummy(), "mean", "mean to subtract: one value or one per element",
                 typeConverter=to_numbers)
    std = Param(Params._dummy(), "std", "standard deviation to divide by: one value or one "
                "per element", typeConverter=to_numbers)
    setMean = setter("mean")
    getMean = getter("mean")
    setStd = setter("std")
    getStd = getter("std")

    columns = Param(Params._dummy(), "columns", "dist-keras's form: columns of numbers, "
                    "each standardized with its own statistics on the transformed data",
                    typeConverter=TypeConverters.toListString)
    suffix = Param(Params._dummy(), "suffix", "suffix of the new columns in dist-keras's "
                   "form", typeConverter=TypeConverters.toString)
    setColumns = setter("columns")
    getColumns = getter("columns")
    setSuffix = setter("suffix")
    getSuffix = getter("suffix")

    def __init__(self, input_col=None, output_col=None, mean=None, std=None, columns=None,
                 suffix=None):
        super().__init__()
        self._setDefault(suffix="_normalized")
        # dist-keras's StandardTransformer(columns, suffix)
        if isinstance(input_col, (list, tuple)):
            if columns is not None or mean is not None or std is not None:
                raise ValueError(
                    "StandardTransformer takes either dist-keras's (columns, suffix) or "
                    "(input_col, output_col, mean, std). Received a list of columns "
                    f"{input_col!r} and columns/mean/std as well.")
            input_col, output_col, columns, suffix = None, None, list(input_col), output_col
        if columns is not None and (input_col is not None or mean is not None):
            raise ValueError("StandardTransformer takes either columns=[...] (dist-keras's "
                             "form) or input_col/output_col with mean and std, not both.")
        set_given(self, inputCol=input_col, outputCol=output_col, mean=mean, std=std,
                   columns=columns, suffix=suffix)

    def _transform(self, dataset):
        if not self.isDefined(self.columns):
            return super()._transform(dataset)
        return self._standardize_columns(dataset, self.getOrDefault(self.columns),
                                         self.getOrDefault(self.suffix))

    @staticmethod
    def _standardize_columns(dataset, columns, suffix):
        """dist-keras's form: each column of numbers standardized with its own mean and
        population deviation on ``dataset``, into ``<column><suffix>``."""
        if not columns:
            raise ValueError("`columns` must name at least one column of numbers.")
        for name in columns:
            if column_kind(dataset, name, "column to standardize") != "scalar":
                raise TypeError(
                    f"StandardTransformer(columns=...) standardizes columns of single "
                    f"numbers, as dist-keras's did; {name!r} holds arrays or vectors: use "
                    f"StandardEstimator(input_col={name!r}, output_col=...).fit(train).")
            check_output_column_free(dataset, name + suffix, "StandardTransformer: column")
        found = dataset.select(*[F.struct(F.mean(column(name)).alias("mean"),
                                          F.stddev_pop(column(name)).alias("std"))
                                 for name in columns]).first()
        logger.info("StandardTransformer standardizes %s with statistics of the DataFrame "
                    "it transforms (dist-keras's form)", columns)
        for name, stats in zip(columns, found):
            if stats["mean"] is None:
                raise ValueError(f"StandardTransformer: column {name!r} has no values to "
                                 "compute a mean of.")
            std = stats["std"] if stats["std"] and math.isfinite(stats["std"]) else 1.0
            dataset = dataset.withColumn(
                name + suffix, (column(name).cast(T.DoubleType()) - stats["mean"]) / std)
        return dataset

    def _expression(self, dataset, input_col):
        mean = require(self, self.mean)
        std = require(self, self.std)
        if not mean or not std or (len(mean) != len(std) and 1 not in (len(mean), len(std))):
            raise ValueError(
                f"`mean` and `std` must hold one value, or one value per element, each. "
                f"Received {len(mean)} means and {len(std)} standard deviations.")
        if any(not value > 0 or not math.isfinite(value) for value in std):
            raise ValueError("Every `std` must be a positive finite number (use 1.0 for a "
                             "constant feature).")
        if column_kind(dataset, input_col) == "scalar":
            if len(mean) != 1 or len(std) != 1:
                raise ValueError(
                    f"Column {input_col!r} holds single numbers, so `mean` and `std` must be "
                    f"single values. Received {len(mean)} means, {len(std)} stds.")
            return (column(input_col).cast(T.DoubleType()) - mean[0]) / std[0]
        values = double_array(dataset, input_col)
        size = max(len(mean), len(std))

        def pick(constants, i):
            if len(constants) == 1:
                return F.lit(constants[0])
            return F.element_at(F.lit(constants), i + 1)

        standardized = F.transform(values, lambda x, i: (x - pick(mean, i)) / pick(std, i))
        standardized = as_input_kind(standardized, column_kind(dataset, input_col), input_col)
        if size == 1:
            return standardized
        return null_or(values).when(
            F.size(values) == size, standardized).otherwise(fail(
            f"StandardTransformer: column {input_col!r} holds an array whose length is not "
            f"{size}, the number of means/stds."))


class StandardEstimator(Estimator, HasInputCol, HasOutputCol, DefaultParamsReadable,
                        DefaultParamsWritable):
    """Fits per-element mean and (population) standard deviation; returns a
    `StandardTransformer`.

    Elements with zero deviation get ``std = 1`` (they become 0 after centering). Statistics
    come from Spark's ``Summarizer`` in one pass over the data.

    Args:
        input_col: Column of numbers, arrays of numbers or vectors.
        output_col: Name of the column the fitted transformer adds.
    """

    setParams = set_params
    setInputCol = setter("inputCol")
    setOutputCol = setter("outputCol")

    def __init__(self, input_col=None, output_col=None):
        super().__init__()
        set_given(self, inputCol=input_col, outputCol=output_col)

    def _fit(self, dataset):
        from pyspark.ml.stat import Summarizer

        input_col = require(self, self.inputCol)
        output_col = require(self, self.outputCol)
        kind = column_kind(dataset, input_col)
        if kind == "vector":
            vectors = column(input_col)
        elif kind == "array":
            vectors = array_to_vector(column(input_col).cast(T.ArrayType(T.DoubleType())))
        else:
            vectors = array_to_vector(F.array(column(input_col).cast(T.DoubleType())))
        rows = dataset.where(column(input_col).isNotNull())  # null rows are skipped
        self._check_rows(rows, input_col, kind)
        summary = rows.select(
            Summarizer.metrics("mean", "variance", "count").summary(vectors).alias("s")
        ).first()["s"]
        count = summary["count"]
        mean = summary["mean"].toArray()
        # Summarizer's variance is the sample variance; the population one divides by n.
        variance = summary["variance"].toArray() * ((count - 1) / count)
        std = [float(value) ** 0.5 if value > 0 else 1.0 for value in variance]
        if not (np.all(np.isfinite(mean)) and np.all(np.isfinite(std))):
            raise ValueError(
                f"StandardEstimator: column {input_col!r} holds NaN or infinite values (or "
                "values too large to square), so its mean or standard deviation is not a "
                "number; replace or drop those values first, for example with "
                "pyspark.ml.feature.Imputer or a filter on isnan().")
        logger.info("StandardEstimator fitted %d means on %d rows of %r",
                    len(mean), count, input_col)
        return StandardTransformer(input_col=input_col, output_col=output_col,
                                   mean=[float(value) for value in mean], std=std)

    @staticmethod
    def _check_rows(rows, input_col, kind):
        """At least one row, and arrays of one length without nulls inside: a clear error
        here rather than Spark's summarizer failing in the JVM."""
        values = column(input_col)
        checks = [F.count(F.lit(1)).alias("rows")]
        if kind == "array":
            checks += [F.min(F.size(values)).alias("shortest"),
                       F.max(F.size(values)).alias("longest"),
                       F.max(F.exists(values, lambda x: x.isNull()).cast("int")).alias("holes")]
        found = rows.select(*checks).first()
        if not found["rows"]:
            raise ValueError(f"StandardEstimator: column {input_col!r} has no rows (that are "
                             "not null) to fit on.")
        if kind != "array":
            return
        if found["shortest"] != found["longest"]:
            raise ValueError(
                f"StandardEstimator: column {input_col!r} holds arrays of different lengths "
                f"({found['shortest']} to {found['longest']}); every row needs one value "
                "per feature.")
        if found["holes"]:
            raise ValueError(f"StandardEstimator: column {input_col!r} has null values inside "
                             "its arrays; fill or drop those rows first.")


class DenseTransformer(_ColumnTransformer):
    """Turns sparse (or dense) Spark ML vectors, or arrays of numbers, into dense vectors.

    Args:
        input_col: Column of vectors or arrays of numbers.
        output_col: Name of the new column (a dense `pyspark.ml.linalg` vector).
    """

    def __init__(self, input_col=None, output_col=None):
        super().__init__()
        set_given(self, inputCol=input_col, outputCol=output_col)

    def _expression(self, dataset, input_col):
        # A null row stays null (Spark's own conversion would fail on it).
        return F.when(column(input_col).isNotNull(),
                      array_to_vector(double_array(dataset, input_col)))


class ReshapeTransformer(_ColumnTransformer):
    """Turns flat arrays (or vectors) into nested arrays of the given shape, row-major.

    For example ``shape=(28, 28, 1)`` turns 784 values into
    ``array<array<array<float>>>``, what a Keras model with ``Input((28, 28, 1))`` reads
    (the trainers and `ModelPredictor` also reshape flat arrays themselves).

    Args:
        input_col: Column of arrays of numbers or vectors.
        output_col: Name of the new column.
        shape: The shape of one row's values, a tuple of positive integers.
    """

    shape = Param(Params._dummy(), "shape", "shape of one row's values (row-major)",
                  typeConverter=to_ints)
    setShape = setter("shape")
    getShape = getter("shape")

    def __init__(self, input_col=None, output_col=None, shape=None):
        super().__init__()
        # The Param's converter takes any sequence (and names a value that is none).
        set_given(self, inputCol=input_col, outputCol=output_col, shape=shape)

    def _expression(self, dataset, input_col):
        shape = require(self, self.shape)
        if not shape or any(dim < 1 for dim in shape):
            raise ValueError(
                f"`shape` must be a non-empty tuple of positive integers. Received: {shape}")
        values = double_array(dataset, input_col).cast(FLOAT_ARRAY)
        size = math.prod(shape)

        def nest(dims, offset):
            # The elements from 0-based position `offset` on, laid out as `dims`.
            if len(dims) == 1:
                return F.slice(values, offset + 1, dims[0])
            stride = math.prod(dims[1:])
            return F.transform(F.sequence(F.lit(0), F.lit(dims[0] - 1)),
                               lambda i: nest(dims[1:], offset + i * stride))

        return null_or(values).when(
            F.size(values) == size, nest(shape, F.lit(0))).otherwise(fail(
            f"ReshapeTransformer: column {input_col!r} holds an array whose length is not "
            f"{size}, the number of values in shape {tuple(shape)}."))


class PackedTensorTransformer(_ColumnTransformer):
    """Packs arrays of numbers (flat or nested) or vectors into binary float32 tensors.

    Trainers and `ModelPredictor` read a packed column as they read an ``array<float>``
    (the model's input gives each row's shape), but Spark hands it to Python in one copy
    instead of one float at a time: pack the features once, cache or save the result, and
    every later epoch and prediction reads them faster. The packing itself runs in Python
    (an Arrow UDF), once.

    Args:
        input_col: Column of arrays of numbers (possibly nested) or Spark ML vectors.
        output_col: Name of the new ``binary`` column (may replace ``input_col``).
    """

    def __init__(self, input_col=None, output_col=None):
        super().__init__()
        set_given(self, inputCol=input_col, outputCol=output_col)

    def _expression(self, dataset, input_col):
        from distkeras.data.tensors import pack_udf

        kind = column_kind(dataset, input_col, nested=True)
        if kind == "scalar":
            raise TypeError(
                f"Column {input_col!r} holds single numbers; PackedTensorTransformer packs "
                "arrays of numbers or vectors.")
        values = vector_values(input_col) if kind == "vector" else column(input_col)
        return pack_udf(input_col)(values)


class LabelIndexTransformer(_ColumnTransformer):
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


class BinaryLabelTransformer(_ColumnTransformer, HasOutputType):
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
