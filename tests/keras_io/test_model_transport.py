"""Models to and from `.keras` bytes (`distkeras.utils`), without importing TensorFlow."""

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import build_mlp

# In a fresh interpreter: the test session may have imported TensorFlow already.
_SCRIPT = """
import json, sys
import distkeras
import keras
import numpy as np
from distkeras.executor.sequential import EnsembleWorker
from distkeras.keras_io.archives import deserialize_model, serialize_model
from distkeras.keras_io.compile_config import serialize_keras_object

model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
model.compile(keras.optimizers.Adam(0.01), "categorical_crossentropy")
from distkeras.keras_io import custom_objects
custom_objects.find(model, ("adam", "categorical_crossentropy", ["accuracy"]))  # train()'s first check
rebuilt = deserialize_model(serialize_model(model))
serialize_keras_object([keras.optimizers.SGD(0.1), keras.losses.Huber()])
worker = EnsembleWorker(model, seed=3)
worker.build_model()
model.save(sys.argv[1])
keras.saving.load_model(sys.argv[1])
after_distkeras = "tensorflow" in sys.modules
import tensorflow as tf
shape = keras.saving.serialize_keras_object(tf.TensorShape([2, 3]))
print(json.dumps({"imported": after_distkeras, "shape": shape,
                  "same": all(np.array_equal(a, b) for a, b in
                              zip(model.get_weights(), rebuilt.get_weights()))}))
"""


def test_moving_models_does_not_import_an_installed_tensorflow(tmp_path):
    if importlib.util.find_spec("tensorflow") is None:
        pytest.fail("tensorflow is not installed: run `bash scripts/setup.sh --backends`.")
    run = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path / "m.keras")],
                         capture_output=True, text=True, timeout=300,
                         env={"KERAS_BACKEND": "jax", "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    # Keras's serializer alone would import it (2 s, 600 MB in every executor process).
    assert result["imported"] is False
    # Once imported, TensorFlow's own types still serialize as Keras does it.
    assert result["shape"] == [2, 3] and result["same"] is True


def test_a_model_round_trips_with_its_weights():
    from distkeras.utils import deserialize_model, serialize_model

    model = build_mlp(16)
    rebuilt = deserialize_model(serialize_model(model))
    assert [type(layer) for layer in rebuilt.layers] == [type(layer) for layer in model.layers]
    for got, want in zip(rebuilt.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(got, want)


def test_losses_and_metrics_keep_the_arguments_their_configs_leave_out():
    """Keras's Huber loss and CosineSimilarity metric leave ``delta`` / ``axis`` out of
    their configs: rebuilt from them on the executors, they trained and reported with
    Keras's defaults instead, silently."""
    import keras

    from distkeras.keras_io.compile_config import serialize_keras_object

    rebuilt = keras.saving.deserialize_keras_object(
        serialize_keras_object(keras.losses.Huber(delta=4.0)))
    y, p = np.zeros((1, 1), "float32"), np.full((1, 1), 3.0, "float32")
    assert float(rebuilt(y, p)) == pytest.approx(4.5)  # 0.5 * 3**2 with delta 4 (2.5 with 1)
    y, p = np.random.default_rng(1).normal(size=(2, 3, 4))
    results = {}
    for name, metric in (("rebuilt", keras.saving.deserialize_keras_object(
            serialize_keras_object(keras.metrics.CosineSimilarity(axis=0)))),
                         ("axis 0", keras.metrics.CosineSimilarity(axis=0)),
                         ("axis -1", keras.metrics.CosineSimilarity())):
        metric.update_state(y, p)
        results[name] = float(metric.result())
    assert results["rebuilt"] == pytest.approx(results["axis 0"])
    assert results["axis 0"] != pytest.approx(results["axis -1"])


def _nested_model():
    import keras

    keras.utils.set_random_seed(5)
    base = keras.Sequential([keras.Input((8,)), keras.layers.Dense(6, activation="relu"),
                             keras.layers.LayerNormalization()], name="base")
    inputs = keras.Input((8,))
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(base(inputs)))


def _decayed(optimizer, model):
    return [optimizer._use_weight_decay(variable) for variable in model.trainable_variables]


def test_an_optimizers_weight_decay_exclusions_reach_the_rebuilt_optimizer():
    """Keras keeps `exclude_from_weight_decay()` out of the optimizer's config: rebuilt
    from it on the executors, AdamW decayed the biases and weights the user excluded."""
    import keras

    from distkeras.keras_io.compile_config import compile_arguments, optimizer_as_compiled
    from distkeras.utils import deserialize_model, serialize_model

    model = _nested_model()
    optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.5)
    # A weight of the nested model: its path differs in a rebuilt model ("base/dense/kernel",
    # then "dense/kernel").
    optimizer.exclude_from_weight_decay(var_list=[model.trainable_variables[0]],
                                        var_names=["bias", "gamma"])
    wanted = _decayed(optimizer, model)
    assert wanted == [False, False, False, True, True, False]

    rebuilt = deserialize_model(serialize_model(model))
    config = json.loads(json.dumps(optimizer_as_compiled(optimizer, model)))  # the wire
    again = compile_arguments(config, "mse", None, model=rebuilt)["optimizer"]
    assert _decayed(again, rebuilt) == wanted
    # A mixed_float16 model's optimizer is wrapped in a LossScaleOptimizer on the driver:
    # its inner optimizer keeps them.
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        mixed = _nested_model()
    finally:
        keras.mixed_precision.set_global_policy("float32")
    optimizer = keras.optimizers.AdamW(0.01, weight_decay=0.5)
    optimizer.exclude_from_weight_decay(var_list=[mixed.trainable_variables[0]],
                                        var_names=["bias", "gamma"])
    rebuilt = deserialize_model(serialize_model(mixed))
    again = compile_arguments(optimizer_as_compiled(optimizer, mixed), "mse", None,
                              model=rebuilt)["optimizer"]
    assert type(again).__name__ == "LossScaleOptimizer"
    assert _decayed(again.inner_optimizer, rebuilt) == wanted
