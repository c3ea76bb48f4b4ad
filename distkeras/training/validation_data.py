"""The validation rows of ``train(df, validation_data=...)``, held on the driver as numpy.

``validation_data`` is a DataFrame with the training columns, a fraction of ``df`` split
off at random (`split`), or numpy arrays ``(x, y)`` as for Keras's ``fit``
(`from_arrays`); `collect` reads a DataFrame's rows into arrays shaped for the model.
`distkeras.training.validator` evaluates the model on them.
"""

import logging
import numbers

import numpy as np

from distkeras.data import frame_checks, frame_columns, frame_layout
from distkeras.data.feed import (arrow_name, check_class_indices, column_to_numpy, input_names,
                                 integer_dtype, model_inputs, output_names)

logger = logging.getLogger(__name__)

SPLIT_COLUMN = "__distkeras_validation_draw"

# The validation rows are held on the driver; more than this many is refused rather than
# running the driver out of memory (250,000 Fashion-MNIST images are 784 MB as float32).
MAX_ROWS = 250_000


def split(dataframe, validation_data, seed=1234):
    """The training and validation DataFrames for ``validation_data``.

    Args:
        dataframe: The training DataFrame the user passed.
        validation_data: A DataFrame with the same columns, or a fraction in (0, 1) of
            ``dataframe``'s rows to hold out (each row drawn with a seeded random number,
            so cache ``dataframe`` for the same split every time it is read).
        seed: Seed of the draw.

    Returns:
        ``(training, validation)`` DataFrames.

    Raises:
        ValueError: For a fraction outside (0, 1) or another kind of value.
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    if isinstance(validation_data, DataFrame) or \
            (type(validation_data).__module__ or "").startswith("pyspark.sql.connect"):
        frame_checks.check_spark_dataframe(validation_data, "validation data")
        return dataframe, validation_data
    if isinstance(validation_data, list) and len(validation_data) in (2, 3):
        validation_data = tuple(validation_data)  # fit takes [x, y] as (x, y)
    if isinstance(validation_data, tuple):
        return dataframe, validation_data  # numpy arrays, as for fit: see `from_arrays`
    if isinstance(validation_data, bool) or not isinstance(validation_data, numbers.Real) \
            or not 0.0 < validation_data < 1.0:
        raise ValueError(
            "`validation_data` must be a Spark DataFrame with the training columns, a tuple "
            "(x, y) of numpy arrays as for Keras's fit, or a fraction between 0 and 1 of "
            f"the rows to hold out. Received: {_short(validation_data)}")
    drawn = dataframe.withColumn(SPLIT_COLUMN, F.rand(seed))
    training = drawn.where(F.col(SPLIT_COLUMN) >= validation_data).drop(SPLIT_COLUMN)
    validation = drawn.where(F.col(SPLIT_COLUMN) < validation_data).drop(SPLIT_COLUMN)
    return training, validation


def _short(value):
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _fit_arrays(arrays, shapes, what):
    """Each numeric array with rows of its shape (flat rows are reshaped, as the
    DataFrame's are; a ``()`` shape takes the array as it is)."""
    fitted = []
    for index, (array, shape) in enumerate(zip(arrays, shapes)):
        array = np.asarray(array)
        name = what if len(arrays) == 1 else f"{what}[{index}]"
        if array.dtype == object or not (np.issubdtype(array.dtype, np.number)
                                         or array.dtype == bool):
            raise TypeError(f"validation_data's {name} must be a numeric numpy array. "
                            f"Received dtype {array.dtype}.")
        if array.ndim == 0:
            raise ValueError(f"validation_data's {name} must have one row per sample. "
                             f"Received a scalar.")
        size = int(np.prod(shape)) if shape else 1
        if shape == () or array.shape[1:] == tuple(shape):
            fitted.append(array)
        elif int(np.prod(array.shape[1:])) == size:
            fitted.append(array.reshape((len(array), *shape)))
        else:
            raise ValueError(
                f"validation_data's {name} has rows of shape {array.shape[1:]}; the model "
                f"expects {tuple(shape)}.")
    return fitted


def from_arrays(data, model):
    """Keras-style validation arrays ``(x, y)`` or ``(x, y, sample_weight)`` checked
    against ``model``, as ``(x, y, sample_weight)`` (None when not given).

    ``x`` (and ``y``) are a numpy array, or a list of them for a model with several inputs
    (outputs). Flat rows are reshaped to the model's shapes; labels may be class indices
    for an output of several classes (one per row, or one per step of an output of shape
    ``(steps, classes)``). ``sample_weight`` holds one number per row. ``(x,)`` or
    ``(x, None)`` hold no labels (a model trained with ``label_col=None``): ``y`` is then
    None, and so are the weights, as ``fit`` drops them without ``y``.

    Raises:
        ValueError: Naming what does not fit the model.
    """
    if len(data) not in (1, 2, 3):
        raise ValueError(
            "`validation_data` as arrays must be a tuple (x, y) or (x, y, sample_weight), "
            "or (x,) for a model trained without labels, as for Keras's fit. Received a "
            f"tuple of {len(data)}.")
    x, y = (data[0], None) if len(data) == 1 else data[:2]
    xs = _by_name(x, [tensor.name for tensor in model.inputs], "x") \
        if isinstance(x, dict) else list(x) if isinstance(x, (list, tuple)) else [x]
    if len(xs) != len(model.inputs):
        raise ValueError(f"The model has {len(model.inputs)} inputs; validation_data holds "
                         f"{len(xs)} input arrays.")
    input_shapes = [tuple(int(dim) for dim in tensor.shape[1:]) for tensor in model.inputs]
    xs = [array.astype(integer_dtype(tensor) or np.float32, copy=False)
          for array, tensor in zip(_fit_arrays(xs, input_shapes, "x"), model.inputs)]
    labels = []
    if y is not None:
        ys = _by_name(y, output_names(model), "y") \
            if isinstance(y, dict) else list(y) if isinstance(y, (list, tuple)) else [y]
        output_shapes = [tuple(int(dim) for dim in tensor.shape[1:])
                         for tensor in model.outputs]
        if len(ys) != len(output_shapes):
            raise ValueError(f"The model has {len(output_shapes)} outputs; validation_data "
                             f"holds {len(ys)} label arrays.")
        for index, (array, shape) in enumerate(zip(ys, output_shapes)):
            array = np.asarray(array)
            name = "y" if len(ys) == 1 else f"y[{index}]"
            if array.ndim >= 1 and shape and shape[-1] > 1 and \
                    array.shape[1:] == shape[:-1]:  # class indices
                (array,) = _fit_arrays([array], [shape[:-1]], name)
                check_class_indices(array, shape[-1], f"validation_data's {name}")
                labels.append(array.astype(np.int32))
            else:
                (array,) = _fit_arrays([array], [shape], name)
                labels.append(array.astype(np.float32, copy=False))
    rows = {len(array) for array in xs + labels}
    if len(rows) != 1:
        raise ValueError(f"validation_data's arrays have different numbers of rows: "
                         f"{sorted(rows)}.")
    if rows == {0}:
        raise ValueError("The validation data has no rows.")
    weights = None if y is None or len(data) == 2 or data[2] is None else \
        _validation_weights(data[2], rows.pop())
    x = model_inputs(xs, input_names(model), len(xs) == 1)
    if y is None:
        return x, None, None
    return x, (labels[0] if len(labels) == 1 else labels), weights


def _by_name(arrays, names, what):
    """The arrays of a dict keyed by the model's input (output) names, in their order, as
    Keras's ``fit`` reads ``x`` (``y``) given as a dict."""
    missing = [name for name in names if name not in arrays]
    if missing or len(arrays) != len(names):
        raise ValueError(
            f"validation_data's {what} is a dict with keys {sorted(arrays)}; the model's "
            f"{'inputs' if what == 'x' else 'outputs'} are named {names}.")
    return [arrays[name] for name in names]


def _validation_weights(sample_weight, rows):
    """``sample_weight`` of ``validation_data`` as float32, one finite number >= 0 per row."""
    weights = np.asarray(sample_weight)
    if weights.dtype == object or not (np.issubdtype(weights.dtype, np.number)
                                       or weights.dtype == bool):
        raise TypeError("validation_data's sample_weight must be a numeric numpy array. "
                        f"Received dtype {weights.dtype}.")
    if weights.shape not in ((rows,), (rows, 1)):
        raise ValueError(f"validation_data's sample_weight must hold one number per row "
                         f"({rows} rows). Received shape {weights.shape}.")
    weights = weights.reshape(rows).astype(np.float32)
    if not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise ValueError("validation_data's sample_weight must be finite numbers >= 0.")
    return weights


def collect(validation, model, features_col, label_col, sample_weight_col=None):
    """The validation rows as numpy arrays ``(x, y, sample_weight)`` shaped for ``model``.

    ``sample_weight`` is the rows' ``sample_weight_col`` where the validation rows have
    that column (as Keras's ``validation_split`` keeps the training weights), else None.

    Raises:
        ValueError: When the rows do not fit the model (see `frame_checks.validate`) or
            there are none.
    """
    try:
        label_shapes = frame_checks.validate(validation, model, features_col, label_col)
    except (TypeError, ValueError) as error:
        raise type(error)(f"In the validation data: {error}") from error
    features = frame_columns.as_column_list(features_col)
    labels = frame_columns.as_column_list(label_col)
    if sample_weight_col is not None and sample_weight_col not in validation.columns:
        logger.info("The validation data has no %r column: its rows are not weighted.",
                    sample_weight_col)
        sample_weight_col = None
    # Dense vectors: the rows are held on the driver whole anyway, and `toArrow` fails
    # on a null vector struct (with an Arrow error that names no column).
    table = frame_layout.training_frame(validation, features_col, label_col,
                                        sample_weight_col, sparse=False
                                        ).limit(MAX_ROWS + 1).toArrow()
    if table.num_rows == 0:
        raise ValueError("The validation data has no rows.")
    if table.num_rows > MAX_ROWS:
        raise ValueError(
            f"The validation data has more than {MAX_ROWS:,} rows; they are held on the "
            "driver. Pass a sample of them (`validation_df.sample(fraction=...)`) or a "
            "smaller fraction.")
    input_shapes = [tuple(int(dim) for dim in tensor.shape[1:]) for tensor in model.inputs]
    x = [_column(table, name, shape, integer_dtype(tensor))
         for name, shape, tensor in zip(features, input_shapes, model.inputs)]
    y = [_column(table, name, given) for name, given in zip(labels, label_shapes)]
    single_input = not isinstance(features_col, (list, tuple))
    single_output = not isinstance(label_col, (list, tuple))
    if label_col is None:  # no targets, as fit(x)'s validation_data=(x_val,)
        y, single_output = [None], True
    weights = None
    if sample_weight_col is not None:
        weights = _validation_weights(
            table.column(arrow_name(sample_weight_col)).to_numpy(zero_copy_only=False),
            table.num_rows)
    logger.info("Validating on %d rows held on the driver", table.num_rows)
    return model_inputs(x, input_names(model), single_input), \
        (y[0] if single_output else y), weights


def _column(table, name, shape, dtype=None):
    """Column ``name`` of the collected validation rows as `column_to_numpy` reads it; its
    errors (nulls, NaN, rows of the wrong length) say that the validation data holds them,
    not a training partition: a NaN would make every ``val_loss`` NaN, and an
    ``EarlyStopping`` or ``ModelCheckpoint`` on it see no epoch better than another."""
    try:
        return column_to_numpy(table.column(arrow_name(name)).combine_chunks(), shape, name,
                               dtype, finite=True)
    except ValueError as error:
        message = str(error).replace(" in this partition", "").replace(
            " (in one Arrow batch of this partition)", "")
        raise ValueError(f"In the validation data: {message}") from error
