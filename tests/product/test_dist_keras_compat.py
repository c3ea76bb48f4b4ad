"""A script written for the original dist-keras: its trainer setters and utils run here."""

import logging
import os

import numpy as np
import pytest

from conftest import accuracy, build_mlp


def test_setters_store_what_the_getters_and_the_config_read(spark):
    # spark: started before Keras (JAX) is imported, as in every test that builds a model.
    from distkeras.trainers import ADAG, AEASGD, SingleTrainer

    trainer = ADAG(build_mlp(), "adam", "categorical_crossentropy")
    trainer.set_minibatch_size(20)
    trainer.set_num_epoch(3)
    trainer.set_num_workers(4)
    trainer.set_parallelism_factor(2)
    trainer.set_learning_rate(0.5)
    assert (trainer.get_minibatch_size(), trainer.get_num_epoch(), trainer.get_num_workers(),
            trainer.get_parallelism_factor(), trainer.get_learning_rate()) == (20, 3, 4, 2, 0.5)
    config = trainer.get_config()
    assert (config["batch_size"], config["num_epoch"], config["num_workers"],
            config["parallelism_factor"], config["learning_rate"]) == (20, 3, 4, 2, 0.5)
    assert trainer.num_partitions() == 8
    assert (trainer.get_features_column(), trainer.get_label_column()) == ("features", "label")
    assert trainer.num_updates() == 0 and not trainer.has_history()
    assert AEASGD(build_mlp(), "sgd", "mse").get_learning_rate() == 0.1
    replacement = build_mlp(16)
    single = SingleTrainer(build_mlp(), "adam", "categorical_crossentropy")
    single.set_model(replacement)
    assert single.master_model is replacement
    assert not hasattr(single, "set_parallelism_factor")  # one replica: nothing to set


def test_a_bad_value_given_to_a_setter_is_refused_by_train_with_its_name(fashion_train):
    from distkeras.trainers import DOWNPOUR

    trainer = DOWNPOUR(build_mlp(), "adam", "categorical_crossentropy")
    trainer.set_parallelism_factor(0)
    with pytest.raises(ValueError, match="parallelism_factor"):
        trainer.train(fashion_train.limit(100), verbose=0)


def test_a_dist_keras_script_trains_as_written(fashion_train, fashion_test, caplog):
    """The original's way: shuffle and precache the data, configure with setters."""
    from distkeras.trainers import ADAG
    from distkeras.utils import (deserialize_keras_model, precache, serialize_keras_model,
                                 shuffle)

    dataset = precache(shuffle(fashion_train.limit(2000), seed=1), 2)
    assert dataset.rdd.getNumPartitions() == 2 and dataset.is_cached
    trainer = ADAG(keras_model=build_mlp(), worker_optimizer="adam",
                   loss="categorical_crossentropy", num_workers=2, batch_size=32,
                   communication_window=5, num_epoch=1, features_col="features",
                   label_col="label")
    trainer.set_parallelism_factor(2)
    trainer.set_minibatch_size(20)
    trainer.set_num_epoch(2)
    with caplog.at_level(logging.WARNING, logger="distkeras.training.compat"):
        trainer.set_max_prefetch(100)
    assert any("no effect" in record.getMessage() for record in caplog.records)
    trained = trainer.train(dataset, verbose=0)

    history = trainer.get_history()
    assert trainer.has_history()
    assert {record["batch_size"] for record in history} == {20}
    assert sum(record["batch_size"] for record in history) == 2 * 2000  # two epochs
    # Four partitions (2 workers x parallelism 2), each a Spark task of its own.
    assert len({record["worker_id"] for record in history}) == 4
    # Every commit the server applied: one per window of 5 steps or at a partition's end.
    assert trainer.num_updates() == len(trainer.get_staleness()) >= len(history) // 5
    assert accuracy(trained, fashion_test) > 0.6
    again = deserialize_keras_model(serialize_keras_model(trained))
    assert all(np.array_equal(a, b) for a, b in zip(again.get_weights(),
                                                       trained.get_weights()))


def test_precache_refuses_a_bad_number_of_workers(spark):
    from distkeras.utils import precache

    with pytest.raises(ValueError, match="num_workers=0"):
        precache(spark.range(3), 0)


# -- dist-keras's helpers and schemes ----------------------------------------------------------


def test_dist_keras_row_helpers_build_rows_as_its_transformers_and_kafka_example_did(spark):
    from pyspark.sql import Row

    from distkeras.utils import json_to_dataframe_row, new_dataframe_row

    row = json_to_dataframe_row('{"id": 3, "features": [0.5, 1.5], "label": "s"}')
    assert row == Row(id=3, features=[0.5, 1.5], label="s") and row.__fields__[0] == "id"
    grown = new_dataframe_row(row, "label_index", 1.0)
    assert grown.__fields__ == ["id", "features", "label", "label_index"]
    assert grown.label_index == 1.0 and grown.features == [0.5, 1.5]
    frame = spark.createDataFrame([grown, new_dataframe_row(row, "label_index", 0.0)])
    assert frame.columns == grown.__fields__ and frame.count() == 2
    with pytest.raises(ValueError, match="already has a field 'label'"):
        new_dataframe_row(row, "label", 1)
    with pytest.raises(ValueError, match="one object"):
        json_to_dataframe_row("[1, 2]")


def test_dist_keras_value_helpers():
    from distkeras.utils import (get_os_username, pickle_object, to_one_hot_encoded_dense,
                                 unpickle_object)

    import getpass

    assert get_os_username() == getpass.getuser()
    np.testing.assert_array_equal(to_one_hot_encoded_dense(2.0, 4), [0, 0, 1, 0])
    np.testing.assert_array_equal(to_one_hot_encoded_dense(0), [1, 0])
    for bad in (4, -1, 1.5):
        with pytest.raises(ValueError, match="class index in \\[0, 3\\]"):
            to_one_hot_encoded_dense(bad, 4)
    value = {"weights": [np.arange(3.0)], "name": "m"}
    again = unpickle_object(pickle_object(value))
    assert again["name"] == "m" and np.array_equal(again["weights"][0], np.arange(3.0))


def test_no_network_path_uses_the_pickle_helpers():
    import pathlib

    import distkeras

    package = pathlib.Path(distkeras.__file__).parent
    users = [path.relative_to(package).as_posix() for path in package.rglob("*.py")
             if "pickle_object" in path.read_text() or "unpickle_object" in path.read_text()]
    # Defined by the one, named by the face of the other.
    assert sorted(users) == ["tools/legacy_utils.py", "utils.py"]


def test_set_keras_base_directory_moves_keras_home(tmp_path, monkeypatch):
    import keras
    from keras.src.backend import config

    from distkeras.utils import set_keras_base_directory

    monkeypatch.setattr(config, "_KERAS_DIR", config._KERAS_DIR)
    monkeypatch.delenv("KERAS_HOME", raising=False)
    home = set_keras_base_directory(str(tmp_path))
    assert home == str(tmp_path / ".keras") == os.environ["KERAS_HOME"]
    assert config.keras_home() == home
    assert keras.config.backend()  # Keras still works


def test_uniform_weights_fills_every_weight_from_the_range(spark):
    from distkeras.utils import uniform_weights

    import keras

    model = keras.Sequential([keras.Input((5, 5, 1)), keras.layers.Conv2D(2, 3),
                              keras.layers.Flatten(), keras.layers.Dense(3)])
    np.random.seed(0)
    uniform_weights(model, [-0.1, 0.2])
    first = model.get_weights()
    assert all(w.min() >= -0.1 and w.max() <= 0.2 and w.std() > 0 for w in first)
    np.random.seed(0)
    uniform_weights(model, (-0.1, 0.2))
    assert all(np.array_equal(a, b) for a, b in zip(first, model.get_weights()))
    with pytest.raises(ValueError, match="low < high"):
        uniform_weights(model, [1, 0])


def test_history_helpers_read_a_trainers_records():
    from distkeras.utils import history_executor, history_executors_average

    history = [{"worker_id": w, "iteration": i, "loss": float(w + i), "timestamp": 0.0}
               for i in (2, 1) for w in (0, 1)]
    history.append({"worker_id": 1, "iteration": 1, "loss": 9.0, "timestamp": 0.0,
                    "superseded": True})
    assert [r["iteration"] for r in history_executor(history, 1)] == [1, 2]
    assert [r["loss"] for r in history_executor(history, 1)] == [2.0, 3.0]
    averaged = history_executors_average(history)
    np.testing.assert_allclose(averaged["loss"], [1.5, 2.5])  # both workers, step by step


def test_emperor_lowers_the_learning_rate_when_the_loss_stalls(fashion_train, fashion_test):
    import keras

    from distkeras.schemes import Emperor
    from distkeras.trainers import ADAG, SingleTrainer

    images, labels = fashion_test
    x, y = images[:300], keras.utils.to_categorical(labels[:300], 10)
    losses = []

    def evaluate_loss(model, validation_set):
        losses.append(model.evaluate(*validation_set, verbose=0)[0])
        return losses[-1]

    trainer = ADAG(build_mlp(), "adam", "categorical_crossentropy", num_workers=2,
                   learning_rate=0.01)
    # Each round one epoch; every change counts as a stall (threshold infinite).
    emperor = Emperor(trainer, evaluate_loss, num_epoch=1, evaluation_frequency=1,
                      loss_threshold=float("inf"))
    assert trainer.get_num_epoch() == 1
    model = emperor.optimize(fashion_train.limit(400), (x, y))
    assert len(losses) == 2 and trainer.get_learning_rate() == pytest.approx(1e-4)
    # The last round trained (and compiled the model) with the rate the first one lowered.
    assert float(model.optimizer.learning_rate) == pytest.approx(1e-3)
    assert trainer.master_model is model
    with pytest.raises(TypeError, match="ReduceLROnPlateau"):
        Emperor(SingleTrainer(build_mlp(), "adam", "mse"), evaluate_loss)
    with pytest.raises(ValueError, match="num_epoch >= evaluation_frequency"):
        Emperor(trainer, evaluate_loss, num_epoch=2, evaluation_frequency=3)


def test_accuracy_evaluator_names_dist_keras_defaults_when_its_own_are_missing(spark):
    from distkeras.evaluators import AccuracyEvaluator

    scored = spark.createDataFrame([(1.0, 1.0), (0.0, 1.0)], ["prediction_index", "label"])
    with pytest.raises(ValueError, match="dist-keras's default was 'label'.*label_col="):
        AccuracyEvaluator().evaluate(scored)
    # dist-keras's examples name both columns: that runs as written.
    assert AccuracyEvaluator(prediction_col="prediction_index",
                             label_col="label").evaluate(scored) == 0.5


@pytest.mark.parametrize("name", ["DOWNPOUR", "ADAG", "DynSGD"])
def test_learning_rate_is_the_worker_optimizers_on_rules_without_one(fashion_train, name):
    """dist-keras's README gives DOWNPOUR a learning_rate; it was accepted and unused."""
    from distkeras import trainers

    model = build_mlp(16)
    initial = model.get_weights()
    # Plain SGD at its own rate (0.01) moves the weights by far more than 1e-6.
    trainer = getattr(trainers, name)(model, "sgd", "categorical_crossentropy",
                                      num_workers=1, learning_rate=1e-9)
    trained = trainer.train(fashion_train.limit(128), verbose=0)
    assert float(trained.optimizer.learning_rate) == pytest.approx(1e-9)
    moved = max(float(np.abs(a - b).max()) for a, b in zip(trained.get_weights(), initial))
    assert 0 < moved < 1e-6
    assert trainer.get_learning_rate() == 1e-9 and trainer.worker_optimizer == "sgd"


def test_an_estimators_learning_rate_wins_over_the_trainers_for_its_fit(spark):
    from distkeras.ml.estimators import KerasEstimator
    from distkeras.trainers import ADAG

    trainer = ADAG(build_mlp(16), "sgd", "categorical_crossentropy", learning_rate=0.5)
    settings = KerasEstimator(trainer, learning_rate=0.05)._trainer_settings()
    saved = {name: getattr(trainer, name) for name in settings}
    for name, value in settings.items():  # as the estimator's fit sets them
        setattr(trainer, name, value)
    assert trainer._workers_optimizer()["config"]["learning_rate"] == 0.05
    for name, value in saved.items():
        setattr(trainer, name, value)
    assert trainer._workers_optimizer()["config"]["learning_rate"] == 0.5


EXECUTOR_WITHOUT_DISTKERAS = """
import sys

from pyspark.sql import SparkSession, functions as F

spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
         .config("spark.pyspark.python", sys.argv[1]).getOrCreate())
import keras

from distkeras.errors import TrainingError
from distkeras.trainers import SingleTrainer

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
rows = spark.range(4).select(F.array(F.lit(1.0), F.lit(2.0)).cast("array<float>").alias(
    "features"), F.col("id").cast("float").alias("label"))
try:
    SingleTrainer(model, "sgd", "mse").train(rows, verbose=0)
except TrainingError as error:
    print("MESSAGE", error)

from distkeras.errors import ExecutorEnvironmentError
from distkeras.predictors import ModelPredictor

try:
    ModelPredictor(model).predict(rows)
except ExecutorEnvironmentError as error:
    print("MESSAGE", error)
"""


def test_an_executor_python_without_distkeras_is_named_with_the_setting_to_change(tmp_path):
    """The executors' Python is a bare environment of this interpreter's version (no
    numpy, no distkeras), as when the driver's virtual environment is not on the PATH."""
    import subprocess
    import sys
    import venv

    venv.create(tmp_path / "bare", with_pip=False)
    script = tmp_path / "train.py"
    script.write_text(EXECUTOR_WITHOUT_DISTKERAS)
    env = {key: value for key, value in os.environ.items() if key != "PYSPARK_PYTHON"}
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "bare/bin/python")],
                            capture_output=True, text=True, env=env, timeout=300)
    messages = [line for line in result.stdout.splitlines() if line.startswith("MESSAGE")]
    assert len(messages) == 2, result.stdout[-2000:] + result.stderr[-3000:]
    for message in messages:  # the trainer's, then ModelPredictor's (before any action)
        assert "No module named" in message or "cannot import" in message
        assert "spark.pyspark.python" in message
        assert f"PYSPARK_PYTHON={sys.executable}" in message


def test_dist_keras_readme_trainer_lines_by_position_and_by_name(spark):
    """Its README's signatures, with the values of its examples; each validated as train()
    validates it first."""
    from distkeras import trainers

    m, o, loss, metrics = build_mlp(8), "adam", "categorical_crossentropy", ["accuracy"]
    lines = {
        "ADAG": ((m, o, loss, metrics, 2, 32, "features", "label", 1, 12),
                 dict(keras_model=m, worker_optimizer=o, loss=loss, metrics=metrics,
                      num_workers=2, batch_size=32, features_col="features",
                      label_col="label", num_epoch=1, communication_window=12)),
        "DynSGD": ((m, o, loss, metrics, 2, 32, "features", "label", 1, 10), None),
        "AEASGD": ((m, o, loss, metrics, 2, 32, "features", "label", 1, 32, 5.0, 0.1), None),
        "EAMSGD": ((m, o, loss, metrics, 2, 32, "features", "label", 1, 32, 5.0, 0.1, 0.9),
                   None),
        "EnsembleTrainer": ((m, o, loss, metrics, "features", "label", 32, 2), None),
        "AveragingTrainer": ((m, o, loss, metrics, "features", "label", 1, 32, 2), None),
        "DOWNPOUR": (None, dict(keras_model=m, worker_optimizer=o, loss=loss, metrics=metrics,
                                num_workers=2, batch_size=32, features_col="features",
                                label_col="label", num_epoch=1, learning_rate=0.01,
                                communication_window=5)),
    }
    for name, (positional, named) in lines.items():
        cls = getattr(trainers, name)
        for trainer in [cls(*positional)] if positional else []:
            trainer.validate_arguments()
        if named:
            trainer = cls(**named)
            trainer.validate_arguments()
    assert trainer.learning_rate == 0.01 and trainer.communication_window == 5
    # Its README's DOWNPOUR line, by position, puts the learning rate in the window.
    readme_order = trainers.DOWNPOUR(m, o, loss, metrics, 2, 32, "features", "label", 1,
                                     0.01, 5)
    with pytest.raises(ValueError, match="pass learning_rate=... by name"):
        readme_order.validate_arguments()
