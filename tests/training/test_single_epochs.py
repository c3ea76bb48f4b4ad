"""SingleTrainer's epochs in one Spark task when the driver validates or calls back: the
`EpochServer` over real loopback sockets, and the trainer on the shared local Spark
session against its task-per-epoch path."""

import os

import numpy as np
import pytest

from conftest import build_mlp
from ps_support import Client, assert_weights_equal, expect_closed_by_server, layers
from test_validation import _frame

from distkeras.training import launch


# -- the server ----------------------------------------------------------------------------


def _state(iterations, rate):
    """An optimizer state: a step count, a learning rate and one moment per layer."""
    return [np.array(iterations, dtype=np.int64), np.array(rate, dtype=np.float32),
            np.full((3, 2), 0.5, dtype=np.float32), np.full((2,), -0.5, dtype=np.float32)]


@pytest.fixture
def epoch_server():
    from distkeras.transport.epoch_servers import EpochServer
    from ps_support import make_model

    ends = []

    def on_epoch_end(epochs_done, weights, optimizer_state):
        ends.append((epochs_done, [np.array(layer) for layer in weights],
                     [np.array(value) for value in optimizer_state]))
        halved = list(optimizer_state)
        halved[1] = np.array(float(optimizer_state[1]) / 2, dtype=np.float32)  # a callback
        return epochs_done >= 2, halved

    server = EpochServer(make_model(), _state(0, 0.1), on_epoch_end=on_epoch_end)
    server.start()
    yield server, ends
    server.stop()


def _recv(client):
    from distkeras.networking import recv_data

    return recv_data(client.sock)


def test_the_epoch_server_hands_the_driver_the_epoch_and_the_worker_its_state(epoch_server):
    from distkeras.transport.networking import weights_array

    server, ends = epoch_server
    client = Client(server, 0)
    first = client.pull()
    assert first["epochs_done"] == 0 and first["stop"] is False
    assert_weights_equal(first["optimizer_state"], _state(0, 0.1))

    client.commit(layers(1.0, 2.0), epoch=0, samples=64,
                  optimizer_state=weights_array(_state(2, 0.1)))
    reply = _recv(client)
    assert reply["epochs_done"] == 1 and reply["stop"] is False
    assert_weights_equal(reply["center"], layers(1.0, 2.0))  # one worker: its own weights
    assert_weights_equal(reply["optimizer_state"], _state(2, 0.05))  # as the driver set it
    assert ends[0][0] == 1
    assert_weights_equal(ends[0][2], _state(2, 0.1))

    client.commit(layers(3.0, 4.0), epoch=1, samples=64,
                  optimizer_state=weights_array(_state(4, 0.05)))
    reply = _recv(client)
    assert reply["stop"] is True and reply["epochs_done"] == 2
    # A restarted task joins where the last epoch ended, with its optimizer state.
    rejoined = Client(server, 0).pull()
    assert rejoined["epochs_done"] == 2
    assert_weights_equal(rejoined["center"], layers(3.0, 4.0))
    assert_weights_equal(rejoined["optimizer_state"], _state(4, 0.025))


@pytest.mark.parametrize("state", [
    None,  # no state at all
    _state(2, 0.1)[:3],  # a value short
    [np.array(2, dtype=np.int64), np.array(0.1, dtype=np.float32),
     np.zeros((2, 3), np.float32), np.zeros((2,), np.float32)],  # a moment of another shape
])
def test_an_epoch_commit_without_a_matching_optimizer_state_is_refused(epoch_server, state):
    from distkeras.transport.networking import weights_array

    server, ends = epoch_server
    before = [np.array(layer) for layer in server.center_variable]
    client = Client(server, 0)
    extra = {} if state is None else {"optimizer_state": weights_array(state)}
    client.commit(layers(1.0, 2.0), epoch=0, samples=64, **extra)
    expect_closed_by_server(client.sock)
    assert ends == [] and server.barrier.epochs_done == 0
    assert_weights_equal(server.center_variable, before)
    assert_weights_equal(server.optimizer_state, _state(0, 0.1))


# -- the trainer on Spark ------------------------------------------------------------------


class _Recorder:
    """A Keras callback (made on first use) that keeps each epoch's end: the weights, the
    learning rate and the step count the driver's model holds."""

    def __new__(cls):
        import keras

        class Recorder(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.weights, self.rates, self.steps = [], [], []

            def on_epoch_end(self, epoch, logs=None):
                self.weights.append(self.model.get_weights())
                self.rates.append(float(np.asarray(self.model.optimizer.learning_rate)))
                self.steps.append(int(np.asarray(self.model.optimizer.iterations)))

        return Recorder()


def _train(frame, validation, one_task=True, worker_class=None, num_epoch=3):
    import keras

    from distkeras import workers
    from distkeras.trainers import SingleTrainer

    class PerEpoch(SingleTrainer):
        def allocate_worker(self):  # a worker of its own: one task per epoch
            return workers.SequentialWorker(self.master_model)

    class WithWorker(SingleTrainer):
        def allocate_epoch_worker(self):
            return worker_class(self.master_model)

    cls = SingleTrainer if one_task and worker_class is None else \
        WithWorker if one_task else PerEpoch
    keras.utils.set_random_seed(5)
    trainer = cls(build_mlp(32), "adam", "categorical_crossentropy", num_epoch=num_epoch)
    recorder = _Recorder()
    halve = keras.callbacks.LearningRateScheduler(lambda epoch, rate: 0.002 / 2 ** epoch)
    model = trainer.train(frame, verbose=0, validation_data=validation,
                          callbacks=[halve, recorder])
    return trainer, model, recorder


def test_one_task_trains_and_validates_as_a_task_per_epoch_does(spark, fashion_test):
    images, labels = fashion_test
    frame = _frame(spark, images[:960], labels[:960]).cache()
    validation = _frame(spark, images[1000:1300], labels[1000:1300])
    trainer, model, seen = _train(frame, validation)
    reference_trainer, reference, reference_seen = _train(frame, validation, one_task=False)

    from distkeras.transport.epoch_servers import EpochServer

    assert isinstance(trainer.parameter_server, EpochServer)
    assert trainer.parameter_server.barrier.epochs_done == 3
    assert reference_trainer.parameter_server is None
    # Same rows, the optimizer going on from epoch to epoch, the callback's learning rates
    # applied to the next epoch: the very same training.
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(seen.weights, reference_seen.weights):
        for layer, reference_layer in zip(got, want):
            np.testing.assert_array_equal(layer, reference_layer)
    assert seen.rates == pytest.approx([0.002, 0.001, 0.0005])
    assert seen.steps == reference_seen.steps == [30, 60, 90]
    got = [(r["epoch"], r["samples"], r["val_loss"]) for r in trainer.get_validation_history()]
    want = [(r["epoch"], r["samples"], r["val_loss"])
            for r in reference_trainer.get_validation_history()]
    assert got == want and [epoch for epoch, _, _ in got] == [1, 2, 3]
    history = trainer.get_history()
    assert [record["iteration"] for record in history] == list(range(1, 91))
    assert [record["epoch"] for record in history] == [0] * 30 + [1] * 30 + [2] * 30
    # The returned model's optimizer holds the trained state, as after `fit`.
    assert int(np.asarray(model.optimizer.iterations)) == 90


def test_a_lost_task_goes_on_from_the_last_epochs_end(spark, fashion_test, tmp_path):
    from distkeras.executor import averaging

    marker = str(tmp_path / "died")

    class DyingWorker(averaging.SequentialEpochWorker):
        def train_steps(self, batches):
            # Dies once, in the second epoch: Spark retries the task (local[2,4]).
            ends = self._feed.epoch_ends
            if ends and self._taken > ends[0] and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(17)  # no cleanup, no goodbye: like a killed Python worker
            super().train_steps(batches)

    images, labels = fashion_test
    frame = _frame(spark, images[:960], labels[:960]).cache()
    validation = _frame(spark, images[1000:1300], labels[1000:1300])
    trainer, model, seen = _train(frame, validation, worker_class=DyingWorker)
    _, reference, _ = _train(frame, validation)

    assert os.path.exists(marker)
    assert trainer.parameter_server.barrier.epochs_done == 3
    # The retried task skipped epoch 1 and started epoch 2 from its end, optimizer
    # state included: the same weights as a run that never failed.
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(got, want)
    assert seen.steps == [30, 60, 90]
    # The lost task's steps in the epoch it did not finish are dropped: each epoch's
    # steps counted once, numbered on.
    records = trainer.get_validation_history()
    assert [(r["epoch"], r["samples"]) for r in records] == [(1, 960), (2, 1920), (3, 2880)]
    history = trainer.get_history()
    assert [record["iteration"] for record in history] == list(range(1, 91))
    assert [record["epoch"] for record in history] == [0] * 30 + [1] * 30 + [2] * 30


def test_the_epochs_logs_and_the_returned_optimizer_are_fits(spark, fashion_test):
    # 200 rows in batches of 32: each epoch ends on a batch of 8, which fit's logs weigh
    # for its rows. ReduceLROnPlateau lowers the rate at the last epoch's end: the returned
    # model goes on at that rate, as after fit.
    import keras

    from distkeras.trainers import SingleTrainer

    images, labels = fashion_test
    x, y = images[:200], np.eye(10, dtype=np.float32)[labels[:200]]
    validation = (images[1000:1200], np.eye(10, dtype=np.float32)[labels[1000:1200]])
    frame = _frame(spark, images[:200], labels[:200]).coalesce(1).cache()

    def run(train):
        keras.utils.set_random_seed(5)
        model, recorder = build_mlp(16), _Recorder()
        logs = keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, log: seen.append(log))
        seen = []
        reduce = keras.callbacks.ReduceLROnPlateau(factor=0.5, patience=0, min_delta=100.0)
        return train(model, [reduce, recorder, logs]), recorder, seen

    def fit(model, callbacks):
        model.compile(keras.optimizers.Adam(0.004), "categorical_crossentropy",
                      metrics=["accuracy"])
        model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                  validation_data=validation, callbacks=callbacks)
        return model

    def train(model, callbacks):
        trainer = SingleTrainer(model, keras.optimizers.Adam(0.004), "categorical_crossentropy",
                                metrics=["accuracy"], num_epoch=2)
        return trainer.train(frame, verbose=0, validation_data=validation,
                             callbacks=callbacks)

    reference, reference_seen, reference_logs = run(fit)
    model, seen, logs = run(train)
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(logs, reference_logs):
        for name in ("loss", "accuracy", "val_loss", "val_accuracy", "learning_rate"):
            assert got[name] == pytest.approx(want[name], rel=1e-5), name
    assert seen.rates == reference_seen.rates == pytest.approx([0.004, 0.002])
    assert float(np.asarray(model.optimizer.learning_rate)) == pytest.approx(0.002)
    for got, want in zip(model.optimizer.variables, reference.optimizer.variables):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6)


def test_a_task_per_epoch_retried_numbers_its_steps_on(spark, fashion_test, monkeypatch):
    """Each epoch a Spark task of its own (no spare slot for a callback of the user's own),
    and the first's first attempt fails mid-epoch: the second epoch's steps were numbered
    from the count of records, the failed attempt's superseded ones included (a gap in
    the iterations of get_history and get_averaged_history)."""
    from pyspark import TaskContext

    from distkeras import trainers, workers

    class FailingOnceWorker(workers.SequentialWorker):
        STEPS_PER_CALL = 4

        def train_steps(self, batches):
            if TaskContext.get().attemptNumber() == 0 and self.iteration >= 9:
                raise RuntimeError("flaky executor")
            super().train_steps(batches)

    class FailingOnceSingle(trainers.SingleTrainer):
        def allocate_worker(self):
            return FailingOnceWorker(self.master_model)

    monkeypatch.setattr(launch, "slots_for_one_job", lambda *args: False)
    images, labels = fashion_test
    frame = _frame(spark, images[:320], labels[:320])
    trainer = FailingOnceSingle(build_mlp(16), "adam", "categorical_crossentropy",
                                num_epoch=2, batch_size=16)
    trainer.train(frame, verbose=1, validation_data=(images[400:500],
                                                     np.eye(10)[labels[400:500]]))

    history = trainer.get_history()
    assert any(record.get("superseded") for record in history)
    steps = trainer.get_executor_history(0)
    assert [record["iteration"] for record in steps] == list(range(1, 41))
    assert [record["epoch"] for record in steps] == [0] * 20 + [1] * 20
    assert list(trainer.get_averaged_history()["iteration"]) == list(range(1, 41))


def _counted_rows(spark, frame):
    """``frame`` behind a Python filter that counts the rows it computes (as a
    nondeterministic upstream would give other rows each time it runs)."""
    from pyspark.sql import functions as F

    computed = spark.sparkContext.accumulator(0)

    def keep(_):
        computed.add(1)
        return True

    return frame.filter(F.udf(keep, "boolean")(F.lit(1))), computed


def test_a_job_per_epoch_computes_the_rows_once(spark, fashion_test):
    # Each epoch's job computed the DataFrame again (a nondeterministic upstream gave each
    # epoch other rows), where the one-job paths read it once and replay it.
    import keras

    from distkeras.trainers import AveragingTrainer, SingleTrainer

    images, labels = fashion_test
    base = _frame(spark, images[:400], labels[:400]).cache()
    validation = _frame(spark, images[1000:1100], labels[1000:1100])

    class PerEpoch(SingleTrainer):  # a custom worker: a task per epoch
        def allocate_worker(self):
            return super().allocate_worker()

    frame, computed = _counted_rows(spark, base)
    keras.utils.set_random_seed(1)
    PerEpoch(build_mlp(16), "adam", "categorical_crossentropy", num_epoch=3).train(
        frame, verbose=0, validation_data=validation)
    # One pass before the training (its checks and count), one for all three epochs.
    assert computed.value == 2 * 400
    # 4 workers on local[2,4]'s two slots: a job per epoch.
    frame, computed = _counted_rows(spark, base)
    AveragingTrainer(build_mlp(16), "adam", "categorical_crossentropy", num_workers=4,
                     num_epoch=3).train(frame, verbose=0)
    assert computed.value == 400
    assert not frame.is_cached  # unpersisted after the training


def test_a_frame_read_from_the_users_cache_is_not_copied_to_disk(spark, fashion_test):
    # The training frame is a select of the user's DataFrame, a new object whose
    # is_cached is False: a frame the user cached was written to disk again.
    from pyspark import StorageLevel
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    from distkeras.data import frame_layout

    images, labels = fashion_test
    base = _frame(spark, images[:50], labels[:50])
    # Vectors as VectorAssembler makes them: the training frame converts them.
    base = base.withColumn("features", array_to_vector("features")).cache()
    frame = frame_layout.training_frame(base, "features", "label")
    with frame_layout.kept_for_epochs(frame, 3):
        assert frame.storageLevel != StorageLevel.DISK_ONLY
    # Rows drawn anew at each read are still kept: rand(), and a Python UDF.
    for drawn in (frame.where(F.rand() < 0.9),
                  frame.where(F.udf(lambda _: True, "boolean")(F.lit(1)))):
        with frame_layout.kept_for_epochs(drawn, 3):
            assert drawn.storageLevel == StorageLevel.DISK_ONLY
        assert drawn.storageLevel != StorageLevel.DISK_ONLY
    base.unpersist()
