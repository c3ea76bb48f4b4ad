"""AveragingTrainer's epochs in one Spark job: the `AveragingServer` over real loopback
sockets (golden means), and the trainer on the shared local Spark session against its
one-job-per-epoch path."""

import os
import threading
import time

import numpy as np
import pytest

from conftest import accuracy, build_mlp
from ps_support import Client, assert_weights_equal, expect_closed_by_server, layers


# -- the server ----------------------------------------------------------------------------


@pytest.fixture
def averaging_server():
    from distkeras.transport.epoch_servers import AveragingServer
    from ps_support import make_model

    ends = []

    def on_average(epochs_done, center):
        ends.append((epochs_done, [np.array(layer) for layer in center]))
        return epochs_done >= 2  # stop after the second epoch

    server = AveragingServer(make_model(), num_workers=2, on_average=on_average)
    server.start()
    yield server, ends
    server.stop()


def _commit_and_wait(client, weights, epoch, replies, samples=32):
    client.commit(weights, epoch=epoch, samples=samples)
    replies.append(_recv(client))


def _wait_until_held(server, worker_id, kernel_value, timeout=10.0):
    """Waits until the server holds ``worker_id``'s weights (their kernel all
    ``kernel_value``) for the epoch: the next commit then comes after it, however busy
    the machine."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with server.mutex:
            entry = server.barrier.entries.get(worker_id)
            if entry is not None and np.all(entry[0][0] == kernel_value):
                return
        time.sleep(0.01)
    raise AssertionError(f"worker {worker_id}'s commit never reached the server")


def _recv(client):
    from distkeras.networking import recv_data

    return recv_data(client.sock)


def test_server_answers_each_worker_with_the_mean_once_all_have_sent(averaging_server):
    server, ends = averaging_server
    first, second = Client(server, 0), Client(server, 1)
    joined = first.pull()
    assert joined["epochs_done"] == 0 and joined["stop"] is False

    replies = []
    waiting = threading.Thread(target=_commit_and_wait,
                               args=(first, layers(1.0, 2.0), 0, replies))
    waiting.start()
    waiting.join(timeout=0.5)
    assert waiting.is_alive() and ends == []  # the first waits for the second
    second.commit(layers(3.0, -4.0), epoch=0, samples=32)
    reply = _recv(second)
    waiting.join(timeout=5)

    mean = layers(2.0, -1.0)  # (1 + 3) / 2 and (2 - 4) / 2
    for answer in (reply, replies[0]):
        assert answer["epochs_done"] == 1 and answer["stop"] is False
        assert_weights_equal(answer["center"], mean)
    assert [epochs for epochs, _ in ends] == [1]
    assert_weights_equal(ends[0][1], mean)
    assert server.barrier.epochs_done == 1 and server.num_updates == 2

    # The hook asks to stop after epoch 2: both workers hear it with the mean.
    thread = threading.Thread(target=_commit_and_wait,
                              args=(first, layers(0.0, 0.0), 1, replies))
    thread.start()
    second.commit(layers(1.0, 1.0), epoch=1, samples=32)
    reply = _recv(second)
    thread.join(timeout=5)
    for answer in (reply, replies[1]):
        assert answer["stop"] is True and answer["epochs_done"] == 2
        assert_weights_equal(answer["center"], layers(0.5, 0.5))
    # A worker (re)joining later hears where the training is.
    late = Client(server, 1).pull()
    assert late["epochs_done"] == 2 and late["stop"] is True
    for client in (first, second):
        client.quit()


def test_a_restarted_workers_weights_replace_its_earlier_ones(averaging_server):
    server, ends = averaging_server
    killed = Client(server, 0)
    killed.commit(layers(9.0, 9.0), epoch=0, samples=32)  # then its task dies, waiting
    _wait_until_held(server, 0, 9.0)  # held before the restarted task's weights arrive
    killed.close()
    restarted, other = Client(server, 0), Client(server, 1)
    replies = []
    thread = threading.Thread(target=_commit_and_wait,
                              args=(restarted, layers(1.0, 1.0), 0, replies))
    thread.start()
    _wait_until_held(server, 0, 1.0)
    other.commit(layers(3.0, 3.0), epoch=0, samples=32)
    reply = _recv(other)
    thread.join(timeout=5)
    assert_weights_equal(reply["center"], layers(2.0, 2.0))
    assert len(ends) == 1


def test_a_replica_that_trained_on_no_rows_is_left_out_of_the_mean(averaging_server):
    server, ends = averaging_server
    empty, full = Client(server, 0), Client(server, 1)
    replies = []
    thread = threading.Thread(target=_commit_and_wait,
                              args=(empty, layers(0.125, -0.5), 0, replies, 0))
    thread.start()
    _wait_until_held(server, 0, 0.125)
    full.commit(layers(3.0, 3.0), epoch=0, samples=640)
    reply = _recv(full)
    thread.join(timeout=5)
    assert_weights_equal(reply["center"], layers(3.0, 3.0))
    # No replica trained: the center stays.
    thread = threading.Thread(target=_commit_and_wait,
                              args=(empty, layers(7.0, 7.0), 1, replies, 0))
    thread.start()
    _wait_until_held(server, 0, 7.0)
    full.commit(layers(5.0, 5.0), epoch=1, samples=0)
    reply = _recv(full)
    thread.join(timeout=5)
    assert_weights_equal(reply["center"], layers(3.0, 3.0))
    assert [epochs for epochs, _ in ends] == [1, 2]


def test_an_epoch_sent_ahead_of_the_others_closes_that_connection(averaging_server):
    server, ends = averaging_server
    before = [np.array(layer) for layer in server.center_variable]
    client = Client(server, 0)
    client.commit(layers(1.0, 1.0), epoch=1, samples=32)  # epoch 1 was not averaged: a confused peer
    expect_closed_by_server(client.sock)
    assert ends == [] and server.barrier.epochs_done == 0
    assert_weights_equal(server.center_variable, before)


def test_a_failing_end_of_epoch_stops_the_workers_and_is_kept():
    from distkeras.transport.epoch_servers import AveragingServer
    from ps_support import make_model

    def on_average(epochs_done, center):
        raise RuntimeError("callback broke")

    server = AveragingServer(make_model(), num_workers=1, on_average=on_average)
    server.start()
    try:
        client = Client(server, 0)
        client.commit(layers(1.0, 1.0), epoch=0, samples=32)
        reply = _recv(client)
        assert reply["stop"] is True
        assert server.transport.errors == ["RuntimeError: callback broke"]
    finally:
        server.stop()


# -- the trainer on Spark ------------------------------------------------------------------


def _train(frame, monkeypatch=None, one_job=True, **settings):
    from distkeras import session
    from distkeras.trainers import AveragingTrainer

    if not one_job:  # Spark "cannot say" how many tasks run at once: a job per epoch
        monkeypatch.setattr(session, "concurrent_task_slots", lambda spark: None)
    options = dict(num_workers=2, num_epoch=3, batch_size=32)
    options.update(settings)
    trainer = AveragingTrainer(build_mlp(32), "adam", "categorical_crossentropy", **options)
    model = trainer.train(frame, verbose=0)
    return trainer, model


def test_one_job_trains_as_one_job_per_epoch_does(spark, fashion_train, monkeypatch):
    import keras

    frame = fashion_train.limit(1300).repartition(2).cache()
    keras.utils.set_random_seed(11)
    trainer, model = _train(frame)
    keras.utils.set_random_seed(11)
    reference_trainer, reference = _train(frame, monkeypatch, one_job=False)

    assert trainer.parameter_server.barrier.epochs_done == 3
    assert reference_trainer.parameter_server is None
    # Same rows, same starts, a fresh optimizer each epoch: the same weights.
    for got, want in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    history = trainer.get_history()
    assert [sum(record["batch_size"] for record in history if record["epoch"] == epoch)
            for epoch in range(3)] == [1300, 1300, 1300]
    for worker in (0, 1):
        iterations = [record["iteration"] for record in trainer.get_executor_history(worker)]
        assert iterations == list(range(1, len(iterations) + 1))


def test_a_worker_with_no_rows_is_left_out_of_the_averages(spark, fashion_train):
    import keras
    from pyspark.sql import functions as F

    rows = fashion_train.limit(1000)
    one_sided = rows.withColumn("key", F.lit(0)).repartition(2, "key").drop("key").cache()
    assert sorted(one_sided.rdd.glom().map(len).collect()) == [0, 1000]
    keras.utils.set_random_seed(3)
    trainer, model = _train(one_sided, num_epoch=2)
    keras.utils.set_random_seed(3)
    _, alone = _train(rows.coalesce(1), num_workers=1, num_epoch=2)
    assert trainer.parameter_server.barrier.epochs_done == 2
    # The empty replica changes nothing: the result is the full partition's replica's.
    for got, want in zip(model.get_weights(), alone.get_weights()):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _trainer_with_worker(worker_class, num_epoch):
    """A 2-worker AveragingTrainer whose one job runs ``worker_class``."""
    from distkeras.trainers import AveragingTrainer

    class Trainer(AveragingTrainer):
        def allocate_averaging_worker(self):
            return worker_class(self.master_model)

    return Trainer(build_mlp(32), "adam", "categorical_crossentropy", num_workers=2,
                   num_epoch=num_epoch)


def test_a_lost_worker_restarts_the_job_from_the_last_average(spark, fashion_train,
                                                              fashion_test, tmp_path):
    from distkeras.executor import averaging

    marker = str(tmp_path / "died")

    class DyingWorker(averaging.AveragingWorker):
        def train_steps(self, batches):
            # Dies once, in the second epoch: Spark restarts the whole barrier stage.
            ends = self._feed.epoch_ends
            if self.worker_id == 1 and ends and self._taken > ends[0] \
                    and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(17)  # no cleanup, no goodbye: like a killed Python worker
            super().train_steps(batches)

    trainer = _trainer_with_worker(DyingWorker, num_epoch=3)
    model = trainer.train(fashion_train.limit(2000), verbose=0)
    assert os.path.exists(marker)
    assert trainer.parameter_server.barrier.epochs_done == 3
    history = trainer.get_history()
    # The restarted workers skipped epoch 1 (averaged before they started) and redid
    # epoch 2, whose steps from the lost tasks are marked superseded: each epoch counted
    # once.
    assert [sum(record["batch_size"] for record in history if record["epoch"] == epoch
                and not record.get("superseded")) for epoch in range(3)] == [2000] * 3
    # Superseded: the lost tasks' epoch-2 steps that reached the driver before Spark
    # restarted the stage (worker 0's, unless the restart came before its epoch's end).
    # Were they not marked, the count above would hold epoch 2 twice.
    assert {record["epoch"] for record in history if record.get("superseded")} <= {1}
    assert accuracy(model, fashion_test) > 0.6


def test_weights_with_nan_still_make_the_epochs_mean():
    """A diverged replica's weights (NaN) are averaged as one job per epoch averages them:
    refused, they got no reply and every worker waited forever."""
    from distkeras.transport.epoch_servers import AveragingServer
    from ps_support import make_model

    server = AveragingServer(make_model(), num_workers=2)
    server.start()
    try:
        first, second = Client(server, 0), Client(server, 1)
        replies = []
        thread = threading.Thread(target=_commit_and_wait,
                                  args=(first, layers(float("nan"), 1.0), 0, replies))
        thread.start()
        second.commit(layers(1.0, 3.0), epoch=0, samples=32)
        reply = _recv(second)
        thread.join(timeout=10)
        assert not thread.is_alive() and reply["epochs_done"] == 1
        assert np.isnan(np.asarray(reply["center"][0])).all()
        np.testing.assert_array_equal(reply["center"][1], np.full(2, 2.0, np.float32))
    finally:
        server.stop()


@pytest.mark.parametrize("case", ["coalesced", "one_worker"])
def test_partitions_spark_cannot_run_as_a_barrier_stage_train_a_job_per_epoch(
        spark, fashion_train, case):
    """A coalesce() (the user's, or lay_out's coalesce(1) for one worker) in the barrier
    stage's RDD chain made Spark refuse the job and stop the SparkContext."""
    from distkeras.data import frame_layout

    frame = fashion_train.limit(600).repartition(4).cache()
    if case == "coalesced":
        frame = frame.coalesce(2)
    workers = 2 if case == "coalesced" else 1
    assert not frame_layout.barrier_compatible(
        frame_layout.lay_out(frame, workers), workers)
    trainer, model = _train(frame, num_workers=workers, num_epoch=2)
    assert trainer.parameter_server is None  # one job per epoch
    assert [sum(record["batch_size"] for record in trainer.get_history()
                if record["epoch"] == epoch) for epoch in range(2)] == [600, 600]
    assert spark.range(3).count() == 3  # the session still runs


def test_partitions_as_they_are_run_as_a_barrier_stage(spark, fashion_train):
    from distkeras.data import frame_layout

    frame = fashion_train.limit(600).repartition(2).cache()
    assert frame_layout.barrier_compatible(frame, 2)


def test_a_callback_of_the_users_own_may_run_spark_jobs(spark, fashion_train):
    """Callbacks run while the one job's workers wait holding their slots: a Spark job
    started there would wait for them for ever. With a callback of the user's own and no
    spare slot, every epoch is a job of its own; Keras's callbacks keep the one job."""
    import keras

    from distkeras.trainers import AveragingTrainer

    class CountsRows(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.counts = []

        def on_epoch_end(self, epoch, logs=None):
            self.counts.append(spark.range(10).count())

    frame = fashion_train.limit(600).repartition(2).cache()
    counting = CountsRows()
    trainer = AveragingTrainer(build_mlp(32), "adam", "categorical_crossentropy",
                               num_workers=2, num_epoch=2)
    trainer.train(frame, verbose=0, callbacks=[counting])
    assert counting.counts == [10, 10] and trainer.parameter_server is None
    trainer.train(frame, verbose=0, callbacks=[keras.callbacks.EarlyStopping("loss")])
    assert trainer.parameter_server is not None


def test_a_workers_failure_report_reaches_the_driver_and_ends_its_connection():
    from distkeras.transport import networking
    from distkeras.networking import send_data
    from distkeras.transport.epoch_servers import AveragingServer
    from ps_support import make_model

    heard = []
    server = AveragingServer(make_model(), num_workers=2)
    server.sink.on_worker_failure = lambda worker_id, error: heard.append((worker_id, error))
    server.start()
    try:
        client = Client(server, 1)
        networking.send_action(client.sock, networking.ACTION_FAILURE)
        send_data(client.sock, {"error": "ValueError: row 17 is not an image"})
        expect_closed_by_server(client.sock)
        assert heard == [(1, "ValueError: row 17 is not an image")]
        assert server.sink.worker_failures == heard and server.barrier.epochs_done == 0
    finally:
        server.stop()


def test_a_worker_error_stops_the_one_job_at_once_with_its_cause(spark, fashion_train,
                                                                 tmp_path):
    from distkeras.executor import averaging
    from distkeras.trainers import TrainingError

    attempts = str(tmp_path / "attempts")

    class FailingWorker(averaging.AveragingWorker):
        def train_steps(self, batches):
            if self.worker_id == 1:  # a bad row, say: every restart would fail again
                with open(attempts, "a") as log:
                    log.write("attempt\n")
                raise ValueError("row 17 is not an image")
            super().train_steps(batches)

    trainer = _trainer_with_worker(FailingWorker, num_epoch=2)
    frame = fashion_train.limit(600).repartition(2).cache()
    with pytest.raises(TrainingError, match="partition 1 failed: ValueError: row 17 is not "
                                            "an image"):
        trainer.train(frame, verbose=0)
    # Not restarted: Spark retries a failed barrier stage whole, up to 4 times.
    with open(attempts) as log:
        assert log.read().count("attempt") == 1
    assert spark.range(3).count() == 3
