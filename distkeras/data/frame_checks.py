"""Checks a training (or prediction) DataFrame against the model on the driver, before
any task starts: a Spark DataFrame (classic or Spark Connect), the model's known and fixed shapes, one
column per input (and output), in the model's order, and a first row that fits."""

import numpy as np

from distkeras.data.feed import input_names, integer_dtype, output_names, padding_hint
from distkeras.data.frame_columns import as_column_list, column, training_column
from distkeras.data.tensors import packed_size
from distkeras.session import is_connect


def _flat_size(shape):
    return int(np.prod(shape)) if shape else 1


def _sample_size(value):
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        return packed_size(value)
    if hasattr(value, "toArray"):
        return value.toArray().size
    return np.asarray(value, dtype=np.float64).size if isinstance(value, (list, tuple)) else 0


def _packed_hint(value, shape):
    """For a binary row of the wrong size, how distkeras reads it: raw image bytes (one
    byte per value) look like a quarter of the values."""
    if not isinstance(value, (bytes, bytearray)):
        return ""
    raw = (" They hold one byte per value: raw pixels (uint8) or an encoded image? Decode "
           "them into an array of numbers first.") if len(value) == _flat_size(shape) else ""
    return (f" A binary column is read as packed float32 values, 4 bytes each (as "
            f"PackedTensorTransformer writes them): its rows have {len(value)} bytes, the "
            f"model needs {4 * _flat_size(shape)}.{raw}")


def _model_shapes(tensors):
    return [tuple(int(dim) for dim in tensor.shape[1:]) for tensor in tensors]


def check_known_inputs(model):
    """Raises a clear error for a model whose inputs and outputs Keras does not know.

    A subclassed `keras.Model` has no ``inputs`` until it is wrapped in a functional model,
    and distkeras reads the shapes of its rows from them.
    """
    if getattr(model, "inputs", None) and getattr(model, "outputs", None):
        _check_fixed_shapes(model)
        return
    steps = _own_training_logic(model)
    if steps:
        # Wrapped, the outer functional model would train with Keras's own step.
        raise ValueError(
            f"distkeras needs a model with known inputs and outputs (a Sequential or "
            f"functional model); {type(model).__name__} has none, as a subclassed "
            f"keras.Model does not. Wrapping it in keras.Model(inputs, your_model(inputs)) "
            f"would train without its own {' and '.join(steps)}: build it from functional "
            f"layers instead, `outputs = keras.layers.Dense(...)(inputs); model = "
            f"{type(model).__name__}(inputs, outputs)` (the class keeps its "
            f"{' and '.join(steps)}), registered with "
            "@keras.saving.register_keras_serializable() so that the executors rebuild it.")
    raise ValueError(
        f"distkeras needs a model with known inputs and outputs (a Sequential or functional "
        f"model); {type(model).__name__} has none, as a subclassed keras.Model does not. Wrap "
        "it: `inputs = keras.Input(shape=(...)); model = keras.Model(inputs, "
        "your_model(inputs))`, and give your class a `get_config()` for its constructor "
        "arguments so that the executors can rebuild it.")


def _own_training_logic(model):
    """The methods of Keras's training loop that ``model``'s class defines itself
    (``train_step``, ``compute_loss``, ...), which a model wrapping it would not run."""
    import keras

    return [name for name in ("train_step", "compute_loss", "test_step")
            if getattr(type(model), name, None) is not getattr(keras.Model, name, None)]


def _check_fixed_shapes(model):
    """Raises a clear error for an input or output with a dimension Keras leaves open
    (``keras.Input((None,))``): distkeras reads the shape of each row from the model."""
    for kind, tensors in (("input", model.inputs), ("output", model.outputs)):
        for tensor in tensors:
            shape = tuple(tensor.shape[1:])
            if any(dim is None for dim in shape):
                raise ValueError(
                    f"The model's {kind} {getattr(tensor, 'name', '')!r} has shape {shape}, "
                    "with a dimension of unknown size (None); distkeras reads the shape of "
                    "each row from the model, so every dimension but the batch must be "
                    "fixed. Give keras.Input the length of your (padded) rows, for example "
                    "keras.Input((10,), dtype='int32') for sequences padded to 10 tokens.")


def check_input_count(model, features_cols):
    """Raises a clear error when ``features_cols`` does not name one column per model input.

    Tabular data often has its features in several numeric columns: a list of them is read
    as one column per input, so a one-input model is told how to put them in one column.
    """
    if len(features_cols) == len(model.inputs):
        return
    hint = ""
    if len(model.inputs) == 1:
        hint = (" To feed several numeric columns to one input, put them in one column "
                "first: pyspark.ml.feature.VectorAssembler(inputCols=[...], "
                "outputCol=\"features\") or F.array(*columns).alias(\"features\").")
    raise ValueError(
        f"The model has {len(model.inputs)} inputs but features_col names "
        f"{len(features_cols)} columns: {features_cols}; a list of columns feeds one "
        f"input each.{hint}")


def _conversion_hint(value, module):
    """How to turn what a user gave instead of a DataFrame into one, to end an error."""
    if module.startswith(("pandas", "numpy", "pyarrow")):
        return " Convert it with spark.createDataFrame(...)."
    if module.startswith("pyspark") and type(value).__name__ == "RDD":
        return (" Convert it with rdd.toDF([...column names]) or "
                "spark.createDataFrame(rdd, schema).")
    if isinstance(value, (tuple, list)):
        # fit's (x, y): the arrays have to become columns first.
        return (" train() takes one DataFrame with a features and a label column, not "
                "fit's (x, y): write the arrays with distkeras.datasets.save_numpy_parquet("
                "spark, x, y, path) and read them back with spark.read.parquet(path).")
    return ""


def check_spark_dataframe(dataframe, role="training data"):
    """Raises a clear error for anything but a Spark DataFrame (classic or Spark Connect)
    of a session that still runs."""
    from pyspark.sql import DataFrame

    module = type(dataframe).__module__ or ""
    if not isinstance(dataframe, DataFrame):
        hint = _conversion_hint(dataframe, module)
        raise TypeError(f"The {role} must be a Spark DataFrame. Received: "
                        f"{type(dataframe).__module__}.{type(dataframe).__name__}.{hint}")
    _check_session_running(dataframe, role)


def _check_session_running(dataframe, role):
    """Raises a clear error for a DataFrame whose SparkSession was stopped.

    Such a DataFrame still answers ``columns`` and ``schema`` (cached on the Python side),
    but the first column expression built for it failed with a bare ``AssertionError``
    from pyspark (no active SparkContext), and nothing said which session was gone.
    """
    spark = dataframe.sparkSession
    if is_connect(spark):
        stopped = bool(getattr(spark, "is_stopped", False))
    else:
        stopped = getattr(spark.sparkContext, "_jsc", None) is None
    if stopped:
        raise ValueError(
            f"The {role} belongs to a SparkSession that was stopped (spark.stop()); a "
            "DataFrame cannot be read once its session is gone. Create the session again "
            "(SparkSession.builder...getOrCreate(), or "
            "distkeras.session.local_spark_session()) and read or build the DataFrame in "
            "it, then call this again.")


def columns_by_name(value, model, what, parameter):
    """``value`` as given, or, for a dict of columns keyed by the model's input (output)
    names, as Keras's ``fit`` takes ``x`` (``y``), the list of its columns in the order of
    the model's inputs (outputs).

    Args:
        value: A column name, a list of names, or a dict ``{input or output name: column}``.
        model: The `keras.Model`.
        what: ``"inputs"`` or ``"outputs"``.
        parameter: The parameter that named the columns.

    Raises:
        ValueError: When the dict's keys are not exactly the model's names.
    """
    if not isinstance(value, dict):
        return value
    names = model_names(model, what)
    if sorted(map(str, value)) != sorted(names):
        missing = [name for name in names if name not in value]
        unknown = [key for key in value if key not in names]
        raise ValueError(
            f"{parameter} is a dict, so its keys must be the model's {what}' names, "
            f"{names}. Missing: {missing}; not the model's: {unknown}.")
    return [value[name] for name in names]


def model_names(model, what):
    """The names of a model's inputs or outputs (``what``), in the order of its tensors."""
    if what == "inputs":
        return input_names(model) or [tensor.name for tensor in model.inputs]
    return output_names(model)


def check_column_order(columns, names, what, parameter):
    """Refuses columns named exactly as the model's inputs (outputs) but listed in another
    order: they pair with ``model.inputs`` (``model.outputs``) by position, so each would
    silently feed another input (train another output) of the same shape.

    Args:
        columns: The columns given, in order.
        names: The model's input (output) names, in the order of its tensors.
        what: ``"inputs"`` or ``"outputs"``.
        parameter: The parameter that named the columns.

    Raises:
        ValueError: Naming the order to pass.
    """
    if len(columns) > 1 and sorted(columns) == sorted(names) and list(columns) != list(names):
        raise ValueError(
            f"{parameter}={list(columns)} names the model's {what} in another order than "
            f"the model's, {list(names)}: columns pair with the {what} by position (for a "
            f"model built on a dict, Keras orders them by name). Pass {parameter}="
            f"{list(names)}, or a dict keyed by the {what}' names.")


def validate(dataframe, model, features_col, label_col):
    """Checks columns, types and sizes against the model before any training starts.

    Args:
        dataframe: The training DataFrame.
        model: The `keras.Model` to train.
        features_col: Input column(s).
        label_col: Target column(s), or None for none (`fit(x)`).

    Returns:
        The label shapes the data carries (none without ``label_col``): the model's, or
        its shape without the last axis for class indices (``()`` for scalar labels or
        arrays of one; ``(steps,)`` for one class index per step of an output of shape
        ``(steps, classes)``, as Keras's sparse losses read them).

    Raises:
        ValueError: Naming the column and what the model expects.
        TypeError: For a column of a type that cannot be trained on.
    """
    check_spark_dataframe(dataframe)
    check_known_inputs(model)
    features_cols = as_column_list(features_col)
    label_cols = as_column_list(label_col)
    check_input_count(model, features_cols)
    if label_col is not None and len(label_cols) != len(model.outputs):
        raise ValueError(
            f"The model has {len(model.outputs)} outputs but label_col names "
            f"{len(label_cols)} columns: {label_cols}."
        )
    check_column_order(features_cols, [tensor.name for tensor in model.inputs], "inputs",
                       "features_col")
    check_column_order(label_cols, model_names(model, "outputs"), "outputs", "label_col")
    for name in features_cols:
        training_column(dataframe, name, feature=True)
    for name in label_cols:
        training_column(dataframe, name)
    rows = dataframe.select(*map(column, features_cols + label_cols)).limit(1).collect()
    if not rows:
        raise ValueError("The DataFrame is empty: there is nothing to train on.")
    row = rows[0]
    check_first_row(row, model, features_cols, label_cols)
    label_shapes = []
    for name, shape in zip(label_cols, _model_shapes(model.outputs)):
        size = _sample_size(row[name])
        if size == 0 and not isinstance(row[name], (list, tuple)):
            label_shapes.append(())  # scalar labels, e.g. for a sparse categorical loss
            continue
        # A class index per step, for a sparse loss; for an output of one axis, a class
        # index held in an array of one (labels shaped (rows, 1), which `fit` takes too).
        if shape and shape[-1] > 1 and size == _flat_size(shape[:-1]):
            label_shapes.append(shape[:-1])
            continue
        if size != _flat_size(shape):
            indices = f" ({_flat_size(shape[:-1])} class indices per row)" \
                if len(shape) > 1 else ""
            # pyspark.ml.feature.OneHotEncoder drops the last class unless told not to.
            dropped = (" pyspark.ml.feature.OneHotEncoder leaves out the last class unless "
                       "given dropLast=False.") \
                if hasattr(row[name], "toArray") and size == _flat_size(shape) - 1 else ""
            raise ValueError(
                f"Label column {name!r} holds {size} values per row but the model's output "
                f"has shape {shape} ({_flat_size(shape)} values). One-hot encode the labels "
                f"to the output size, or use class indices{indices} with a sparse loss."
                f"{dropped}"
            )
        label_shapes.append(shape)
    return label_shapes


def check_first_row(row, model, features_cols, label_cols=()):
    """Refuses, on the driver, a first row that every task would fail on: a null in one of
    the columns, or features whose number of values does not fit the model's input.

    Args:
        row: The DataFrame's first row (a `pyspark.sql.Row` holding the columns).
        model: The `keras.Model`.
        features_cols: Its input columns, in the model's order.
        label_cols: Its target columns (only checked for nulls here).

    Raises:
        ValueError: Naming the column and what the model expects.
    """
    for name in list(features_cols) + list(label_cols):
        if row[name] is None:
            raise ValueError(
                f"Column {name!r} holds null values (its first row is null); drop or fill "
                f"them first, for example `df.dropna(subset=[{name!r}])`.")
    for name, shape, tensor in zip(features_cols, _model_shapes(model.inputs), model.inputs):
        size = _sample_size(row[name])
        if size == 0 and not isinstance(row[name], (list, tuple)):
            size = 1  # a number per row: an input of one value (as ModelPredictor reads it)
        if size != _flat_size(shape):
            tokens = isinstance(row[name], (list, tuple)) and len(shape) == 1 \
                and integer_dtype(tensor) is not None
            raise ValueError(
                f"Column {name!r} holds {size} values per row but the model's input expects "
                f"shape {shape} ({_flat_size(shape)} values). "
                + (padding_hint(name, shape[0]) if tokens
                   else "Reshape the data or the model." + _packed_hint(row[name], shape)))
