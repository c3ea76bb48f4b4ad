"""A user's own layers, activations, losses and metrics reach the executors.

The objects live in `custom_objects_support`, a module the executors cannot import.
"""

import numpy as np
import pytest

from conftest import accuracy


def test_find_names_custom_layer_activation_loss_and_metric(spark):
    from custom_objects_support import (ScaledDense, custom_mlp, leaky, smoothed_crossentropy,
                                        top_class_rate)

    from distkeras.keras_io.custom_objects import find

    objects, unresolved = find(custom_mlp(),
                               ("adam", smoothed_crossentropy, ["accuracy", top_class_rate]))

    assert objects["ScaledDense"] is ScaledDense
    assert objects["distkeras_tests>leaky"] is leaky
    assert objects["smoothed_crossentropy"] is smoothed_crossentropy
    assert objects["top_class_rate"] is top_class_rate
    assert unresolved == []


def test_find_nothing_for_keras_own_objects(spark):
    import keras
    from conftest import build_mlp

    from distkeras.keras_io.custom_objects import find

    objects, unresolved = find(build_mlp(), (keras.optimizers.SGD(0.1),
                                             keras.losses.CategoricalCrossentropy(),
                                             ["accuracy", keras.metrics.AUC()]))

    assert objects == {} and unresolved == []


def test_unknown_loss_fails_on_the_driver_naming_it(spark, fashion_train):
    from conftest import build_mlp

    from distkeras.trainers import ADAG

    trainer = ADAG(build_mlp(), "adam", {"class_name": "NoSuchLoss", "config": {}},
                   num_workers=2)

    with pytest.raises(ValueError, match="NoSuchLoss.*register_keras_serializable"):
        trainer.train(fashion_train, verbose=0)
    assert trainer.get_history() == []


def test_a_lambda_layer_is_refused_on_the_driver_with_advice_that_works(fashion_train):
    """Keras's advice (enable unsafe deserialization) does not reach the executors, which
    load with safe_mode=True: training failed there, after the user had followed it."""
    import keras

    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import SingleTrainer

    model = keras.Sequential([keras.Input((784,)), keras.layers.Lambda(lambda x: x * 2),
                              keras.layers.Dense(10, activation="softmax")])
    trainer = SingleTrainer(model, "adam", "categorical_crossentropy")

    keras.config.enable_unsafe_deserialization()
    try:
        with pytest.raises(ValueError, match="safe_mode=True whatever keras.config says.*"
                                             "custom Layer subclass"):
            trainer.train(fashion_train, verbose=0)
        with pytest.raises(ValueError, match="safe_mode=True whatever"):
            ModelPredictor(model).predict(fashion_train)
    finally:
        from keras.src.backend.common import global_state

        global_state.set_global_attribute("safe_mode_saving", None)  # Keras's default
    assert trainer.get_history() == []


def test_subclassed_model_gets_a_clear_error(fashion_train):
    from custom_objects_support import Residual
    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import SingleTrainer

    model = Residual()
    model.build((None, 784))

    with pytest.raises(ValueError, match="subclassed keras.Model.*keras.Input"):
        SingleTrainer(model, "adam", "categorical_crossentropy").train(fashion_train)
    with pytest.raises(ValueError, match="subclassed keras.Model"):
        ModelPredictor(model).predict(fashion_train)


def test_adag_trains_and_predicts_with_custom_objects(spark, fashion_train, fashion_test):
    from custom_objects_support import custom_mlp, smoothed_crossentropy, top_class_rate
    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import ADAG

    trainer = ADAG(custom_mlp(), "adam", smoothed_crossentropy,
                   metrics=[top_class_rate], num_workers=2, communication_window=4)
    model = trainer.train(fashion_train.repartition(2), verbose=0)

    assert accuracy(model, fashion_test) > 0.6
    assert all("top_class_rate" in record for record in trainer.get_history())
    images = fashion_test[0][:50]
    frame = spark.createDataFrame(
        [(i, row.tolist()) for i, row in enumerate(images)], "id int, features array<float>")
    rows = ModelPredictor(model).predict(frame).orderBy("id").collect()
    predicted = np.array([row["prediction"] for row in rows], dtype="float32")
    np.testing.assert_allclose(predicted, model.predict(images, verbose=0), atol=1e-5)


def test_wrapped_subclassed_model_trains(spark, fashion_train, fashion_test):
    import keras
    from custom_objects_support import Residual
    from distkeras.trainers import SingleTrainer

    inputs = keras.Input((784,))
    outputs = keras.layers.Dense(10, activation="softmax")(Residual(32)(inputs))
    model = SingleTrainer(keras.Model(inputs, outputs), "adam",
                          "categorical_crossentropy").train(fashion_train, verbose=0)

    assert accuracy(model, fashion_test) > 0.6


def _fake_main(monkeypatch, spec):
    import os
    import sys
    import types

    main = types.ModuleType("__main__")
    main.__spec__ = spec

    def helper(y_true, y_pred):
        return y_pred

    helper.__module__ = "__main__"
    main.helper = helper
    main.system = os.system  # imported into __main__, not defined there
    monkeypatch.setitem(sys.modules, "__main__", main)
    return helper


def test_names_are_looked_up_in_a_user_script_or_notebook(monkeypatch, spark):
    from conftest import build_mlp

    from distkeras.keras_io.custom_objects import find

    helper = _fake_main(monkeypatch, spec=None)
    loss = {"module": "builtins", "class_name": "function", "config": "helper",
            "registered_name": "function"}
    system = dict(loss, config="system")

    objects, unresolved = find(build_mlp(), ("adam", loss, [system]))

    assert objects == {"helper": helper} and unresolved == ["system"]


def test_a_module_run_as_main_lends_none_of_its_functions(monkeypatch, spark):
    """`python -m distkeras.cli` runs Punchcard's jobs: a client's config naming one of its
    functions must not make Keras call it."""
    import importlib.machinery

    from conftest import build_mlp

    from distkeras.keras_io.custom_objects import find

    _fake_main(monkeypatch, spec=importlib.machinery.ModuleSpec("distkeras.cli", None))
    loss = {"module": "builtins", "class_name": "function", "config": "helper",
            "registered_name": "function"}

    objects, unresolved = find(build_mlp(), ("adam", loss, []))

    assert objects == {} and unresolved == ["helper"]


def test_variable_length_input_gets_a_clear_error(spark):
    import keras

    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import SingleTrainer

    frame = spark.createDataFrame([([1, 2, 3], 0), ([4, 5, 6], 1)],
                                  "tokens array<int>, label int")
    inputs = keras.Input((None,), dtype="int32")
    hidden = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(8, 2)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(hidden))
    with pytest.raises(ValueError, match="unknown size"):
        ModelPredictor(model, features_col="tokens").predict(frame)
    with pytest.raises(ValueError, match="unknown size"):
        SingleTrainer(model, worker_optimizer="adam", loss="sparse_categorical_crossentropy",
                      features_col="tokens").train(frame, verbose=0)
