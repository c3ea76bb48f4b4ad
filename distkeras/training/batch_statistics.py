"""BatchNormalization statistics measured again for weights that no worker trained as they are.

An averaged model (the elastic center of AEASGD and EAMSGD, AveragingTrainer's mean) holds
weights that no replica ran with: the moving means and variances it inherits were measured
by the replicas on their own weights, and do not describe the activations of the average.
Its test accuracy can fall tens of points below any replica's. As stochastic weight
averaging does (Izmailov et al., 2018), the statistics are measured again on training rows
with the returned weights: one forward pass in training mode per batch, each batch weighing
the same in the exact mean.
"""

import logging

from distkeras.training import validation_data

logger = logging.getLogger(__name__)

# Rows of the training data read on the driver for the new statistics: 2,048 rows give
# means within a few hundredths of a standard deviation, and cost one pass over them.
SAMPLE_ROWS = 2048


def batch_normalizations(model):
    """The model's BatchNormalization layers (nested ones too) that hold moving statistics
    and are trainable: a frozen layer keeps the statistics it was given, as in `fit`."""
    import keras

    return [layer for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, keras.layers.BatchNormalization) and layer.trainable]


def recompute(model, x, batch_size=256):
    """Sets each trainable BatchNormalization layer's moving mean and variance to their
    mean over the batches of ``x``, measured with the model's current weights.

    Args:
        model: A built `keras.Model`; changed in place.
        x: Its inputs (an array, or a list or dict of arrays as `model` takes them).
        batch_size: Rows per forward pass (the statistics are per batch, as in training).

    Returns:
        The number of layers whose statistics were measured again (0: none to measure).

    Raises:
        ValueError: When ``x`` holds no rows.
    """
    import keras

    layers = batch_normalizations(model)
    if not layers:
        return 0
    first = x if not isinstance(x, (list, tuple, dict)) else \
        next(iter(x.values() if isinstance(x, dict) else x))
    rows = len(first)
    if rows == 0:
        raise ValueError("No rows to measure the BatchNormalization statistics on.")
    momenta = [layer.momentum for layer in layers]
    try:
        for count, start in enumerate(range(0, rows, batch_size)):
            # Batch k (from 0) weighs 1/(k+1) against the mean of those before it: the
            # moving value ends as the plain mean over the batches.
            for layer in layers:
                layer.momentum = count / (count + 1.0)
            batch = keras.tree.map_structure(lambda array: array[start:start + batch_size], x)
            model(batch, training=True)
    finally:
        for layer, momentum in zip(layers, momenta):
            layer.momentum = momentum
    logger.info("Measured the statistics of %d BatchNormalization layer(s) again on %d rows "
                "with the returned weights", len(layers), rows)
    return len(layers)


def sample_inputs(dataframe, model, features_col, label_col, rows=SAMPLE_ROWS):
    """Up to ``rows`` of ``dataframe``'s features, on the driver, shaped for ``model``."""
    x, _, _ = validation_data.collect(dataframe.limit(rows), model, features_col, label_col)
    return x


def measure_again(model, dataframe, features_col, label_col):
    """Measures ``model``'s BatchNormalization statistics again on ``dataframe``'s first
    rows (see `recompute`); nothing is read when it has no such layer.

    Returns:
        The number of layers measured again.
    """
    if not batch_normalizations(model):
        return 0
    return recompute(model, sample_inputs(dataframe, model, features_col, label_col))
