"""The tiny Dense(3 -> 2) model that the parameter-server tests compute golden values on."""

import distkeras  # noqa: F401  (selects the JAX backend before Keras is imported)

import keras
import numpy as np

KERNEL = np.array([[0.5, -1.0], [0.25, 2.0], [-0.75, 0.0]], dtype=np.float32)
BIAS = np.array([0.125, -0.5], dtype=np.float32)


def make_model(kernel=KERNEL, bias=BIAS):
    """A Dense(3 -> 2) model holding ``kernel`` and ``bias``."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.set_weights([kernel, bias])
    return model
