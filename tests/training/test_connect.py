"""Training and predicting from a Spark Connect session (the `connect` fixture: a real
gRPC client of the shared JVM's Connect server), as from a classic one."""

import os

import numpy as np
import pytest
from conftest import build_mlp

pytestmark = pytest.mark.spark

ROWS = 400


@pytest.fixture(scope="module", autouse=True)
def connect_mode():
    """pyspark's functions (``F.col``, ...) build Spark Connect columns only where this
    variable is set, as ``SparkSession.builder.remote(...)`` sets it: set for this file's
    tests, unset again for the classic tests that this process runs next."""
    os.environ["SPARK_CONNECT_MODE_ENABLED"] = "1"
    yield
    del os.environ["SPARK_CONNECT_MODE_ENABLED"]


@pytest.fixture(scope="module")
def connect_train(connect):
    from distkeras.datasets import load_fashion_mnist

    return load_fashion_mnist(connect, "train", limit=ROWS)


@pytest.fixture(scope="module")
def train_arrays():
    from distkeras.datasets import load_fashion_mnist_numpy

    images, labels = load_fashion_mnist_numpy("train")
    return images[:ROWS].reshape(ROWS, -1).astype("float32") / 255.0, labels[:ROWS]


def _accuracy(model, arrays):
    images, labels = arrays
    return float((model.predict(images, batch_size=1000, verbose=0).argmax(1) == labels).mean())


def _epoch_ends():
    """A Keras callback that records the epochs that ended (``.ends``), with their logs."""
    import keras

    class Recorder(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.ends = []

        def on_epoch_end(self, epoch, logs=None):
            self.ends.append((epoch, dict(logs or {})))

    return Recorder()


def test_the_frame_is_a_connect_one(connect_train):
    assert type(connect_train).__module__.startswith("pyspark.sql.connect")
    assert not hasattr(connect_train.sparkSession, "_jsparkSession")


def test_single_trainer_validates_and_calls_back_under_connect(connect_train, train_arrays):
    from distkeras.trainers import SingleTrainer

    recorder = _epoch_ends()
    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy", num_epoch=2,
                            batch_size=32, label_col="label")
    model = trainer.train(connect_train, validation_data=0.2, callbacks=[recorder],
                          verbose=0)
    assert [epoch for epoch, _ in recorder.ends] == [0, 1]
    assert all("val_loss" in logs for _, logs in recorder.ends)
    assert len(trainer.get_validation_history()) == 2
    trained = sum(record["batch_size"] for record in trainer.get_history())
    assert 2 * 0.7 * ROWS < trained < 2 * 0.9 * ROWS  # 2 epochs of the 80 % drawn
    assert _accuracy(model, train_arrays) > 0.35  # ten classes: chance is 0.1


def test_averaging_and_ensemble_trainers_train_under_connect(connect_train, train_arrays):
    from distkeras.trainers import AveragingTrainer, EnsembleTrainer

    recorder = _epoch_ends()
    trainer = AveragingTrainer(build_mlp(32), "adam", "categorical_crossentropy",
                               num_workers=2, num_epoch=2, batch_size=32, label_col="label")
    model = trainer.train(connect_train, validation_data=0.2, callbacks=[recorder],
                          verbose=0)
    assert [epoch for epoch, _ in recorder.ends] == [0, 1]
    assert {record["worker_id"] for record in trainer.get_history()} == {0, 1}
    assert _accuracy(model, train_arrays) > 0.35

    members = EnsembleTrainer(build_mlp(16), "adam", "categorical_crossentropy",
                              num_ensembles=2, batch_size=32,
                              label_col="label").train(connect_train, verbose=0)
    assert len(members) == 2
    assert not np.array_equal(members[0].get_weights()[0], members[1].get_weights()[0])


def test_predictor_and_evaluators_under_connect_equal_keras(connect_train, train_arrays):
    from distkeras.evaluators import AccuracyEvaluator
    from distkeras.predictors import ModelPredictor

    model = build_mlp(16)
    predicted = ModelPredictor(model, "features").predict(connect_train.limit(200))
    rows = predicted.select("prediction", "label_index").collect()
    got = np.array([row.prediction for row in rows], dtype="float32")
    expected = model.predict(train_arrays[0][:200], verbose=0)
    np.testing.assert_allclose(got, expected, atol=1e-5)
    accuracy = AccuracyEvaluator("prediction", "label_index").evaluate(predicted)
    assert accuracy == pytest.approx(
        float((expected.argmax(1) == train_arrays[1][:200]).mean()), abs=1e-9)


def test_a_pipeline_with_the_estimator_fits_and_transforms_under_connect(connect_train,
                                                                        tmp_path):
    from pyspark.ml import Pipeline

    from distkeras.ml.estimators import KerasEstimator, KerasModel
    from distkeras.trainers import SingleTrainer

    trainer = SingleTrainer(build_mlp(16), "adam", "categorical_crossentropy",
                            batch_size=32, label_col="label")
    fitted = Pipeline(stages=[KerasEstimator(trainer, output_col="prediction")]).fit(
        connect_train)
    assert isinstance(fitted.stages[0], KerasModel)
    assert fitted.transform(connect_train.limit(10)).select("prediction").count() == 10
    with pytest.raises(ValueError, match=r"needs a classic SparkSession .* Save the Keras "
                                         r"model itself instead"):
        fitted.stages[0].write().session(connect_train.sparkSession).save(
            str(tmp_path / "stage"))
    assert not (tmp_path / "stage").exists()  # refused before anything was written


def test_a_parameter_server_trainer_runs_its_server_in_the_job_under_connect(
        connect_train, train_arrays):
    """Under Connect the server goes into the Spark job by itself (the client may be a
    place the executors cannot call back); on the driver it is refused before any job."""
    from distkeras.trainers import ADAG

    trainer = ADAG(build_mlp(32), "adam", "categorical_crossentropy", num_workers=2,
                   num_epoch=2, label_col="label")
    model = trainer.train(connect_train, verbose=0)
    assert {record["worker_id"] for record in trainer.get_history()} == {0, 1}
    assert trainer.num_updates() > 0
    assert _accuracy(model, train_arrays) > 0.35

    on_driver = ADAG(build_mlp(16), "adam", "categorical_crossentropy", num_workers=2,
                     label_col="label", parameter_server_location="driver")
    with pytest.raises(ValueError, match=r"ADAG runs a parameter server on the driver.*"
                                         r"Spark Connect session"):
        on_driver.train(connect_train, verbose=0)
    assert on_driver.get_history() == []  # refused before any worker started


def test_the_all_reduce_trainer_trains_under_connect(connect_train, train_arrays):
    from distkeras.trainers import AllReduceTrainer

    trainer = AllReduceTrainer(build_mlp(32), "adam", "categorical_crossentropy",
                               num_workers=2, num_epoch=2, batch_size=32, label_col="label")
    model = trainer.train(connect_train, verbose=0)
    assert {record["worker_id"] for record in trainer.get_history()} == {0, 1}
    assert _accuracy(model, train_arrays) > 0.35


def test_the_command_line_trains_through_a_connect_server(spark, connect_train, tmp_path):
    import subprocess
    import sys

    from distkeras import utils
    from distkeras.cli.common import CommandError, spark_session

    with pytest.raises(CommandError, match=r"--remote takes a Spark Connect address, "
                                           r"sc://host:port. Received: '127.0.0.1:15002'"):
        spark_session(None, (), "127.0.0.1:15002")
    data, model_path = str(tmp_path / "data.parquet"), str(tmp_path / "mlp.keras")
    connect_train.write.parquet(data)
    model = build_mlp(16)
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    utils.save_model(model, model_path)
    port = spark.conf.get("spark.connect.grpc.binding.port")
    command = [sys.executable, "-m", "distkeras.cli", "train", "--data", data,
               "--model", model_path, "--trainer", "SingleTrainer", "--label", "label",
               "--output", str(tmp_path / "out.keras"), "--remote", f"sc://127.0.0.1:{port}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "trained SingleTrainer" in result.stdout
    trained = utils.load_model(str(tmp_path / "out.keras"))
    assert not np.array_equal(trained.get_weights()[0], model.get_weights()[0])


def test_files_are_the_clients_and_hadoop_paths_say_they_need_classic(connect, tmp_path):
    from distkeras.data import storage

    storage.write_bytes(str(tmp_path / "a.bin"), b"abc")
    assert storage.read_bytes(f"file://{tmp_path}/a.bin") == b"abc"
    with pytest.raises(RuntimeError, match=r"hdfs://cluster/a.bin needs the cluster's Hadoop "
                                           r"filesystem, which a Spark Connect client does "
                                           r"not have"):
        storage.read_bytes("hdfs://cluster/a.bin")


def test_slots_and_parallelism_come_from_the_connect_sessions_conf(connect, spark):
    from distkeras import session

    assert session.is_connect(connect) and not session.is_connect(spark)
    assert session.master(connect) == "local[2,4]"
    assert session.concurrent_task_slots(connect) == session.concurrent_task_slots(spark) == 2
    assert session.default_parallelism(connect) == 2


def _sleeps(batches):
    import time

    for batch in batches:
        time.sleep(120)
        yield batch


def test_a_tagged_connect_job_is_cancelled_by_its_tag(connect):
    import threading
    import time

    from distkeras.training.spark_jobs import cancel_jobs, tagged_jobs

    outcome = []

    def run():
        try:
            with tagged_jobs(connect, "distkeras-test-connect-cancel"):
                connect.range(0, 1, 1, 1).mapInArrow(_sleeps, "id long").collect()
            outcome.append("finished")
        except Exception as error:  # the cancelled operation's error, whatever its class
            outcome.append(str(error))

    started = time.monotonic()
    thread = threading.Thread(target=run)
    thread.start()
    # Again each second: an operation the server has not started yet is not interrupted.
    while thread.is_alive() and time.monotonic() - started < 100:
        cancel_jobs(connect, "distkeras-test-connect-cancel")
        thread.join(timeout=1)
    assert not thread.is_alive()  # its job sleeps 120 s unless cancelled
    assert outcome and outcome[0] != "finished"
    assert "distkeras-test-connect-cancel" not in connect.getTags()
