"""Layout transformers: arrays as dense vectors (`DenseTransformer`), flat arrays as
nested ones of a shape (`ReshapeTransformer`), and arrays packed as binary float32
tensors (`PackedTensorTransformer`)."""

import math

from pyspark.ml.functions import array_to_vector
from pyspark.ml.param import Param, Params
from pyspark.sql import functions as F

from distkeras.data.frame_columns import column, vector_values
from distkeras.data.tensors import pack_udf
from distkeras.ml.column_stage import ColumnTransformer
from distkeras.ml.columns import FLOAT_ARRAY, column_kind, double_array, fail, null_or
from distkeras.ml.params import getter, require, set_given, setter, to_ints


class DenseTransformer(ColumnTransformer):
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


class ReshapeTransformer(ColumnTransformer):
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


class PackedTensorTransformer(ColumnTransformer):
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
        kind = column_kind(dataset, input_col, nested=True)
        if kind == "scalar":
            raise TypeError(
                f"Column {input_col!r} holds single numbers; PackedTensorTransformer packs "
                "arrays of numbers or vectors.")
        values = vector_values(input_col) if kind == "vector" else column(input_col)
        return pack_udf(input_col)(values)
