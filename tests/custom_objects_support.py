"""Custom Keras objects for tests/keras_io/test_custom_objects.py.

The executors' Python workers cannot import this module: its objects reach them only
because distkeras finds them and sends them with the task. Imported by the tests after
the SparkSession starts (it imports Keras, hence JAX).
"""

import keras


class ScaledDense(keras.layers.Layer):
    """A custom layer with a constructor argument (unregistered)."""

    def __init__(self, units, scale=1.0, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.scale = scale

    def build(self, input_shape):
        self.kernel = self.add_weight(shape=(input_shape[-1], self.units),
                                      initializer="glorot_uniform")

    def call(self, inputs):
        return self.scale * keras.ops.matmul(inputs, self.kernel)

    def get_config(self):
        return {**super().get_config(), "units": self.units, "scale": self.scale}


@keras.saving.register_keras_serializable(package="distkeras_tests")
def leaky(x):
    """A registered activation."""
    return keras.ops.leaky_relu(x, negative_slope=0.05)


def smoothed_crossentropy(y_true, y_pred):
    """An unregistered loss function."""
    return keras.losses.categorical_crossentropy(y_true, y_pred, label_smoothing=0.05)


def top_class_rate(y_true, y_pred):
    """An unregistered metric function."""
    return keras.ops.mean(keras.ops.cast(
        keras.ops.argmax(y_true, axis=-1) == keras.ops.argmax(y_pred, axis=-1), "float32"))


class Residual(keras.Model):
    """A subclassed model."""

    def __init__(self, units=16, **kwargs):
        super().__init__(**kwargs)
        self.units = units
        self.hidden = keras.layers.Dense(units, activation="relu")

    def call(self, inputs):
        return self.hidden(inputs)

    def get_config(self):
        return {"units": self.units}


def custom_mlp():
    """A 784-64-10 MLP made of the objects above."""
    keras.utils.set_random_seed(3)
    return keras.Sequential([
        keras.Input((784,)),
        ScaledDense(64, scale=0.5),
        keras.layers.Activation(leaky),
        keras.layers.Dense(10, activation="softmax"),
    ])


class Parity(keras.layers.Layer):
    """1.0 for an odd integer input, else 0.0 (unregistered, no weights): right for ids
    above 2**24 only if they arrive as integers, not rounded through float32."""

    def call(self, inputs):
        return keras.ops.cast(inputs % 2, "float32")
