"""Rescaling transformers: `MinMaxTransformer` (a linear map between two ranges) and
`StandardTransformer` (``(x - mean) / std``), with `StandardEstimator`, which fits the
mean and deviation on training data."""

import logging
import math

import numpy as np
from pyspark.ml import Estimator
from pyspark.ml.functions import array_to_vector
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasInputCol, HasOutputCol
from pyspark.ml.util import DefaultParamsReadable, DefaultParamsWritable
from pyspark.sql import functions as F
from pyspark.sql import types as T

from distkeras.data.frame_columns import check_output_column_free, column
from distkeras.ml.column_stage import ColumnTransformer
from distkeras.ml.columns import as_input_kind, column_kind, double_array, fail, null_or
from distkeras.ml.params import (getter, require, set_given, set_params, setter, to_number,
                                 to_numbers)

logger = logging.getLogger(__name__)


class MinMaxTransformer(ColumnTransformer):
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


class StandardTransformer(ColumnTransformer):
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
