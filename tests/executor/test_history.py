"""Per-step history: compact on the worker, and any number of steps fits in one frame."""

import math

import numpy as np
from conftest import build_mlp

from distkeras.transport import networking
from distkeras.executor import step_history
from distkeras.training import launch
from distkeras.transport import history_messages


def test_long_history_travels_in_one_frame():
    log = step_history.HistoryLog()
    for step in range(50_000):  # far beyond what a JSON header may hold
        record = {"worker_id": 3, "iteration": step + 1, "timestamp": 1.5e9 + step,
                  "batch_size": 32, "loss": 1.0 / (step + 1)}
        if step % 2:
            record["accuracy"] = 0.5
        log.append(record)
    message = {"worker_id": 3, **history_messages.pack_history(log.drain())}
    decoded = networking.decode_message(networking.encode_message(message))
    records = history_messages.history_records(history_messages.unpack_history(decoded))
    assert len(records) == 50_000
    assert records[0] == {"worker_id": 3, "iteration": 1, "timestamp": 1.5e9,
                          "batch_size": 32, "loss": 1.0}
    assert records[1]["accuracy"] == 0.5 and "accuracy" not in records[2]
    assert math.isclose(records[-1]["loss"], 1.0 / 50_000)
    assert log.size == 0 and log.columns == {}


def test_empty_history_round_trips():
    decoded = networking.decode_message(networking.encode_message(
        {"worker_id": 0, **history_messages.pack_history({})}))
    assert history_messages.history_records(history_messages.unpack_history(decoded)) == []


def test_a_loss_that_became_nan_stays_nan_and_a_missing_metric_stays_missing():
    """A diverged step's loss is NaN in the history, not a record without a loss."""
    log = step_history.HistoryLog()
    log.append({"worker_id": 0, "iteration": 1, "batch_size": 32, "loss": 2.5,
                "accuracy": 0.25})
    log.append({"worker_id": 0, "iteration": 2, "batch_size": 32, "loss": float("nan")})
    decoded = networking.decode_message(networking.encode_message(
        {"worker_id": 0, **history_messages.pack_history(log.drain())}))
    first, second = history_messages.history_records(history_messages.unpack_history(decoded))
    assert first["loss"] == 2.5 and first["accuracy"] == 0.25
    assert math.isnan(second["loss"]) and "accuracy" not in second


def test_averaged_history_averages_each_step_of_an_epoch_with_uneven_partitions(
        fashion_train):
    """Worker 0 takes 10 steps an epoch, worker 1 6, numbered on across epochs: averaged by
    that number, worker 1's epoch 1 was averaged with worker 0's epoch 0 (an ``epoch`` of
    0.5, losses of two epochs in one mean)."""
    from distkeras.trainers import ADAG

    first, second = (fashion_train.limit(rows).rdd.coalesce(1) for rows in (320, 192))
    frame = fashion_train.sparkSession.createDataFrame(first.union(second),
                                                       fashion_train.schema)
    trainer = ADAG(build_mlp(16), "adam", "categorical_crossentropy", num_workers=2,
                   communication_window=2, num_epoch=3)
    trainer.train(frame, verbose=0)

    averaged = trainer.get_averaged_history()
    assert list(averaged["epoch"]) == [0] * 10 + [1] * 10 + [2] * 10
    assert list(averaged["iteration"]) == list(range(1, 31))
    steps = {}  # (epoch, step within it) -> the workers' losses
    for worker in (0, 1):
        for epoch in (0, 1, 2):
            records = [record for record in trainer.get_executor_history(worker)
                       if record["epoch"] == epoch]
            assert len(records) == (10 if worker == 0 else 6)
            for step, record in enumerate(records):
                steps.setdefault((epoch, step), []).append(record["loss"])
    want = [np.mean(steps[key]) for key in sorted(steps)]
    np.testing.assert_allclose(averaged["loss"], want, rtol=1e-12)


def test_averaging_epoch_by_epoch_numbers_each_workers_steps_on_from_its_own(
        fashion_train, monkeypatch):
    """A job per epoch: each epoch's steps started at 1 + the largest iteration of any
    worker, so the smaller partition's worker skipped numbers (1-6, 11-16, ...), where the
    one-job path and the parameter-server trainers count on without gaps."""
    from distkeras.trainers import AveragingTrainer

    first, second = (fashion_train.limit(rows).rdd.coalesce(1) for rows in (320, 192))
    frame = fashion_train.sparkSession.createDataFrame(first.union(second),
                                                       fashion_train.schema)
    trainer = AveragingTrainer(build_mlp(16), "adam", "categorical_crossentropy",
                               num_workers=2, num_epoch=3)
    monkeypatch.setattr(launch, "slots_for_one_job", lambda *args: False)
    trainer.train(frame, verbose=0)

    for worker, steps in ((0, 10), (1, 6)):
        records = trainer.get_executor_history(worker)
        assert [record["iteration"] for record in records] == list(range(1, 3 * steps + 1))
        assert [record["epoch"] for record in records] == \
            [epoch for epoch in range(3) for _ in range(steps)]


def test_averaged_history_of_records_without_epochs_goes_by_iteration():
    """Records of a worker of one's own, without ``epoch``: each worker's k-th step, as
    dist-keras averaged them."""
    from distkeras.training.history import average_history

    records = [{"worker_id": worker, "iteration": step, "timestamp": float(step),
                "loss": float(worker + step)}
               for worker in (0, 1) for step in (1, 2, 3) if (worker, step) != (1, 3)]
    averaged = average_history(records)
    assert list(averaged["iteration"]) == [1, 2, 3] and "epoch" not in averaged
    np.testing.assert_allclose(averaged["loss"], [1.5, 2.5, 3.0])


def test_executor_history_of_an_unknown_worker_says_which_workers_have_records(caplog):
    """`get_executor_history(7)` (a typo for 1) gave [] without a word."""
    from distkeras.trainers import Trainer
    from distkeras.training.run import RunResults

    trainer = Trainer(None, "adam", "mse")
    trainer._results = RunResults(history=[  # as a run of two workers leaves them
        {"worker_id": worker, "iteration": 1, "timestamp": 0.0, "loss": 1.0}
        for worker in (0, 1)])
    with caplog.at_level("WARNING", logger="distkeras"):
        assert len(trainer.get_executor_history(1)) == 1
        assert caplog.text == ""
        assert trainer.get_executor_history(7) == []
    assert "get_executor_history(7): no records of that worker" in caplog.text
    assert "the workers with records are [0, 1]" in caplog.text
