"""Checks of what a network worker exchanges with the parameter server.

The update it commits (`checked_update`) and the learning rate a server's reply carries
(`learning_rate_field`).
"""

import math

import numpy as np

from distkeras.errors import InvalidUpdateError
from distkeras.transport import networking
from distkeras.transport.networking import weights_array


def learning_rate_field(data, key):
    """A server reply's learning rate field as a float, or None when it has none.

    Raises:
        ProtocolError: When the field is not a finite number.
    """
    rate = data.get(key)
    if rate is None:
        return None
    if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate):
        raise networking.ProtocolError(f"The server's {key} is not a finite number.")
    return float(rate)


def checked_update(update, weight_spec, where):
    """Checks a commit's update against the model's weights before it is sent.

    The parameter server closes the connection of a worker whose update does not match the
    model, and the worker then sees only a closed connection: checked here, the error says
    what was wrong. Floating-point layers of another precision (float64 from numpy
    arithmetic) are cast to the weight's dtype, as Keras's ``set_weights`` casts them.

    Args:
        update: The update: a list (or object array) of per-layer arrays.
        weight_spec: Per weight, ``(shape, dtype)``; None skips the check.
        where: Who sent it, for the error (``"MyWorker.commit()"``).

    Returns:
        The update as an object array of arrays of the weights' dtypes.

    Raises:
        InvalidUpdateError: If the update is not one array per weight, shaped like it.
    """
    if weight_spec is None:
        return update
    if isinstance(update, np.ndarray) and update.dtype != object or \
            not isinstance(update, (list, tuple, np.ndarray)):
        raise InvalidUpdateError(
            f"{where} takes one array per weight of the model ({len(weight_spec)}, as "
            f"self.model.get_weights() returns them). Received: {_describe(update)}.")
    if len(update) != len(weight_spec):
        raise InvalidUpdateError(
            f"{where} takes one array per weight of the model: it has {len(weight_spec)}, "
            f"the update holds {len(update)}.")
    layers = []
    for index, (layer, (shape, dtype)) in enumerate(zip(update, weight_spec)):
        layer = np.asarray(layer)
        if layer.shape != shape:
            raise InvalidUpdateError(
                f"{where}: the update's array {index} is {_describe(layer)}; the model's "
                f"weight {index} is {dtype}{list(shape)}. Compute the update from "
                "self.model.get_weights() and self.center_variable, which are shaped "
                "like the model.")
        if layer.dtype != dtype:
            if not (_floating(layer.dtype) and _floating(dtype)):
                raise InvalidUpdateError(
                    f"{where}: the update's array {index} is {_describe(layer)}; the "
                    f"model's weight {index} is {dtype}{list(shape)}.")
            layer = layer.astype(dtype)
        layers.append(layer)
    return weights_array(layers)


def _floating(dtype):
    """Whether ``dtype`` holds floating-point numbers, bfloat16 (which numpy knows only
    as ml_dtypes' type, not a subtype of ``np.floating``) included."""
    return np.issubdtype(dtype, np.floating) or np.dtype(dtype).name == "bfloat16"


def _describe(value):
    """``float64[784, 16]`` for an array, the type's name otherwise."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype}{list(value.shape)}"
    return type(value).__name__
