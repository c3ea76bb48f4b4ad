"""Column helpers of the Spark ML stages: what kind of column a stage reads, and column
expressions built from Spark's own functions (no Python runs per row)."""

from pyspark.ml.functions import array_to_vector
from pyspark.ml.linalg import VectorUDT
from pyspark.sql import functions as F
from pyspark.sql import types as T

from distkeras.data.frame_columns import column, features_type_hint, vector_values
from distkeras.ml.params import to_output_type

FLOAT_ARRAY = T.ArrayType(T.FloatType())


# -- column helpers (shared by the stages, the evaluators and the predictor) --------------


def is_numeric(data_type):
    return isinstance(data_type, (T.NumericType, T.BooleanType))


def is_numeric_array(data_type):
    return isinstance(data_type, T.ArrayType) and is_numeric(data_type.elementType)


def column_type(dataset, name, role="input column"):
    """The Spark type of column ``name``, or a ValueError naming it and the columns there are."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"The {role} must be a non-empty column name. Received: {name!r}")
    if name not in dataset.columns:
        raise ValueError(
            f"Column {name!r} (the {role}) is not in the DataFrame. Available columns: "
            f"{dataset.columns}."
        )
    return dataset.schema[name].dataType


def is_nested_numeric_array(data_type):
    while isinstance(data_type, T.ArrayType):
        data_type = data_type.elementType
    return is_numeric(data_type)


def column_kind(dataset, name, role="input column", nested=False, packed=False):
    """``"vector"``, ``"array"`` (of numbers) or ``"scalar"`` (a number); else a TypeError.

    With ``nested=True``, arrays of arrays (of arrays...) of numbers count as arrays too;
    with ``packed=True``, a binary column is ``"packed"`` (float32 tensors, see
    `PackedTensorTransformer`).
    """
    data_type = column_type(dataset, name, role)
    if isinstance(data_type, VectorUDT):
        return "vector"
    if packed and isinstance(data_type, T.BinaryType):
        return "packed"
    if is_numeric_array(data_type) or (
            nested and isinstance(data_type, T.ArrayType) and is_nested_numeric_array(data_type)):
        return "array"
    if is_numeric(data_type):
        return "scalar"
    raise TypeError(
        f"Column {name!r} (the {role}) has type {data_type.simpleString()}; expected a "
        f"number, an array of numbers{' (possibly nested)' if nested else ''}"
        f"{', packed float32 tensors (binary)' if packed else ''} or a Spark ML vector."
        + (features_type_hint(name, data_type) if role == "features column" else "")
    )


def double_array(dataset, name, role="input column"):
    """Column ``name`` as ``array<double>``: vectors are unpacked, arrays cast.

    Raises:
        TypeError: When the column is not an array of numbers or a vector.
    """
    kind = column_kind(dataset, name, role)
    if kind == "vector":
        return vector_values(name, "float64")
    if kind == "array":
        return column(name).cast(T.ArrayType(T.DoubleType()))
    raise TypeError(
        f"Column {name!r} (the {role}) holds single numbers "
        f"({dataset.schema[name].dataType.simpleString()}); expected an array of numbers "
        "or a Spark ML vector."
    )


def as_input_kind(values, kind, input_col):
    """``values`` (an ``array<double>`` computed element by element from column
    ``input_col``) as the input was: a dense Spark ML vector for a vector column, as
    Spark's own scalers and dist-keras's transformers give (``row[col].toArray()`` works),
    else an ``array<float>``, what the trainers read without a conversion. A null row stays
    null."""
    if kind == "vector":
        return F.when(column(input_col).isNotNull(), array_to_vector(values))
    return values.cast(FLOAT_ARRAY)


def argmax(array):
    """The 0-based position of the first largest element of an array column (null if empty)."""
    return (F.array_position(array, F.array_max(array)) - 1).cast(T.LongType())


def null_or(values):
    """The start of a ``when`` chain that keeps a null row null (the size check that
    follows would otherwise call it an array of the wrong length)."""
    return F.when(values.isNull(), F.lit(None))


def fail(message):
    """A column that stops the job with ``message`` when Spark evaluates it."""
    return F.raise_error(F.lit(message))

def as_output_type(values, output_type):
    """``values`` (an array column) as ``output_type`` asks: ``array<float>`` or a dense
    Spark ML vector (null stays null)."""
    if to_output_type(output_type) == "vector":
        return F.when(values.isNotNull(), array_to_vector(values))
    return values.cast(FLOAT_ARRAY)
