"""The parameter server inside the Spark job (``parameter_server_location="executor"``): real
barrier stages on the tests' local Spark, real sockets, the trainers' own paths."""

import os
import re

import numpy as np
import pytest
from conftest import accuracy, build_mlp

from distkeras import trainers
from distkeras.errors import TrainingError
from distkeras.training.asynchronous import AsynchronousDistributedTrainer
from distkeras.training.checkpoints import load_checkpoint
from distkeras.session import concurrent_task_slots
from distkeras.training.server_placement import check_slots, resolve_location
from distkeras.workers import ADAGWorker

EXECUTOR = {"parameter_server_location": "executor"}


def _algorithm_trainers():
    return [getattr(trainers, name) for name in trainers.__all__
            if isinstance(getattr(trainers, name), type)
            and issubclass(getattr(trainers, name), AsynchronousDistributedTrainer)
            and getattr(trainers, name).algorithm is not None]


def test_every_parameter_server_trainer_takes_the_location():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    classes = _algorithm_trainers()
    assert {cls.__name__ for cls in classes} >= {"ADAG", "DOWNPOUR", "AEASGD", "EAMSGD",
                                                 "DynSGD", "DiLoCo", "FedAdam"}
    for cls in classes:
        for location in ("driver", "executor", None):
            trainer = cls(model, "sgd", "mse", parameter_server_location=location)
            assert trainer.settings().parameter_server_location == location
            config = trainer.get_config()
            assert config.get("parameter_server_location") == location
            again = cls.from_config(config, keras_model=model)
            assert again.parameter_server_location == location
        with pytest.raises(ValueError, match="parameter_server_location.*'driver'.*"
                                             "'executor'.*Received: 'cluster'"):
            cls(model, "sgd", "mse", parameter_server_location="cluster").settings()


def test_a_classic_session_keeps_the_server_on_the_driver(fashion_train):
    assert resolve_location(None, fashion_train) == "driver"
    assert resolve_location("executor", fashion_train) == "executor"
    assert resolve_location("driver", fashion_train) == "driver"


def test_too_few_slots_for_the_barrier_stage_is_refused_before_the_job(spark,
                                                                       fashion_train):
    slots = concurrent_task_slots(spark)
    assert slots == 2  # the tests' local[2,4]
    with pytest.raises(ValueError, match=r"its 3 tasks .* this Spark runs 2 tasks at once"
                                         r".*num_workers <= 2"):
        check_slots(spark, 3, "ADAG")
    trainer = trainers.ADAG(build_mlp(), "adam", "categorical_crossentropy", num_workers=3,
                            **EXECUTOR)
    with pytest.raises(ValueError, match="3 tasks"):
        trainer.train(fashion_train.limit(600), verbose=0)
    assert trainer.get_history() == []


@pytest.mark.parametrize("name", ["ADAG", "AEASGD"])
def test_trains_with_the_server_in_the_job(fashion_train, fashion_test, capsys, name):
    trainer = getattr(trainers, name)(build_mlp(), "adam", "categorical_crossentropy",
                                      num_workers=2, batch_size=32, **EXECUTOR)
    model = trainer.train(fashion_train.limit(3000), verbose=2)
    assert accuracy(model, fashion_test) > 0.6
    # No live progress: the line it would have ended with, once the job has ended.
    assert re.search(rf"^{name}: 3000/3000 samples, \d+ s, commits/s=[\d.]+, loss=[\d.]+ "
                     r"\(the server ran in the job", capsys.readouterr().err, re.M)
    history = trainer.get_history()
    assert {record["worker_id"] for record in history} == {0, 1}
    assert sum(record["batch_size"] for record in history) == 3000
    assert trainer.num_updates() > 0
    assert trainer.parameter_server.num_updates == trainer.num_updates()
    assert len(trainer.get_staleness()) == trainer.num_updates()
    # The returned model holds the center the job's server reached.
    for returned, center in zip(model.get_weights(),
                                trainer.parameter_server.center_variable):
        assert (returned == center).all()


def test_validation_and_callbacks_run_on_each_epochs_center(fashion_train, fashion_test):
    import keras

    seen = []
    callback = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: seen.append((epoch, sorted(logs))))
    trainer = trainers.DOWNPOUR(build_mlp(), "adam", "categorical_crossentropy",
                                num_workers=2, num_epoch=3, metrics=["accuracy"], **EXECUTOR)
    images, labels = fashion_test
    trainer.train(fashion_train.limit(2000), verbose=0,
                  validation_data=(images, np.eye(10, dtype="float32")[labels]),
                  callbacks=[callback])
    records = trainer.get_validation_history()
    assert [record["epoch"] for record in records] == [1, 2, 3]
    # Each epoch's center, not the last one three times.
    assert len({record["val_loss"] for record in records}) == 3
    # The samples the center held as each epoch ended (a worker ahead has trained on).
    samples = [record["samples"] for record in records]
    assert 2000 <= samples[0] < samples[1] < samples[2] == 6000
    assert [epoch for epoch, _ in seen] == [0, 1, 2]
    assert "val_loss" in seen[0][1] and "loss" in seen[0][1]


def test_learning_rate_callbacks_are_refused_with_the_server_in_the_job(fashion_train):
    import keras

    trainer = trainers.ADAG(build_mlp(), "adam", "categorical_crossentropy", **EXECUTOR)
    with pytest.raises(ValueError, match="ReduceLROnPlateau"):
        trainer.train(fashion_train.limit(600), verbose=0,
                      callbacks=[keras.callbacks.ReduceLROnPlateau()])


def test_checkpoints_are_written_by_the_server_and_resumed(fashion_train, tmp_path):
    folder = str(tmp_path / "checkpoints")
    trainer = trainers.DOWNPOUR(build_mlp(), "adam", "categorical_crossentropy",
                                num_workers=2, **EXECUTOR)
    model = trainer.train(fashion_train.limit(1000), verbose=0, checkpoint_dir=folder)
    first = trainer.num_updates()
    weight_spec = trainer.parameter_server.center.weight_spec
    checkpoint = load_checkpoint(folder, weight_spec)
    assert checkpoint["num_updates"] == first
    for saved, returned in zip(checkpoint["center"], model.get_weights()):
        assert (saved == returned).all()
    trainer.train(fashion_train.limit(1000), verbose=0, checkpoint_dir=folder, resume=True)
    assert trainer.num_updates() > first  # counted on from the checkpoint's
    assert load_checkpoint(folder, weight_spec)["num_updates"] == trainer.num_updates()


def test_a_checkpoint_folder_executors_cannot_write_is_refused(fashion_train):
    trainer = trainers.ADAG(build_mlp(), "adam", "categorical_crossentropy", **EXECUTOR)
    with pytest.raises(ValueError, match="hdfs://nn/ckpt.*shared file system"):
        trainer.train(fashion_train.limit(600), verbose=0, checkpoint_dir="hdfs://nn/ckpt")


class DyingOnceWorker(ADAGWorker):
    """Its process dies mid-training the first time (a lost executor); ``marker``: the file
    that says it has died once."""

    marker = None

    def communicate(self):
        if self.worker_id == 1 and self.iteration >= 24 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os._exit(17)  # no cleanup, no goodbye: like a killed Python worker
        super().communicate()


class DyingOnceADAG(trainers.ADAG):
    def allocate_worker(self):
        return DyingOnceWorker(self.master_model)


def test_a_lost_worker_restarts_the_stage_from_the_checkpoint(fashion_train, fashion_test,
                                                              tmp_path):
    folder = str(tmp_path / "checkpoints")
    DyingOnceWorker.marker = str(tmp_path / "died")
    trainer = DyingOnceADAG(build_mlp(), "adam", "categorical_crossentropy", num_workers=2,
                            communication_window=4, **EXECUTOR)
    model = trainer.train(fashion_train.limit(3000), verbose=0, checkpoint_dir=folder,
                          checkpoint_every=0.2)
    assert os.path.exists(DyingOnceWorker.marker)
    assert accuracy(model, fashion_test) > 0.6
    # The retried stage trained every partition again, on from the checkpoint's center: its
    # update count goes on from the failed attempt's.
    history = trainer.get_history()
    assert sum(record["batch_size"] for record in history) == 3000
    assert trainer.num_updates() > len(trainer.get_staleness())
    assert load_checkpoint(folder, trainer.parameter_server.center.weight_spec)[
        "num_updates"] == trainer.num_updates()


class FailingWorker(ADAGWorker):
    def communicate(self):
        if self.worker_id == 1:
            raise ValueError("disk full on this executor")
        super().communicate()


class FailingADAG(trainers.ADAG):
    def allocate_worker(self):
        return FailingWorker(self.master_model)


def test_a_failing_worker_fails_the_training_without_hanging(fashion_train):
    trainer = FailingADAG(build_mlp(), "adam", "categorical_crossentropy", num_workers=2,
                          **EXECUTOR)
    with pytest.raises(TrainingError, match="disk full on this executor"):
        trainer.train(fashion_train.limit(600), verbose=0)


class SleepyWorker(ADAGWorker):
    """Worker 1 commits once, then hangs (stuck on I/O, a deadlock)."""

    def communicate(self):
        import time

        super().communicate()
        if self.worker_id == 1:
            time.sleep(600)


class SleepyADAG(trainers.ADAG):
    def allocate_worker(self):
        return SleepyWorker(self.master_model)


def test_a_stalled_worker_is_named_by_the_servers_task(fashion_train):
    trainer = SleepyADAG(build_mlp(), "adam", "categorical_crossentropy", num_workers=2,
                         worker_timeout=3, **EXECUTOR)
    with pytest.raises(TrainingError, match=r"TrainingError: The parameter server stopped the training: "
                                            r"worker 1 sent nothing for \d+ s "
                                            r"\(worker_timeout=3\)"):
        trainer.train(fashion_train.limit(400), verbose=0)


def test_rows_no_retry_gets_past_end_the_training_once_with_their_column_named(spark):
    import keras

    # Its worker stops at the NaN label and tells the server, whose task stops waiting for
    # its goodbye: the stage ends once (no retry), and train() raises the worker's error.
    rows = [([float(index % 5)] * 3, float("nan") if index == 170 else float(index % 4))
            for index in range(200)]
    frame = spark.createDataFrame(rows, "features array<double>, target double")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    trainer = trainers.DOWNPOUR(model, "adam", "mse", metrics=[], label_col="target",
                                num_workers=2, **EXECUTOR)
    with pytest.raises(TrainingError, match="Column 'target' holds 1 NaN or infinite values"):
        trainer.train(frame.coalesce(2), verbose=0)
