"""Per-row sample weights and per-class weights, as Keras's ``fit`` takes them.

``train(df, sample_weight_col="w")`` weighs each row's loss by its value in column ``w``;
``train(df, class_weight={0: 1.0, 1: 5.0})`` by its class (classes not named weigh 1).
Both together multiply, as in Keras. Checked on the driver (`validate`); the weights of
each Arrow record batch are computed on the executor (`row_weights`).
"""

import numbers

import numpy as np
from pyspark.sql import types as T

from distkeras.errors import InvalidDataError


def validate(dataframe, sample_weight_col, class_weight, training_cols, label_shapes,
             output_shapes):
    """Checks the weight settings before any Spark job; returns the class-weight table.

    Args:
        dataframe: The training DataFrame.
        sample_weight_col: A numeric column of per-row weights, or None.
        class_weight: A dict from class index to weight, or None.
        training_cols: The feature and label columns (the weight column must be another).
        label_shapes: Per output, the shape of a label row (``()`` for class indices).
        output_shapes: Per output, the model's output shape.

    Returns:
        A float32 array whose entry ``i`` is class ``i``'s weight (1 where not given), or
        None without ``class_weight``.

    Raises:
        ValueError: For a missing column, bad keys or values, several outputs, or an
            output of several axes.
        TypeError: For a weight column that is not one number per row.
    """
    if sample_weight_col is not None:
        if not isinstance(sample_weight_col, str) or \
                sample_weight_col not in dataframe.columns:
            raise ValueError(
                f"`sample_weight_col` {sample_weight_col!r} is not a column of the DataFrame. "
                f"Available columns: {dataframe.columns}.")
        if sample_weight_col in training_cols:
            raise ValueError(
                f"`sample_weight_col` {sample_weight_col!r} is also a feature or label column.")
        data_type = dataframe.schema[sample_weight_col].dataType
        if not isinstance(data_type, T.NumericType):
            raise TypeError(
                f"`sample_weight_col` {sample_weight_col!r} has type "
                f"{data_type.simpleString()}; it must hold one number per row.")
    if class_weight is None:
        return None
    if not isinstance(class_weight, dict) or not class_weight:
        raise ValueError("`class_weight` must be a non-empty dict from class index to weight, "
                         f"for example {{0: 1.0, 1: 5.0}}. Received: {class_weight!r}")
    if len(output_shapes) != 1:
        raise ValueError("`class_weight` works with single-output models only (as in Keras); "
                         "for several outputs give per-row weights in `sample_weight_col`.")
    if len(output_shapes[0]) > 1:
        raise ValueError(
            f"`class_weight` needs an output of one axis (classes); this model's has shape "
            f"{tuple(output_shapes[0])}, whose rows hold several labels. Weigh the rows "
            "with `sample_weight_col` instead.")
    classes = max(_flat_size(output_shapes[0]), 2)
    table = np.ones(classes, dtype=np.float32)
    for key, weight in class_weight.items():
        if isinstance(key, bool) or not isinstance(key, numbers.Integral) or \
                not 0 <= key < classes:
            hint = f" (an int: {{{int(key)}: ...}}, not a string)" \
                if isinstance(key, str) and key.isascii() and key.isdigit() else ""
            raise ValueError(
                f"`class_weight` key {key!r} is not a class index of this model's output "
                f"(an integer from 0 to {classes - 1}){hint}.")
        if isinstance(weight, bool) or not isinstance(weight, numbers.Real) or \
                not np.isfinite(weight) or weight < 0:
            raise ValueError(f"`class_weight` of class {key} must be a number >= 0. "
                             f"Received: {weight!r}")
        table[int(key)] = weight
    return table


def _flat_size(shape):
    return int(np.prod(shape)) if shape else 1


def class_indices(labels):
    """The class index of each label row: the index itself, the one-hot argmax, or the
    rounded value of a single binary output."""
    labels = np.asarray(labels)
    if labels.ndim > 1 and labels.shape[-1] > 1:
        return labels.reshape(len(labels), -1).argmax(axis=1)
    return np.rint(labels.reshape(len(labels))).astype(np.int64)


def per_row(weights, output_shapes):
    """Row weights shaped to weigh every position of a per-row loss of several values.

    Keras's losses reduce the output's last axis only: an output of shape
    ``(steps, classes)`` (a tagger) has one loss per step, which weights of shape
    ``(rows,)`` do not broadcast against (``fit`` fails) but ``(rows, 1)`` do. With outputs
    of different ranks no one shape fits all: the weights are returned as they are.

    Args:
        weights: One weight per row, or None.
        output_shapes: The model's output shapes, without the batch axis.
    """
    if weights is None:
        return None
    extra = {max(len(shape) - 1, 0) for shape in output_shapes}
    axes = extra.pop() if len(extra) == 1 else 0
    if not axes:
        return weights
    return np.asarray(weights).reshape((len(weights),) + (1,) * axes)


def row_weights(rows, weights=None, labels=None, class_table=None, name=None):
    """The weight of each row: the sample weight times its class's weight.

    Args:
        rows: Number of rows.
        weights: The rows' sample weights, or None.
        labels: The rows' labels (needed with ``class_table``).
        class_table: What `validate` returned, or None.
        name: The column that holds ``weights``, for the error.

    Returns:
        A float32 array of ``rows`` weights.

    Raises:
        ValueError: For a negative or non-finite sample weight.
    """
    result = np.ones(rows, dtype=np.float32) if weights is None \
        else np.asarray(weights, dtype=np.float32).reshape(rows)
    if weights is not None and not (np.isfinite(result).all() and (result >= 0).all()):
        bad = ~np.isfinite(result) | (result < 0)
        row = int(np.flatnonzero(bad)[0])
        column = "Sample weights" if name is None else f"Sample weights (column {name!r})"
        raise InvalidDataError(
            f"{column} must be finite numbers >= 0; this batch of {rows} rows holds "
            f"{int(bad.sum())} that are not (the first, {result[row].item()!r}, in row "
            f"{row}). Drop or fix those rows first.")
    if class_table is not None:
        indices = class_indices(labels)
        known = (indices >= 0) & (indices < len(class_table))
        factors = np.ones(rows, dtype=np.float32)
        factors[known] = class_table[indices[known]]
        result = result * factors
    return result


def fit_data(x, y, sample_weight=None):
    """One batch as ``model.fit`` hands it to ``train_step``: ``(x, y)``, or
    ``(x, y, sample_weight)`` only when there are weights.

    A ``train_step`` of the user's own, as Keras's guide writes it, unpacks ``x, y = data``;
    given ``(x, y, None)`` (what Keras's ``train_on_batch`` passes) it failed with "too
    many values to unpack". Keras's own step reads either form. Without labels
    (``label_col=None``) it is ``x`` alone, or ``(x,)`` for a list of inputs, as `fit(x)`
    packs it (`keras.utils.pack_x_y_sample_weight`): a VAE's ``train_step`` reads
    ``x = data``.
    """
    if y is None and sample_weight is None:
        return (x,) if isinstance(x, (list, tuple)) else x
    return (x, y) if sample_weight is None else (x, y, sample_weight)
