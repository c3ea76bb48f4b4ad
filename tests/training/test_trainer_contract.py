"""One contract for every trainer: it constructs, trains on real data, returns compiled
models that learned, and its configuration round-trips."""

import json

import pytest
from conftest import accuracy, build_mlp

from distkeras import trainers
from distkeras.training import spark_jobs

# A model that learned nothing scores about 0.10; one pass over 3,000 images takes a working
# trainer well past 0.45 (EAMSGD's momentum on top of Adam is the slowest, about 0.55). One
# worker alone clears that floor too: that every worker's commits reached the center is
# checked apart (test_trainer_contract), and what two workers reach against what one
# reaches in tests/training/test_training.py.
MIN_ACCURACY = 0.45

DISTRIBUTED = {"num_workers": 2}
TRAINERS = {
    "SingleTrainer": {},
    "AveragingTrainer": DISTRIBUTED,
    "EnsembleTrainer": {"num_ensembles": 2, "seed": 7},
    "DOWNPOUR": DISTRIBUTED,
    "ADAG": {"num_workers": 2, "communication_window": 4},
    "DynSGD": DISTRIBUTED,
    "AEASGD": DISTRIBUTED,
    "EAMSGD": DISTRIBUTED,
    "Experimental": DISTRIBUTED,
    "DiLoCo": DISTRIBUTED,
    "FedAdam": DISTRIBUTED,
}


def _build(name, **extra):
    settings = dict(keras_model=build_mlp(), worker_optimizer="adam",
                    loss="categorical_crossentropy", metrics=["accuracy"], batch_size=32)
    settings.update(TRAINERS[name])
    settings.update(extra)
    return getattr(trainers, name)(**settings)


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_trainer_contract(name, fashion_train, fashion_test):
    import keras

    trainer = _build(name)
    result = trainer.train(fashion_train.limit(3000))
    models = result if isinstance(result, list) else [result]
    assert len(models) == (2 if name == "EnsembleTrainer" else 1)
    for model in models:
        assert isinstance(model, keras.Model) and model.compiled
        assert accuracy(model, fashion_test) > MIN_ACCURACY, name
    history = trainer.get_history()
    assert sum(record["batch_size"] for record in history) == 3000
    if isinstance(trainer, trainers.AsynchronousDistributedTrainer):
        staleness = trainer.get_staleness()
        assert len(staleness) == trainer.parameter_server.num_updates > 0
        assert all(value >= 0 for _, value in staleness)
        # Both workers' commits were applied, not one worker's alone.
        assert {worker for worker, _ in staleness} == {0, 1}, name


def test_ensemble_members_are_independent(fashion_train):
    import numpy as np

    models = _build("EnsembleTrainer").train(fashion_train.limit(600))
    first, second = (model.get_weights()[0] for model in models)
    assert not np.allclose(first, second)


def test_an_ensemble_member_without_rows_is_named_as_untrained(fashion_train, caplog):
    from distkeras.trainers import EnsembleTrainer

    trainer = EnsembleTrainer(build_mlp(32), "adam", "categorical_crossentropy",
                              num_ensembles=3)
    with caplog.at_level("WARNING", logger="distkeras"):
        models = trainer.train(fashion_train.limit(2), verbose=0)
    assert len(models) == 3
    (untrained,) = {0, 1, 2} - {record["worker_id"] for record in trainer.get_history()}
    assert f"member(s) [{untrained}] had no rows" in caplog.text


@pytest.mark.parametrize("name", sorted(TRAINERS))
def test_config_round_trip(name):
    trainer = _build(name, worker_optimizer={"class_name": "SGD",
                                             "config": {"learning_rate": 0.05}})
    config = trainer.get_config()
    text = json.dumps(config)  # JSON-able
    rebuilt = type(trainer).from_config(json.loads(text), keras_model=build_mlp())
    assert rebuilt.get_config() == config
    assert "keras_model" not in config


@pytest.mark.parametrize("name, kwargs, message", [
    ("AEASGD", {"rho": 20.0}, "rho \\* learning_rate"),
    ("EAMSGD", {"momentum": 1.5}, "`momentum` must be a number in \\[0, 1\\)"),
    ("Experimental", {"learning_rate": -1}, "`learning_rate` must be a positive number"),
    ("EnsembleTrainer", {"num_ensembles": 0}, "must be an integer >= 1"),
    ("EnsembleTrainer", {"num_ensembles": True},
     "`num_ensembles` must be an integer >= 1. Received: num_ensembles=True"),
    ("EnsembleTrainer", {"seed": -1}, "`seed` must be an integer in \\[0, 4294967294\\]"),
    ("EnsembleTrainer", {"seed": 1.5}, "`seed` must be an integer .* Received: seed=1.5"),
])
def test_bad_settings_are_named(name, kwargs, message, fashion_train):
    with pytest.raises(ValueError, match=message):
        _build(name, **kwargs).train(fashion_train)


@pytest.mark.parametrize("kwargs, message", [
    ({"worker_optimizer": "adamm"}, "`worker_optimizer`: Keras does not know 'adamm'"),
    ({"loss": "categorical_crossentropyy"},
     "`loss`: Keras does not know 'categorical_crossentropyy'"),
    ({"metrics": ["accuracy", "acuracy"]}, "`metrics`: Keras does not know 'acuracy'"),
])
def test_misspelled_names_fail_on_the_driver(kwargs, message, fashion_train):
    settings = {"worker_optimizer": "adam", "loss": "categorical_crossentropy", **kwargs}
    trainer = trainers.ADAG(build_mlp(), num_workers=2, **settings)

    with pytest.raises(ValueError, match=message):
        trainer.train(fashion_train, verbose=0)
    assert trainer.get_history() == []


@pytest.mark.parametrize("loss", ["categorical_crossentropy", "CategoricalCrossentropy"])
def test_class_indices_with_a_one_hot_loss_say_which_loss_to_use(loss, spark):
    import keras
    from pyspark.sql import Row

    frame = spark.createDataFrame([Row(features=[0.5] * 784, label=3)] * 4)
    loss = keras.losses.get(loss) if loss[0].isupper() else loss
    trainer = trainers.SingleTrainer(build_mlp(), "adam", loss)

    with pytest.raises(ValueError, match="scalars .*sparse_categorical_crossentropy"):
        trainer.train(frame, verbose=0)


@pytest.mark.parametrize("loss, label, message", [
    ("sparse_categorical_crossentropy", [0.0] * 3 + [1.0] + [0.0] * 6,
     "vectors of shape \\(10,\\) .*categorical_crossentropy"),
    ("SparseCategoricalCrossentropy", [0.0] * 3 + [1.0] + [0.0] * 6,
     "vectors of shape \\(10,\\) .*categorical_crossentropy"),
    ("binary_crossentropy", 3, "scalars .*sigmoid"),
    # A regression target per row for 10 units: workers read 0.25 as a class index.
    ("mse", 0.25, "scalars .*'mse' compares each of the output's 10 values.*10 values per row"),
    ("MeanAbsoluteError", 3, "scalars .*'meanabsoluteerror'.*Dense\\(1\\)"),
])
def test_labels_the_loss_cannot_read_fail_on_the_driver(loss, label, message, spark):
    import keras
    from pyspark.sql import Row

    frame = spark.createDataFrame([Row(features=[0.5] * 784, label=label)] * 4)
    loss = keras.losses.get(loss) if loss[0].isupper() else loss
    trainer = trainers.ADAG(build_mlp(), "adam", loss, num_workers=2)

    with pytest.raises(ValueError, match=message):
        trainer.train(frame, verbose=0)
    assert trainer.get_history() == []


def test_several_numeric_columns_for_one_input_are_told_how_to_assemble_them(spark):
    import keras
    from pyspark.sql import Row

    from distkeras.predictors import ModelPredictor

    # A CSV's feature columns, passed as a list to a one-input model.
    frame = spark.createDataFrame([Row(a=1.0, b=2.0, c=3, label=1)] * 4)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    trainer = trainers.SingleTrainer(model, "adam", "sparse_categorical_crossentropy",
                                     features_col=["a", "b", "c"])

    with pytest.raises(ValueError, match="1 inputs but features_col names 3.*VectorAssembler"):
        trainer.train(frame, verbose=0)
    with pytest.raises(ValueError, match="1 inputs but features_col names 3.*VectorAssembler"):
        ModelPredictor(model, features_col=["a", "b", "c"]).predict(frame)
    assert trainer.get_history() == []


def test_one_hot_validation_labels_with_a_sparse_loss_fail_before_training(spark):
    from pyspark.sql import Row

    frame = spark.createDataFrame([Row(features=[0.5] * 784, label=3)] * 4)
    one_hot = spark.createDataFrame(
        [Row(features=[0.5] * 784, label=[0.0] * 3 + [1.0] + [0.0] * 6)] * 4)
    trainer = trainers.SingleTrainer(build_mlp(), "adam", "sparse_categorical_crossentropy")

    with pytest.raises(ValueError, match="In validation_data: .*vectors of shape"):
        trainer.train(frame, validation_data=one_hot, verbose=0)
    assert trainer.get_history() == []


def test_uneven_partitions_get_a_warning_that_says_how_to_even_them(fashion_train, caplog):
    import logging

    # Two partitions, of 600 and 300 rows.
    first, second = (fashion_train.limit(rows).rdd.coalesce(1) for rows in (600, 300))
    uneven = fashion_train.sparkSession.createDataFrame(first.union(second),
                                                        fashion_train.schema)
    assert uneven.rdd.getNumPartitions() == 2
    trainer = _build("ADAG")
    with caplog.at_level(logging.WARNING, logger="distkeras"):
        trainer.train(uneven, verbose=0)
    warnings = [record.getMessage() for record in caplog.records
                if "uneven partitions" in record.getMessage()]
    assert len(warnings) == 1
    assert "0: 600" in warnings[0] and "1: 300" in warnings[0]
    assert "repartition(2)" in warnings[0]


def test_even_enough_partitions_get_no_warning(caplog):
    import logging

    with caplog.at_level(logging.WARNING, logger="distkeras"):
        assert not spark_jobs.warn_if_uneven([{"worker_id": 0, "samples": 1000},
                                                 {"worker_id": 1, "samples": 1100}])
        assert not spark_jobs.warn_if_uneven([{"worker_id": 0, "samples": 1000}])
        assert not spark_jobs.warn_if_uneven([{"worker_id": 0}, {"worker_id": 1}])
        assert spark_jobs.warn_if_uneven([{"worker_id": 0, "samples": 1000},
                                             {"worker_id": 1, "samples": 1101}])
    assert len(caplog.records) == 1


def test_anything_but_a_spark_dataframe_is_refused_with_a_hint(spark):
    import pandas as pd

    from distkeras.predictors import ModelPredictor

    trainer = trainers.SingleTrainer(build_mlp(), "adam", "categorical_crossentropy")
    with pytest.raises(TypeError, match="must be a Spark DataFrame.*pandas.*createDataFrame"):
        trainer.train(pd.DataFrame({"features": [[0.0] * 784], "label": [[1.0] * 10]}))
    with pytest.raises(TypeError, match="DataFrame to predict on must be a Spark DataFrame"):
        ModelPredictor(build_mlp()).predict([[0.0] * 784])

    # Something that only looks like a Spark Connect DataFrame by its module (Connect's
    # real ones train: tests/training/test_connect.py) is no DataFrame either.
    lookalike = type("DataFrame", (), {"__module__": "pyspark.sql.connect.dataframe"})()
    with pytest.raises(TypeError, match="must be a Spark DataFrame"):
        trainer.train(lookalike)


def test_single_trainer_returns_fits_model_optimizer_state_included(spark, tmp_path):
    import warnings

    import keras
    import numpy as np

    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(3)
    x = rng.normal(size=(650, 8)).astype("float32")  # each epoch ends with 10 rows, as fit
    y = (x[:, :2].sum(axis=1) > 0).astype("int64")

    def model():
        keras.utils.set_random_seed(5)
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])

    reference = model()
    reference.compile("adam", "sparse_categorical_crossentropy")
    reference.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    frame = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)],
                                  "features array<float>, label long").coalesce(1)
    trained = SingleTrainer(model(), "adam", "sparse_categorical_crossentropy", metrics=[],
                            num_epoch=2).train(frame, verbose=0)

    for mine, theirs in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    # Adam's step count and moments too: further training goes on as after `fit`.
    mine = [np.asarray(variable.value) for variable in trained.optimizer.variables]
    theirs = [np.asarray(variable.value) for variable in reference.optimizer.variables]
    assert int(mine[0]) == 42  # 21 steps an epoch
    for got, want in zip(mine, theirs):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)

    # Going on from the returned model, as from a model after `fit`: its optimizer's state
    # too (the compiled model lends its optimizer).
    reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    further = SingleTrainer(trained, metrics=[]).train(frame, verbose=0)
    assert int(np.asarray(further.optimizer.iterations.value)) == 63
    for mine, theirs in zip(further.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    # The same epoch by epoch (validating): the same result.
    validated = SingleTrainer(trained, metrics=[]).train(frame, verbose=0,
                                                          validation_data=(x[:50], y[:50]))
    assert int(np.asarray(validated.optimizer.iterations.value)) == 63
    for mine, theirs in zip(validated.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)

    path = str(tmp_path / "trained.keras")
    trained.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. "Skipping variable loading for optimizer"
        loaded = keras.saving.load_model(path)
    np.testing.assert_array_equal(loaded.predict(x[:5], verbose=0),
                                  trained.predict(x[:5], verbose=0))


def test_a_fit_model_accumulating_gradients_goes_on_as_fit_does(spark):
    """A model compiled with gradient_accumulation_steps and `fit` lends its optimizer's
    state (reading its step count raised AttributeError: Keras's ``iterations`` is then a
    tensor), its accumulated gradients included."""
    import keras
    import numpy as np

    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(6)
    x = rng.normal(size=(160, 8)).astype("float32")  # 5 minibatches: 1 update, 2 held
    y = (x[:, :2].sum(axis=1) > 0).astype("int64")

    def model():
        keras.utils.set_random_seed(5)
        built = keras.Sequential([keras.Input((8,)),
                                  keras.layers.Dense(2, activation="softmax")])
        built.compile(keras.optimizers.Adam(0.01, gradient_accumulation_steps=3),
                      "sparse_categorical_crossentropy")
        return built

    reference, mine = model(), model()
    for each in (reference, mine):
        each.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    frame = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)],
                                  "features array<float>, label long").coalesce(1)
    further = SingleTrainer(mine, metrics=[]).train(frame, verbose=0)

    for got, want in zip(further.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    for got, want in zip(further.optimizer.variables, reference.optimizer.variables):
        np.testing.assert_allclose(np.asarray(got.value), np.asarray(want.value),
                                   rtol=1e-4, atol=1e-6)


def test_single_trainer_ends_with_the_ema_weights_as_fit_does(spark):
    import keras
    import numpy as np

    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(4)
    x = rng.normal(size=(320, 8)).astype("float32")
    y = (x[:, :2].sum(axis=1) > 0).astype("int64")

    def model():
        keras.utils.set_random_seed(5)
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])

    def optimizer():
        return keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.9)

    reference = model()
    reference.compile(optimizer(), "sparse_categorical_crossentropy")
    reference.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    frame = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)],
                                  "features array<float>, label long").coalesce(1)
    trained = SingleTrainer(model(), optimizer(), "sparse_categorical_crossentropy",
                            metrics=[], num_epoch=2).train(frame, verbose=0)

    # fit leaves the moving averages as the weights; the last step's weights differ.
    for mine, theirs in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)


def test_the_last_epoch_is_validated_before_the_ema_weights_as_fit_does(spark):
    """fit validates (and calls back) its last epoch on the trained weights, then leaves
    the moving averages as the weights: the last record was the averages' val_loss."""
    import keras
    import numpy as np

    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(4)
    x = rng.normal(size=(192, 8)).astype("float32")
    y = (x[:, :2].sum(axis=1) > 0).astype("int64")
    x_val, y_val = x[:64], y[:64]

    def model():
        keras.utils.set_random_seed(5)
        built = keras.Sequential([keras.Input((8,)),
                                  keras.layers.Dense(2, activation="softmax")])
        built.compile(keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.9),
                      "sparse_categorical_crossentropy")
        return built

    reference = model()
    fitted = reference.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                           validation_data=(x_val, y_val))
    frame = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)],
                                  "features array<float>, label long").coalesce(1)
    trainer = SingleTrainer(model(), metrics=[], num_epoch=2)
    trained = trainer.train(frame, verbose=0, validation_data=(x_val, y_val))

    np.testing.assert_allclose([record["val_loss"] for record in
                                trainer.get_validation_history()],
                               fitted.history["val_loss"], rtol=1e-5)
    for mine, theirs in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    # The returned model's line evaluates what it holds: the moving averages.
    returned = trainer._results.returned_validation[0]  # the last run's
    np.testing.assert_allclose(
        returned["val_loss"], reference.evaluate(x_val, y_val, verbose=0), rtol=1e-5)


def test_ensemble_members_end_with_the_ema_weights_as_fit_does(spark):
    """Each member trains alone, as its own fit: it ends with its optimizer's moving
    averages (it returned the last step's weights, and was warned of an exchange)."""
    import keras
    import numpy as np

    from distkeras.trainers import EnsembleTrainer

    rng = np.random.default_rng(4)
    x = rng.normal(size=(192, 8)).astype("float32")
    y = (x[:, :2].sum(axis=1) > 0).astype("int64")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])

    def optimizer():
        return keras.optimizers.Adam(0.05, use_ema=True, ema_momentum=0.9)

    keras.utils.set_random_seed(3)  # the member's initial weights: seed + its index 0
    reference = keras.models.clone_model(model)
    reference.compile(optimizer(), "sparse_categorical_crossentropy")
    reference.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0)
    frame = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)],
                                  "features array<float>, label long").coalesce(1)
    (member,) = EnsembleTrainer(model, optimizer(), "sparse_categorical_crossentropy",
                                metrics=[], num_ensembles=1, num_epoch=2,
                                seed=3).train(frame, verbose=0)

    for mine, theirs in zip(member.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)


def test_a_mixed_float16_model_trains_with_loss_scaling_as_fit_does(spark):
    import keras
    import numpy as np

    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(6)
    x = rng.normal(size=(320, 8)).astype("float32")
    y = (x[:, :2].sum(axis=1) > 0).astype("int64")
    frame = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)],
                                  "features array<float>, label long").coalesce(1)

    def model():
        keras.utils.set_random_seed(5)
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(4),
                                 keras.layers.Dense(2, activation="softmax", dtype="float32")])

    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        reference = model()
        reference.compile("adam", "sparse_categorical_crossentropy")
        reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
        trained = SingleTrainer(model(), "adam", "sparse_categorical_crossentropy",
                                metrics=[]).train(frame, verbose=0)
    finally:
        keras.mixed_precision.set_global_policy("float32")

    # The executors rebuild the model under their own (float32) global policy; it still
    # trains with the LossScaleOptimizer `compile` gives it here, whose state comes back.
    assert isinstance(trained.optimizer, keras.optimizers.LossScaleOptimizer)
    inner = trained.optimizer.inner_optimizer
    assert int(np.asarray(inner.iterations.value)) == 10  # 10 steps of 32 rows
    mine = [np.asarray(variable.value) for variable in trained.optimizer.variables]
    theirs = [np.asarray(variable.value) for variable in reference.optimizer.variables]
    assert len(mine) == len(theirs)
    for got, want in zip(mine, theirs):
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-3)
    for got, want in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-3)


def test_a_bfloat16_model_trains_as_fit_does(spark):
    """Layers built with dtype="bfloat16" hold bfloat16 weights, which the workers and the
    parameter server exchange (the wire refused them: "Unsupported array dtype")."""
    import keras
    import numpy as np

    from distkeras.trainers import DOWNPOUR

    rng = np.random.default_rng(6)
    x = rng.normal(size=(192, 8)).astype("float32")
    y = (x[:, :2].sum(axis=1) > 0).astype("int64")
    frame = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)],
                                  "features array<float>, label long").coalesce(1)

    def model():
        keras.utils.set_random_seed(5)
        built = keras.Sequential([keras.Input((8,)),
                                  keras.layers.Dense(4, activation="relu", dtype="bfloat16"),
                                  keras.layers.Dense(2, activation="softmax", dtype="float32")])
        built.compile(keras.optimizers.Adam(0.01), "sparse_categorical_crossentropy")
        return built

    reference = model()
    reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    # One worker: DOWNPOUR's center follows its steps exactly, as fit's weights.
    trained = DOWNPOUR(model(), num_workers=1, communication_window=4, batch_size=32,
                       metrics=[]).train(frame, verbose=0)

    assert [weight.dtype for weight in trained.weights] == \
        [weight.dtype for weight in reference.weights]
    assert trained.layers[0].dtype_policy.name == "bfloat16"
    for got, want in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(want, np.float32))


@pytest.mark.parametrize("name", ["ADAG", "AveragingTrainer"])
def test_returned_models_save_and_load_without_warnings(name, fashion_train, tmp_path):
    import warnings

    import keras

    model = _build(name).train(fashion_train.limit(640), verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = keras.saving.load_model(path)
    assert loaded.compiled and loaded.optimizer.iterations.numpy() == 0


def test_a_compiled_model_lends_its_optimizer_and_loss(fashion_train):
    import keras

    from distkeras.trainers import ADAG, SingleTrainer

    model = build_mlp(32)
    model.compile(keras.optimizers.SGD(0.05, momentum=0.5), "categorical_crossentropy",
                  jit_compile=False, steps_per_execution=4)
    trainer = ADAG(model, num_workers=2, communication_window=4)
    trained = trainer.train(fashion_train.limit(600), verbose=0)

    assert isinstance(trained.optimizer, keras.optimizers.SGD)
    assert trained.optimizer.get_config()["momentum"] == 0.5
    # How the model runs later (fit, evaluate, predict) is kept too.
    assert trained.jit_compile is False and trained.steps_per_execution == 4
    assert trainer.get_config()["loss"] is None  # as given: train() changes no setting
    assert trainer.settings().loss == "categorical_crossentropy"  # what a run trains with
    with pytest.raises(ValueError, match="`loss` is required, for example "
                                         "loss='categorical_crossentropy', unless keras_model "
                                         "is compiled"):
        SingleTrainer(build_mlp(32), "adam").train(fashion_train, verbose=0)
    with pytest.raises(ValueError, match="`worker_optimizer` is required"):
        SingleTrainer(build_mlp(32), loss="mse").train(fashion_train, verbose=0)



def test_a_huber_loss_trains_with_its_delta_as_fit_does(spark):
    """Keras's Huber leaves `delta` out of its config: it must still reach the workers and
    the returned model (delta=1 instead of 4 trains other weights, silently)."""
    import keras
    import numpy as np

    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 3)).astype("float32")
    y = (3.0 * x.sum(axis=1)).astype("float32")  # errors of several units: past delta=1
    frame = spark.createDataFrame([(x[i].tolist(), float(y[i])) for i in range(32)],
                                  "features array<float>, target double").coalesce(1)

    def build():
        keras.utils.set_random_seed(3)
        return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])

    trainer = SingleTrainer(build(), "sgd", keras.losses.Huber(delta=4.0), metrics=[],
                            batch_size=16, label_col="target")
    trained = trainer.train(frame, verbose=0)
    expected = build()
    expected.compile("sgd", keras.losses.Huber(delta=4.0))
    expected.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)

    for ours, theirs in zip(trained.get_weights(), expected.get_weights()):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    assert np.isclose(trained.evaluate(x, y, verbose=0), expected.evaluate(x, y, verbose=0))


def _two_outputs():
    import keras

    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, [keras.layers.Dense(1, name="reg")(hidden),
                                keras.layers.Dense(3, activation="softmax", name="cls")(hidden)])


@pytest.fixture(scope="module")
def two_target_frame(spark):
    """A regression and a 3-class target from 4 features, in a column named with a dot."""
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4)).astype("float32")
    classes = (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5).astype(int)
    rows = [(x[i].tolist(), float(x[i].sum()), int(classes[i])) for i in range(600)]
    return spark.createDataFrame(rows, "`my.features` array<float>, total double, kind int")


def test_metrics_follow_keras_for_several_outputs(two_target_frame):
    from distkeras.trainers import DOWNPOUR, SingleTrainer

    losses = ["mse", "sparse_categorical_crossentropy"]
    columns = dict(features_col="my.features", label_col=["total", "kind"])
    # No metrics given: none for several outputs (one "accuracy" for all fails in Keras).
    trainer = SingleTrainer(_two_outputs(), "adam", losses, **columns)
    trainer.train(two_target_frame, verbose=0)
    assert {"reg_loss", "cls_loss"} <= set(trainer.get_history()[-1])
    # A flat list of the wrong length: refused on the driver, with the forms that work.
    with pytest.raises(ValueError, match=r"`metrics` is a flat list of 1 for a model with 2 "
                                         r"outputs. Give one list per output"):
        SingleTrainer(_two_outputs(), "adam", losses, metrics=["accuracy"],
                      **columns).train(two_target_frame, verbose=0)
    # Loss weights that Keras's first step would refuse, refused here, before any task.
    with pytest.raises(ValueError, match=r"`loss_weights` holds 2 weights for 1 loss\(es\)"):
        SingleTrainer(_two_outputs(), "adam", "mse", loss_weights=[1.0, 0.5],
                      **columns).train(two_target_frame, verbose=0)
    # Not numbers (a JSON config's string, say): Keras's compile on each executor refused it.
    for weights in ["{bad", [1.0, "0.5"], {"reg": None, "cls": 1.0}, [True, 1.0]]:
        with pytest.raises(ValueError, match=r"`loss_weights` must be a number \(one output\)"):
            SingleTrainer(_two_outputs(), "adam", losses, loss_weights=weights,
                          **columns).train(two_target_frame, verbose=0)
    # A dict by output name, as Keras takes it.
    trainer = DOWNPOUR(_two_outputs(), "adam", {"reg": "mse", "cls": losses[1]},
                       metrics={"cls": "accuracy"}, num_workers=2, **columns)
    trainer.train(two_target_frame, verbose=0)
    record = trainer.get_history()[-1]
    assert "cls_accuracy" in record and "reg_accuracy" not in record


def test_a_compiled_model_lends_its_metrics_and_loss_weights(two_target_frame):
    import numpy as np

    from distkeras.trainers import DOWNPOUR

    model = _two_outputs()
    model.compile("adam", ["mse", "sparse_categorical_crossentropy"],
                  metrics=[["mae"], ["accuracy"]], loss_weights=[1.0, 0.0])
    trainer = DOWNPOUR(model, num_workers=2, features_col="my.features",
                       label_col=["total", "kind"])
    trained = trainer.train(two_target_frame, verbose=0)
    history = trainer.get_history()
    assert {"reg_mae", "cls_accuracy"} <= set(history[-1]) and "accuracy" not in history[-1]
    # The classification loss weighs nothing: the total is the regression loss.
    for record in history[-5:]:
        assert np.isclose(record["loss"], record["reg_loss"], rtol=1e-4)
    assert trained.get_compile_config()["loss_weights"] == [1.0, 0.0]


def test_one_column_may_feed_two_outputs_and_names_with_dots_work(two_target_frame):
    import keras
    import numpy as np

    from distkeras.evaluators import AccuracyEvaluator
    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import ADAG

    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, [keras.layers.Dense(3, activation="softmax", name="a")(hidden),
                                 keras.layers.Dense(3, activation="softmax", name="b")(hidden)])
    trainer = ADAG(model, "adam", "sparse_categorical_crossentropy", num_workers=2,
                   communication_window=2, num_epoch=3, features_col="my.features",
                   label_col=["kind", "kind"])  # as fit(x, [y, y])
    trained = trainer.train(two_target_frame, verbose=0)
    assert sum(record["batch_size"] for record in trainer.get_history()) == 3 * 600
    predicted = ModelPredictor(trained, features_col="my.features",
                               output_col=["pred.a", "pred.b"]).predict(two_target_frame)
    assert predicted.columns[-2:] == ["pred.a", "pred.b"]
    score = AccuracyEvaluator(label_col="kind", prediction_col="pred.a").evaluate(predicted)
    rows = two_target_frame.collect()
    features = np.array([row["my.features"] for row in rows], np.float32)
    kinds = np.array([row["kind"] for row in rows])
    assert np.isclose(score, (trained.predict(features, verbose=0)[0].argmax(1) == kinds).mean())
    history = trainer.get_history()  # both heads learn from the one column
    for head in ("a_loss", "b_loss"):
        losses = [record[head] for record in history]
        assert np.mean(losses[-15:]) < np.mean(losses[:15]), head


@pytest.mark.parametrize("trainer_name", ["ADAG", "SingleTrainer"])
def test_a_trained_trainer_pickles_and_copies_with_its_results(trainer_name, fashion_train,
                                                               fashion_test):
    import copy
    import pickle

    import numpy as np
    from conftest import build_mlp
    from distkeras import trainers

    cls = getattr(trainers, trainer_name)
    options = {"num_workers": 2} if trainer_name == "ADAG" else {}
    trainer = cls(keras_model=build_mlp(), worker_optimizer="adam",
                  loss="categorical_crossentropy", **options)
    x_val = np.zeros((8, 784), np.float32)
    y_val = np.eye(10, dtype=np.float32)[np.arange(8)]
    trainer.train(fashion_train.limit(500), verbose=0, validation_data=(x_val, y_val))
    for twin in (pickle.loads(pickle.dumps(trainer)), copy.deepcopy(trainer)):
        assert twin.get_validation_history() == trainer.get_validation_history()
        assert twin.get_history() == trainer.get_history()
        if hasattr(trainer, "get_staleness"):
            assert twin.get_staleness() == trainer.get_staleness()
        twin.train(fashion_train.limit(500), verbose=0)  # and trains again


def test_a_model_on_a_dict_of_named_inputs_trains_validates_and_predicts(spark):
    import keras
    import numpy as np

    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import DOWNPOUR, SingleTrainer

    rng = np.random.default_rng(6)
    x_z = rng.normal(size=(256, 3)).astype("float32")
    x_a = rng.normal(size=(256, 2)).astype("float32")
    y = (x_z.sum(axis=1) > 0).astype("int64")
    frame = spark.createDataFrame(
        [(a.tolist(), z.tolist(), int(label)) for a, z, label in zip(x_a, x_z, y)],
        "a array<float>, z array<float>, label long")

    def model():
        # Named inputs declared out of sorted order: Keras refuses them as a list.
        keras.utils.set_random_seed(2)
        z, a = keras.Input((3,), name="zz"), keras.Input((2,), name="aa")
        hidden = keras.layers.Concatenate()([z, a])
        return keras.Model({"zz": z, "aa": a},
                           keras.layers.Dense(1, activation="sigmoid")(hidden))

    x = {"zz": x_z, "aa": x_a}
    reference = model()
    reference.compile("adam", "binary_crossentropy")
    reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    # The columns in the order of `model.inputs` (Keras's: the names sorted).
    trainer = SingleTrainer(model(), "adam", "binary_crossentropy", metrics=[],
                            features_col=["a", "z"])
    trained = trainer.train(frame.coalesce(1), verbose=0, validation_data=(x, y))
    for mine, theirs in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    assert trainer.get_validation_history()[-1]["val_loss"] == pytest.approx(
        trained.evaluate(x, y, verbose=0), rel=1e-5)

    DOWNPOUR(model(), "adam", "binary_crossentropy", features_col=["a", "z"],
             num_workers=2).train(frame, verbose=0)
    predicted = ModelPredictor(trained, features_col=["a", "z"]).predict(frame)
    values = np.array([row["prediction"] for row in predicted.select("prediction").collect()])
    np.testing.assert_allclose(values, trained.predict(x, verbose=0), rtol=1e-5, atol=1e-6)


def test_columns_named_as_the_inputs_or_outputs_but_out_of_order_are_refused(spark):
    import keras

    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import SingleTrainer

    frame = spark.createDataFrame([([1.0, 2.0], [3.0, 4.0], 1.0, 0.0)],
                                  "zz array<float>, aa array<float>, y_z double, y_a double")
    z, a = keras.Input((2,), name="zz"), keras.Input((2,), name="aa")
    hidden = keras.layers.Concatenate()([z, a])
    model = keras.Model({"zz": z, "aa": a}, {"y_z": keras.layers.Dense(1, name="y_z")(hidden),
                                             "y_a": keras.layers.Dense(1, name="y_a")(hidden)})
    # Same shapes: in declaration order, each column would feed the other input.
    with pytest.raises(ValueError, match=r"features_col=\['zz', 'aa'\] names the model's "
                                         r"inputs in another order .* Pass features_col="
                                         r"\['aa', 'zz'\]"):
        SingleTrainer(model, "adam", "mse", features_col=["zz", "aa"],
                      label_col=["y_a", "y_z"]).train(frame, verbose=0)
    with pytest.raises(ValueError, match=r"Pass label_col=\['y_a', 'y_z'\]"):
        SingleTrainer(model, "adam", "mse", features_col=["aa", "zz"],
                      label_col=["y_z", "y_a"]).train(frame, verbose=0)
    with pytest.raises(ValueError, match=r"Pass features_col=\['aa', 'zz'\]"):
        ModelPredictor(model, features_col=["zz", "aa"]).predict(frame)


def test_columns_given_as_dicts_keyed_by_the_models_names_pair_by_name(spark):
    """As `fit` takes ``x`` and ``y`` as dicts keyed by input and output names, the
    columns may be too, whatever their own names (a list pairs them by position)."""
    import keras
    import numpy as np

    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(8)
    x_z = rng.normal(size=(96, 2)).astype("float32")
    x_a = rng.normal(size=(96, 2)).astype("float32")
    y_z, y_a = x_z.sum(axis=1), 3.0 * x_a[:, 0]
    frame = spark.createDataFrame(
        [(z.tolist(), a.tolist(), float(t), float(u))
         for z, a, t, u in zip(x_z, x_a, y_z, y_a)],
        "col_z array<float>, col_a array<float>, target_z double, target_a double")

    def model():
        keras.utils.set_random_seed(3)
        z, a = keras.Input((2,), name="zz"), keras.Input((2,), name="aa")
        hidden = keras.layers.Dense(4)(keras.layers.Concatenate()([z, a]))
        return keras.Model({"zz": z, "aa": a},
                           {"y_z": keras.layers.Dense(1, name="y_z")(hidden),
                            "y_a": keras.layers.Dense(1, name="y_a")(hidden)})

    x, y = {"zz": x_z, "aa": x_a}, {"y_z": y_z, "y_a": y_a}
    reference = model()
    reference.compile("adam", "mse")
    reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    features = {"zz": "col_z", "aa": "col_a"}
    trainer = SingleTrainer(model(), "adam", "mse", metrics=[], features_col=features,
                            label_col={"y_a": "target_a", "y_z": "target_z"})
    trained = trainer.train(frame.coalesce(1), verbose=0)
    for mine, theirs in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    # The run's columns in the model's order (names sorted); the trainer keeps the dict.
    assert trainer.settings().label_col == ["target_a", "target_z"]
    assert trainer.label_col == {"y_a": "target_a", "y_z": "target_z"}
    predicted = ModelPredictor(trained, features_col=features).predict(frame)
    values = np.array([row["prediction_y_z"] for row in predicted.collect()])
    np.testing.assert_allclose(values, trained.predict(x, verbose=0)["y_z"], rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(ValueError, match=r"keys must be the model's outputs' names, "
                                         r"\['y_a', 'y_z'\]. Missing: \['y_z'\]; not the "
                                         r"model's: \['z'\]"):
        SingleTrainer(model(), "adam", "mse", features_col=features,
                      label_col={"y_a": "target_a", "z": "target_z"}).train(frame, verbose=0)


def _keyed_outputs_data(spark):
    import numpy as np

    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 4)).astype("float32")
    y = {"c": (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0),
         "r": x.sum(axis=1, keepdims=True).astype("float32")}
    frame = spark.createDataFrame(
        [(x[i].tolist(), int(y["c"][i]), float(y["r"][i, 0])) for i in range(len(x))],
        "features array<float>, lab long, target double").coalesce(1)
    return x, y, frame


def _keyed_outputs_model(class_layer, value_layer):
    """A model whose outputs are keyed ``c`` (3 classes) and ``r`` (a value), on output
    layers named otherwise."""
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((4,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    return keras.Model(inputs, {
        "c": keras.layers.Dense(3, activation="softmax", name=class_layer)(hidden),
        "r": keras.layers.Dense(1, name=value_layer)(hidden)})


KEYED_LOSS = {"c": "sparse_categorical_crossentropy", "r": "mse"}
KEYED_METRICS = {"c": ["accuracy"], "r": ["mae"]}


def test_outputs_keyed_otherwise_than_their_layers_are_named_by_their_keys(spark):
    """Keras names a dict model's outputs by the dict's keys (`predict`, ``fit``'s ``y``,
    ``loss``/``metrics`` dicts, ``c_accuracy``); ``model.output_names`` names the layers.
    label_col and validation_data keyed ``c``/``r`` were refused (not the "outputs'
    names" ``cls_layer``/``reg_layer``), and the prediction columns were named after the
    layers: where a layer bore the other output's key, ``prediction_c`` held
    ``predict()["r"]``, without a word."""
    import numpy as np

    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import SingleTrainer

    x, y, frame = _keyed_outputs_data(spark)
    reference = _keyed_outputs_model("cls_layer", "reg_layer")
    reference.compile("adam", KEYED_LOSS, metrics=KEYED_METRICS)
    logs = reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0).history
    trainer = SingleTrainer(_keyed_outputs_model("cls_layer", "reg_layer"), "adam",
                            KEYED_LOSS, metrics=KEYED_METRICS,
                            label_col={"r": "target", "c": "lab"})
    trained = trainer.train(frame, verbose=0, validation_data=(x, y))
    assert trainer.settings().label_col == ["lab", "target"]
    for mine, theirs in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    assert set(logs) <= set(trainer.get_history()[-1])  # c_accuracy, r_mae, ...
    validation = trainer.get_validation_history()[-1]
    expected = trained.evaluate(x, y, verbose=0, return_dict=True)
    for name, value in expected.items():
        assert validation[f"val_{name}"] == pytest.approx(value, rel=1e-5)

    for model in (trained, _keyed_outputs_model("r", "c")):  # layers named as other keys
        predicted = ModelPredictor(model).predict(frame)
        assert predicted.columns[-2:] == ["prediction_c", "prediction_r"]
        rows = predicted.collect()
        for key, values in model.predict(x, verbose=0).items():
            np.testing.assert_allclose([row[f"prediction_{key}"] for row in rows], values,
                                       rtol=1e-5, atol=1e-6)


def test_outputs_on_layers_named_as_each_others_keys_are_measured_against_their_labels(
        spark):
    """Labels went to the model as a list; Keras pairs a list by ``model.output_names``
    when those are the dict's keys in another order (output ``c`` on a layer named ``r``):
    the losses and weights were right, but ``c_accuracy`` and ``r_mae`` (training and
    validation) compared each output with the other's labels, without a word."""
    import numpy as np

    from distkeras.trainers import SingleTrainer

    x, y, frame = _keyed_outputs_data(spark)
    reference = _keyed_outputs_model("r", "c")
    reference.compile("adam", KEYED_LOSS, metrics=KEYED_METRICS)
    logs = reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0).history
    trainer = SingleTrainer(_keyed_outputs_model("r", "c"), "adam", KEYED_LOSS,
                            metrics=KEYED_METRICS, label_col={"c": "lab", "r": "target"})
    trained = trainer.train(frame, verbose=0, validation_data=(x, y))
    for mine, theirs in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    steps = trainer.get_history()  # three minibatches of 32: their mean is the epoch's
    for name in ("c_accuracy", "r_mae"):
        assert np.mean([step[name] for step in steps]) == pytest.approx(logs[name][0],
                                                                        rel=1e-4)
    validation = trainer.get_validation_history()[-1]
    expected = trained.evaluate(x, y, verbose=0, return_dict=True)
    for name in ("c_accuracy", "r_mae"):
        assert validation[f"val_{name}"] == pytest.approx(expected[name], rel=1e-5)


# dist-keras's constructors, positionally, as its README and examples call them.
DIST_KERAS_POSITIONAL = {
    "SingleTrainer": (["features", "label_encoded", 3, 64],
                      {"features_col": "features", "label_col": "label_encoded",
                       "num_epoch": 3, "batch_size": 64}),
    "AveragingTrainer": (["features", "label_encoded", 3, 64, 4],
                         {"features_col": "features", "label_col": "label_encoded",
                          "num_epoch": 3, "batch_size": 64, "num_workers": 4}),
    "EnsembleTrainer": (["features", "label_encoded", 64, 3],
                        {"features_col": "features", "label_col": "label_encoded",
                         "batch_size": 64, "num_ensembles": 3}),
    "ADAG": ([4, 64, "features", "label_encoded", 3, 7],
             {"num_workers": 4, "batch_size": 64, "features_col": "features",
              "label_col": "label_encoded", "num_epoch": 3, "communication_window": 7}),
    "EAMSGD": ([4, 64, "features", "label_encoded", 3, 7, 2.0, 0.05, 0.5],
               {"num_workers": 4, "batch_size": 64, "num_epoch": 3,
                "communication_window": 7, "rho": 2.0, "learning_rate": 0.05,
                "momentum": 0.5}),
}


@pytest.mark.parametrize("name", sorted(DIST_KERAS_POSITIONAL))
def test_positional_arguments_follow_dist_keras_order(name):
    positional, expected = DIST_KERAS_POSITIONAL[name]
    trainer = getattr(trainers, name)(build_mlp(), "adam", "categorical_crossentropy",
                                      ["accuracy"], *positional)
    assert {key: getattr(trainer, key) for key in expected} == expected
    assert trainer.loss_weights is None
    trainer.validate_arguments()


@pytest.mark.parametrize("trainer_name", ["SingleTrainer", "DOWNPOUR"])
def test_weights_excluded_from_weight_decay_are_not_decayed_as_in_fit(trainer_name, spark):
    """``AdamW.exclude_from_weight_decay()`` is no part of the optimizer's config: the
    workers' optimizers, rebuilt from it, decayed the excluded biases and kernel."""
    import keras
    import numpy as np

    rng = np.random.default_rng(7)
    x = rng.normal(size=(160, 8)).astype("float32")
    y = (x[:, :2].sum(axis=1) > 0).astype("int64")
    frame = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)],
                                  "features array<float>, label long").coalesce(1)

    def model():
        keras.utils.set_random_seed(5)
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(6, activation="relu"),
                                 keras.layers.Dense(2, activation="softmax")])

    def optimizer(for_model):
        adamw = keras.optimizers.AdamW(0.05, weight_decay=0.9)
        adamw.exclude_from_weight_decay(var_list=[for_model.layers[1].kernel],
                                        var_names=["bias"])
        return adamw

    reference = model()
    reference.compile(optimizer(reference), "sparse_categorical_crossentropy")
    reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    given = model()
    extra = {} if trainer_name == "SingleTrainer" else {"num_workers": 1}
    trained = getattr(trainers, trainer_name)(
        given, optimizer(given), "sparse_categorical_crossentropy", metrics=[],
        **extra).train(frame, verbose=0)

    for mine, theirs in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-5, atol=1e-6)
    # The returned model's optimizer goes on excluding them.
    assert [trained.optimizer._use_weight_decay(variable)
            for variable in trained.trainable_variables] == [True, False, False, False]


def test_a_compiled_models_metrics_keep_the_arguments_their_configs_leave_out(spark):
    """A compiled model lends its metrics; taken from its compile config, Keras's config of
    ``CosineSimilarity(axis=0)`` had lost the axis: the workers and the returned model
    measured along the last axis instead, silently."""
    import keras
    import numpy as np

    rng = np.random.default_rng(8)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = rng.normal(size=(64, 3)).astype("float32")
    frame = spark.createDataFrame([(row.tolist(), label.tolist()) for row, label in zip(x, y)],
                                  "features array<float>, label array<float>").coalesce(1)

    def along_axis_0(model):
        metric = keras.metrics.CosineSimilarity(axis=0)
        metric.update_state(y, model.predict(x, verbose=0))
        return float(metric.result())

    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    model.compile("sgd", "mse", metrics=[keras.metrics.CosineSimilarity(axis=0, name="cos")],
                  weighted_metrics=[keras.metrics.CosineSimilarity(axis=0, name="wcos")])
    before = along_axis_0(model)
    trainer = trainers.SingleTrainer(model, batch_size=64)  # one step, on the first weights
    trained = trainer.train(frame, verbose=0)

    (record,) = trainer.get_history()
    assert record["cos"] == pytest.approx(before, abs=1e-5)
    assert record["wcos"] == pytest.approx(before, abs=1e-5)
    logs = trained.evaluate(x, y, batch_size=64, verbose=0, return_dict=True)
    assert logs["cos"] == pytest.approx(along_axis_0(trained), abs=1e-5)
