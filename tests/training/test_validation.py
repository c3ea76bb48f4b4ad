"""Validation during training: the split, the monitor's per-epoch evaluations of the
center variable, and the records each trainer keeps, against Keras's own evaluate."""

import os
import threading

import numpy as np
import pytest
from conftest import accuracy, build_mlp


def test_a_fraction_splits_the_rows_once_and_for_all(spark):
    from distkeras.training.validation_data import split

    frame = spark.range(2000).repartition(2).cache()
    training, validation = split(frame, 0.2, seed=7)

    kept = {row.id for row in training.collect()}
    held = {row.id for row in validation.collect()}
    assert kept.isdisjoint(held) and len(kept | held) == 2000
    assert 300 < len(held) < 500
    assert {row.id for row in split(frame, 0.2, seed=7)[1].collect()} == held
    assert training.columns == ["id"]


@pytest.mark.parametrize("value", [0.0, 1.0, 1.5, -0.1, True, "0.1", [0.1]])
def test_a_bad_validation_value_is_named(value, spark):
    from distkeras.training.validation_data import split

    with pytest.raises(ValueError, match="`validation_data` must be a Spark DataFrame"):
        split(spark.range(3), value)


class _Server:
    """A server's center as the monitor reads it, with a real `HistorySink`."""

    def __init__(self):
        from distkeras.transport.history_sink import HistorySink

        self.mutex = threading.RLock()
        self.center_variable = [np.zeros(2, np.float32)]
        self.num_updates = 0
        self.sink = HistorySink(threading.Lock(), self)

    @property
    def history(self):
        return self.sink.history


class _Validator:
    def __init__(self, stop_after=None):
        self.calls = []
        self.begun = []
        self.records = []
        self.losses = []
        self.metrics = []
        self.stop_after = stop_after
        self.stop_requested = False

    def epoch_begin(self, epoch):
        self.begun.append(epoch)

    def learning_rate(self):
        return None  # no learning rate callback

    def evaluate(self, weights, epoch, samples, loss=None, metrics=None):
        self.calls.append((float(weights[0][0]), epoch, samples))
        self.losses.append(loss)
        self.metrics.append(metrics)
        self.records.append({"val_loss": 1.0 / epoch})
        self.stop_requested = epoch == self.stop_after


class _SparkContext:
    """A classic session's stand-in (its own ``sparkContext``): the job tags cancelled."""

    def __init__(self):
        self.cancelled = []
        self.sparkContext = self

    def cancelJobsWithTag(self, tag):
        self.cancelled.append(tag)


class _Progress:
    def __init__(self):
        self.postfixes = []

    def update(self, samples, postfix):
        self.postfixes.append(dict(postfix))


def test_monitor_evaluates_the_center_once_per_finished_epoch_but_not_the_last():
    from distkeras.training.monitor import TrainingMonitor

    server, validator = _Server(), _Validator()
    monitor = TrainingMonitor(server, None, "group", total_samples=300, verbose=0,
                              validator=validator, num_epoch=3)

    progress = _Progress()

    def trained(samples, center):
        server.history.append({"batch_size": samples, "loss": center})
        server.center_variable = [np.full(2, center, np.float32)]
        monitor._update(progress, 0.0)

    trained(60, 1.0)     # 60 of 100 samples in epoch 1: nothing yet
    trained(50, 2.0)     # 110: epoch 1 done
    trained(40, 3.0)     # 150
    trained(120, 4.0)    # 270: epoch 2 done
    trained(30, 5.0)     # 300: all done, the trainer evaluates the returned model

    assert validator.calls == [(2.0, 1, 110), (4.0, 2, 270)]
    # Each epoch's training loss: the mean of the steps reported since the last one, each
    # weighing its rows (as fit's logs do).
    assert validator.losses == pytest.approx([(60 * 1.0 + 50 * 2.0) / 110,
                                              (40 * 3.0 + 120 * 4.0) / 160])
    assert validator.begun == [2, 3]  # the trainer begins the first
    assert monitor.stopped_by_callback is None
    # The progress shows the latest validation loss once there is one.
    assert [postfix.get("val_loss") for postfix in progress.postfixes] == \
        [None, "1.0000", "1.0000", "0.5000", "0.5000"]


def test_monitor_gives_each_epoch_the_loss_and_metrics_of_its_own_steps():
    """Two epochs ended between two looks: each gets its own steps' means (they were one
    mean of every step since the last look)."""
    from distkeras.training.monitor import TrainingMonitor

    server, validator = _Server(), _Validator()
    monitor = TrainingMonitor(server, None, "group", total_samples=400, verbose=0,
                              validator=validator, num_epoch=4, num_tasks=1)
    server.history.extend([
        {"worker_id": 0, "epoch": 0, "batch_size": 100, "loss": 4.0, "accuracy": 0.5},
        {"worker_id": 0, "epoch": 1, "batch_size": 100, "loss": 2.0, "accuracy": 0.75},
        {"worker_id": 0, "epoch": 2, "batch_size": 50, "loss": 1.0, "accuracy": 1.0}])
    monitor._update(None, 0.0)
    assert [call[1] for call in validator.calls] == [1, 2]
    assert validator.losses == [4.0, 2.0]
    assert validator.metrics == [{"accuracy": 0.5}, {"accuracy": 0.75}]
    assert [record["epoch"] for record in monitor._epoch_records] == [2]  # kept for later


def test_monitor_ends_every_epoch_when_several_end_between_two_looks():
    """Short epochs (or the last ones ending together) are each ended, on the center
    reached: a callback counts every epoch."""
    from distkeras.training.monitor import TrainingMonitor

    server, validator = _Server(), _Validator()
    monitor = TrainingMonitor(server, None, "group", total_samples=400, verbose=0,
                              validator=validator, num_epoch=4)
    server.history.append({"batch_size": 250, "loss": 2.0})  # epochs 1 and 2 at once
    server.center_variable = [np.full(2, 7.0, np.float32)]
    monitor._update(None, 0.0)
    assert validator.calls == [(7.0, 1, 250), (7.0, 2, 250)]
    server.history.append({"batch_size": 150, "loss": 1.0})  # all done: epoch 3 still ends
    server.center_variable = [np.full(2, 9.0, np.float32)]
    monitor._update(None, 0.0)
    assert validator.calls[2:] == [(9.0, 3, 400)]  # epoch 4: the returned model, at the end
    assert validator.begun == [2, 3, 4]


def test_an_epoch_ends_when_every_worker_has_gone_past_it():
    """A worker that starts late holds the end of an epoch back: the other's samples alone
    could add up to an epoch of both (and EarlyStopping then stopped a worker that had
    not trained at all)."""
    from distkeras.training.monitor import TrainingMonitor

    server, validator = _Server(), _Validator()
    monitor = TrainingMonitor(server, None, "group", total_samples=400, verbose=0,
                              validator=validator, num_epoch=4, num_tasks=2)

    def step(worker, epoch, samples=50):
        server.history.append({"worker_id": worker, "epoch": epoch, "batch_size": samples,
                               "loss": 1.0})
        monitor._update(None, 0.0)

    for epoch in (0, 1, 2):  # worker 0 alone: 150 samples, but worker 1 has not begun
        step(0, epoch)
    assert validator.calls == []
    step(1, 0)
    step(1, 1)  # worker 1 is past epoch 1: epoch 1 has ended for both
    assert [epoch for _, epoch, _ in validator.calls] == [1]
    server.sink.finished_workers.add(0)  # worker 0 is done: worker 1 sets the pace
    step(1, 2)
    step(1, 3)
    assert [epoch for _, epoch, _ in validator.calls] == [1, 2, 3]



def test_each_epoch_is_validated_with_the_samples_trained_as_it_ended():
    """Two epochs ended before the driver looked (a worker that started late): each is
    evaluated on the center the server kept as it ended, and says the samples trained
    then (both said the samples counted at the look)."""
    from distkeras.training.monitor import TrainingMonitor

    ends = {1: ([np.full(2, 1.0, np.float32)], 250),
            2: ([np.full(2, 2.0, np.float32)], 330)}
    server, validator = _Server(), _Validator()
    server.sink.epoch_end = lambda epoch: ends.pop(epoch, None)
    monitor = TrainingMonitor(server, None, "group", total_samples=400, verbose=0,
                              validator=validator, num_epoch=4, num_tasks=2)
    server.history.extend({"worker_id": worker, "epoch": epoch, "batch_size": 50,
                           "loss": 1.0} for worker, epoch in
                          [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2)])
    monitor._update(None, 0.0)
    assert validator.calls == [(1.0, 1, 250), (2.0, 2, 330)]

def test_monitor_cancels_the_workers_when_a_callback_asks_to_stop():
    from distkeras.training.monitor import TrainingMonitor

    server, validator, context = _Server(), _Validator(stop_after=1), _SparkContext()
    monitor = TrainingMonitor(server, context, "the-group", total_samples=300, verbose=0,
                              validator=validator, num_epoch=3)
    server.history.append({"batch_size": 120, "loss": 1.0})
    monitor._update(None, 0.0)
    server.history.append({"batch_size": 120, "loss": 1.0})  # reported before they stopped
    monitor._update(None, 0.0)

    assert validator.calls == [(0.0, 1, 120)]  # nothing evaluated after the stop
    assert context.cancelled == ["the-group"]
    assert monitor.stopped_by_callback == "a callback stopped the training after epoch 1"


def test_monitor_stops_the_workers_when_validation_or_a_callback_fails():
    from distkeras.training.monitor import TrainingMonitor

    class Failing(_Validator):
        def evaluate(self, weights, epoch, samples, loss=None, metrics=None):
            raise OSError("disk full")

    server, context = _Server(), _SparkContext()
    monitor = TrainingMonitor(server, context, "the-group", total_samples=300, verbose=0,
                              validator=Failing(), num_epoch=3)
    server.history.append({"batch_size": 120, "loss": 1.0})
    monitor._update(None, 0.0)

    epoch, error = monitor.end_of_epoch_error
    assert epoch == 1 and str(error) == "disk full"
    assert context.cancelled == ["the-group"]


def test_a_callbacks_keyboard_interrupt_stops_the_workers_too():
    """A callback that raised KeyboardInterrupt (or SystemExit) ended the monitor's thread
    alone: the workers trained every epoch and train() returned as if nothing happened."""
    from distkeras.training.monitor import TrainingMonitor

    class Interrupting(_Validator):
        def evaluate(self, weights, epoch, samples, loss=None, metrics=None):
            raise KeyboardInterrupt("stop now")

    server, context = _Server(), _SparkContext()
    monitor = TrainingMonitor(server, context, "the-group", total_samples=300, verbose=0,
                              validator=Interrupting(), num_epoch=3)
    server.history.append({"batch_size": 120, "loss": 1.0})
    try:
        monitor._update(None, 0.0)
    except KeyboardInterrupt:
        pytest.fail("the interrupt escaped: it would end the monitor's thread alone")

    epoch, error = monitor.end_of_epoch_error
    assert epoch == 1 and isinstance(error, KeyboardInterrupt)
    assert context.cancelled == ["the-group"]


def test_a_callbacks_keyboard_interrupt_reaches_the_caller_of_train(fashion_train):
    """SingleTrainer's epoch ends run on its EpochServer's thread: the interrupt ended that
    thread, the worker lost its connection and was retried, and the training ran on."""
    import keras

    from distkeras.trainers import SingleTrainer

    class Abort(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise KeyboardInterrupt("the user's abort")

    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy", num_epoch=20)
    with pytest.raises(KeyboardInterrupt, match="the user's abort"):
        trainer.train(fashion_train.limit(500), verbose=0, callbacks=[Abort()])
    assert sum(record["batch_size"] for record in trainer.get_history()) == 500


def test_a_failing_callback_fails_the_training_with_its_error(fashion_train):
    import keras

    from distkeras.trainers import ADAG, TrainingError

    class Broken(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise ZeroDivisionError("the callback's own bug")

    trainer = ADAG(build_mlp(32), "adam", "categorical_crossentropy", num_workers=2,
                   communication_window=1, num_epoch=50)
    with pytest.raises(TrainingError, match=r"The end of epoch \d+ failed .*ZeroDivisionError: "
                                            "the callback's own bug"):
        trainer.train(fashion_train, verbose=0, callbacks=[Broken()])


def _frame(spark, images, labels):
    rows = [(image.tolist(), np.eye(10)[label].tolist()) for image, label in
            zip(images, labels)]
    return spark.createDataFrame(rows, "features array<float>, label array<float>")


def test_averaging_trainer_validates_every_epoch_like_keras_evaluate(spark, fashion_train,
                                                                      fashion_test):
    import keras

    from distkeras.trainers import AveragingTrainer

    images, labels = fashion_test[0][:500], fashion_test[1][:500]
    keras.utils.set_random_seed(5)
    trainer = AveragingTrainer(build_mlp(32), "adam", "categorical_crossentropy",
                               num_workers=2, num_epoch=3)
    model = trainer.train(fashion_train, verbose=0,
                          validation_data=_frame(spark, images, labels))

    records = trainer.get_validation_history()
    assert [record["epoch"] for record in records] == [1, 2, 3]
    assert [record["samples"] for record in records] == [6000, 12000, 18000]
    expected = model.evaluate(images, np.eye(10)[labels], verbose=0, return_dict=True)
    assert records[-1]["val_loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert records[-1]["val_accuracy"] == pytest.approx(expected["accuracy"])
    assert records[-1]["val_accuracy"] > 0.6
    assert records[0]["val_loss"] > records[-1]["val_loss"]


def test_adag_validates_the_returned_model_on_a_held_out_fraction(fashion_train):
    from distkeras.trainers import ADAG

    trainer = ADAG(build_mlp(32), "adam", "categorical_crossentropy", num_workers=2,
                   communication_window=4, num_epoch=2)
    trainer.train(fashion_train, verbose=0, validation_data=0.1)

    records = trainer.get_validation_history()
    assert records[-1]["epoch"] == 2 and records[-1]["val_accuracy"] > 0.6
    # About 10% held out: the workers trained on the rest, twice.
    assert 2 * 5000 < records[-1]["samples"] < 2 * 5800
    assert all(record["epoch"] < 2 for record in records[:-1])


def test_ensemble_members_are_validated_one_by_one(spark, fashion_train, fashion_test):
    from distkeras.trainers import EnsembleTrainer

    images, labels = fashion_test[0][:200], fashion_test[1][:200]
    trainer = EnsembleTrainer(build_mlp(32), "adam", "categorical_crossentropy",
                              num_ensembles=2)
    members = trainer.train(fashion_train, verbose=0,
                            validation_data=_frame(spark, images, labels))

    records = trainer.get_validation_history()
    assert [record["member"] for record in records] == [0, 1]
    for record, member in zip(records, members):
        expected = member.evaluate(images, np.eye(10)[labels], verbose=0, return_dict=True)
        assert record["val_loss"] == pytest.approx(expected["loss"], rel=1e-5)


def test_validation_rows_that_do_not_fit_the_model_fail_before_training(spark, fashion_train):
    from distkeras.trainers import SingleTrainer

    wrong = spark.createDataFrame([([0.0] * 10, [0.0] * 10)], "features array<float>, "
                                                               "label array<float>")
    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy")

    with pytest.raises(ValueError, match="In the validation data: .* 10 values per row.*784"):
        trainer.train(fashion_train, verbose=0, validation_data=wrong)
    assert trainer.get_history() == []



def test_null_validation_labels_are_named_as_the_validation_datas(spark):
    """The validation rows are read on the driver: their nulls are not "in this
    partition" of the training data."""
    import keras

    from distkeras.trainers import SingleTrainer

    rows = [([float(index)], float(index)) for index in range(8)]
    train = spark.createDataFrame(rows, "features array<float>, label double")
    holed = spark.createDataFrame(rows[:3] + [([1.0], None)], "features array<float>, "
                                                              "label double")
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    trainer = SingleTrainer(model, "sgd", "mse", metrics=[])

    with pytest.raises(ValueError, match="In the validation data: Column 'label' has 1 null "
                                         "values; drop or fill") as raised:
        trainer.train(train, verbose=0, validation_data=holed)
    assert "partition" not in str(raised.value)


def _stop_after_first_epoch():
    import keras

    class StopAfterFirstEpoch(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs, self.logs, self.ended = [], [], False

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append(epoch)
            self.logs.append(dict(logs or {}))
            self.model.stop_training = True

        def on_train_end(self, logs=None):
            self.ended = True

    return StopAfterFirstEpoch()


def test_a_callback_stops_adag_workers_after_an_epoch(spark, fashion_train, fashion_test,
                                                     caplog):
    import logging

    from distkeras.trainers import ADAG

    images, labels = fashion_test[0][:300], fashion_test[1][:300]
    callback = _stop_after_first_epoch()
    # Epochs of 6,000 rows take a fraction of a second and the workers report twice a
    # second: many epochs, so that stopping after the first one noticed shows.
    trainer = ADAG(build_mlp(32), "adam", "categorical_crossentropy", num_workers=2,
                   communication_window=1, num_epoch=50)
    with caplog.at_level(logging.WARNING, logger="distkeras"):
        model = trainer.train(fashion_train, verbose=0, callbacks=[callback],
                              validation_data=_frame(spark, images, labels))

    trained = sum(record["batch_size"] for record in trainer.get_history())
    assert trained < 0.5 * 50 * 6000  # stopped long before the 50 epochs
    # The callback stopped it: no warning that the workers trained on part of the data.
    assert not [r for r in caplog.records if "returned before" in r.getMessage()]
    assert callback.ended and callback.epochs[0] >= 0
    assert "val_loss" in callback.logs[0] and "loss" in callback.logs[0]
    records = trainer.get_validation_history()
    assert len(records) == 1 and records[0]["epoch"] == callback.epochs[0] + 1
    # The returned model is the center of the epoch it stopped after, as evaluated.
    expected = model.evaluate(images, np.eye(10)[labels], verbose=0, return_dict=True)
    assert records[0]["val_loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert model.compiled and accuracy(model, fashion_test) > 0.5


def test_single_trainer_validates_each_epoch_and_trains_as_in_one_task(spark, fashion_test):
    from distkeras.trainers import SingleTrainer

    images, labels = fashion_test
    # 1,600 rows: 50 whole batches, so one task over 3 epochs steps on the same batches.
    train_frame = _frame(spark, images[:1600], labels[:1600])
    held_out = images[1600:1900], labels[1600:1900]
    model = build_mlp(32)
    in_one_task = SingleTrainer(model, "adam", "categorical_crossentropy", num_epoch=3)
    expected = in_one_task.train(train_frame, verbose=0)
    trainer = SingleTrainer(model, "adam", "categorical_crossentropy", num_epoch=3)
    validated = trainer.train(train_frame, verbose=0,
                              validation_data=_frame(spark, *held_out))

    # The optimizer's state went on from epoch to epoch: the very same training.
    for got, want in zip(validated.get_weights(), expected.get_weights()):
        np.testing.assert_array_equal(got, want)
    records = trainer.get_validation_history()
    assert [record["epoch"] for record in records] == [1, 2, 3]
    assert [record["samples"] for record in records] == [1600, 3200, 4800]
    assert records[0]["val_loss"] > records[2]["val_loss"]
    assert all("loss" in record for record in records)
    final = validated.evaluate(held_out[0], np.eye(10)[held_out[1]], verbose=0,
                               return_dict=True)
    assert records[2]["val_loss"] == pytest.approx(final["loss"], rel=1e-5)
    history = trainer.get_history()
    assert [record["iteration"] for record in history] == list(range(1, 151))
    assert [record["epoch"] for record in history] == [0] * 50 + [1] * 50 + [2] * 50


def test_a_callback_stops_single_trainer_before_the_next_epoch(spark, fashion_test):
    from distkeras.trainers import SingleTrainer, TrainingError

    images, labels = fashion_test
    train_frame = _frame(spark, images[:640], labels[:640])
    callback = _stop_after_first_epoch()
    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy", num_epoch=5)
    model = trainer.train(train_frame, verbose=0, callbacks=[callback])

    assert callback.epochs == [0] and callback.ended
    assert len(trainer.get_history()) == 20  # the first epoch's 20 steps, no more
    assert callback.logs[0]["loss"] == pytest.approx(
        np.mean([record["loss"] for record in trainer.get_history()]))
    assert model.compiled

    import keras

    class Broken(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            raise ZeroDivisionError("the callback's own bug")

    with pytest.raises(TrainingError, match="The end of epoch 1 failed .*ZeroDivisionError"):
        trainer.train(train_frame, verbose=0, callbacks=[Broken()])


def test_single_trainer_applies_learning_rates_that_callbacks_set(spark, fashion_test):
    import keras

    from distkeras.trainers import SingleTrainer

    images, labels = fashion_test
    train_frame = _frame(spark, images[:640], labels[:640])

    class WeightsAtEpochEnds(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.weights, self.rates = [], []

        def on_epoch_end(self, epoch, logs=None):
            self.weights.append(self.model.get_weights())
            self.rates.append(float(np.asarray(self.model.optimizer.learning_rate)))

    seen = WeightsAtEpochEnds()
    # Epoch 2 at learning rate 0: plain SGD leaves the weights as epoch 1 left them.
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, rate: [0.1, 0.0, 0.05][epoch])
    trainer = SingleTrainer(build_mlp(32), keras.optimizers.SGD(0.5),
                            "categorical_crossentropy", num_epoch=3)
    model = trainer.train(train_frame, verbose=0, callbacks=[schedule, seen])

    assert seen.rates == pytest.approx([0.1, 0.0, 0.05])
    for after_first, after_second in zip(seen.weights[0], seen.weights[1]):
        np.testing.assert_array_equal(after_first, after_second)
    assert not np.array_equal(seen.weights[1][0], seen.weights[2][0])
    assert float(np.asarray(model.optimizer.learning_rate)) == pytest.approx(0.05)

    # No epoch improves on the first one's loss by 10: the rate halves after each later one
    # (`seen`, listed first, records the rate before the halving).
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0,
                                                min_delta=10.0)
    seen = WeightsAtEpochEnds()
    trainer = SingleTrainer(build_mlp(32), keras.optimizers.SGD(0.1),
                            "categorical_crossentropy", num_epoch=3)
    model = trainer.train(train_frame, verbose=0, callbacks=[seen, plateau])
    assert seen.rates == pytest.approx([0.1, 0.1, 0.05])
    # The last epoch ran at 0.05 and its end halved the rate: the returned optimizer holds
    # the trained state at that rate, as after fit.
    assert float(np.asarray(model.optimizer.learning_rate)) == pytest.approx(0.025)
    assert int(np.asarray(model.optimizer.iterations)) == 60


def test_averaging_trainer_returns_the_weights_a_callback_restores(spark, fashion_train):
    import keras

    from distkeras.trainers import AveragingTrainer

    class RestoreFirstEpoch(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch == 0:
                self.first = self.model.get_weights()

        def on_train_end(self, logs=None):
            self.model.set_weights(self.first)

    callback = RestoreFirstEpoch()
    trainer = AveragingTrainer(build_mlp(32), "adam", "categorical_crossentropy",
                               num_workers=2, num_epoch=3)
    model = trainer.train(fashion_train, verbose=0, callbacks=[callback])

    assert len(trainer.get_history()) > 0 and trainer.get_validation_history() == []
    for returned, first in zip(model.get_weights(), callback.first):
        np.testing.assert_array_equal(returned, first)


@pytest.mark.parametrize("one_job", [True, False])
def test_averaging_trainer_starts_each_epoch_at_the_rate_a_callback_set(
        one_job, spark, fashion_train, monkeypatch):
    import keras

    from distkeras import session
    from distkeras.trainers import AveragingTrainer

    # One job keeps a slot for a Spark job of the user's own callback, which this one does
    # not start (local[2] has none to spare); with None Spark "cannot say": a job per epoch.
    monkeypatch.setattr(session, "concurrent_task_slots",
                        lambda spark: 3 if one_job else None)

    class WeightsAtEpochEnds(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.weights = []

        def on_epoch_end(self, epoch, logs=None):
            self.weights.append(self.model.get_weights())

    seen = WeightsAtEpochEnds()
    # Epoch 2 at learning rate 0: every replica of plain SGD stays at the first average.
    schedule = keras.callbacks.LearningRateScheduler(lambda epoch, rate: [0.1, 0.0, 0.05][epoch])
    trainer = AveragingTrainer(build_mlp(32), keras.optimizers.SGD(0.5),
                               "categorical_crossentropy", num_workers=2, num_epoch=3)
    model = trainer.train(fashion_train.limit(1000), verbose=0, callbacks=[schedule, seen])

    assert (trainer.parameter_server is not None) == one_job
    for first, second in zip(seen.weights[0], seen.weights[1]):
        np.testing.assert_array_equal(first, second)
    moved = max(float(np.abs(last - second).max())
                for last, second in zip(model.get_weights(), seen.weights[1]))
    assert moved > 1e-3  # epoch 3 trained again, at 0.05


def test_parameter_server_workers_train_at_the_rate_a_callback_sets(spark, fashion_train):
    import keras

    from distkeras.trainers import ADAG

    mlp = build_mlp(32)
    initial = mlp.get_weights()
    # Rate 0 from the first epoch on: the workers take it at their first pull, so neither
    # moves the center.
    still = keras.callbacks.LearningRateScheduler(lambda epoch, rate: 0.0)
    trainer = ADAG(mlp, keras.optimizers.SGD(0.5), "categorical_crossentropy",
                   num_workers=2, num_epoch=2, communication_window=4)
    model = trainer.train(fashion_train.limit(1000), verbose=0, callbacks=[still])

    assert trainer.parameter_server.num_updates > 10
    for returned, start in zip(model.get_weights(), initial):
        np.testing.assert_array_equal(returned, start)


def test_reduce_lr_on_plateau_lowers_the_parameter_server_workers_rate(spark, fashion_train):
    import keras

    from distkeras.trainers import DOWNPOUR

    # No epoch improves the loss by 10: each epoch's end after the first halves the rate.
    plateau = keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0,
                                                min_delta=10.0)
    trainer = DOWNPOUR(build_mlp(32), keras.optimizers.SGD(0.1), "categorical_crossentropy",
                       num_workers=2, num_epoch=3)
    model = trainer.train(fashion_train.limit(1000), verbose=0, callbacks=[plateau])

    # Sent to the workers after epoch 2; the last epoch's end lowers the returned model's
    # rate, as after fit.
    assert trainer.parameter_server.center.optimizer_learning_rate == pytest.approx(0.05)
    assert float(np.asarray(model.optimizer.learning_rate)) == pytest.approx(0.025)


def test_a_server_with_its_own_pull_reply_refuses_learning_rate_callbacks(spark,
                                                                           fashion_train):
    import keras

    from distkeras import parameter_servers
    from distkeras.trainers import DOWNPOUR

    class OwnPullServer(parameter_servers.DeltaParameterServer):
        def handle_pull(self, conn, addr):
            super().handle_pull(conn, addr)

    class OwnPullDOWNPOUR(DOWNPOUR):
        def allocate_parameter_server(self):
            return OwnPullServer(self.master_model, self.master_port)

    trainer = OwnPullDOWNPOUR(build_mlp(32), "adam", "categorical_crossentropy")
    with pytest.raises(ValueError, match="OwnPullServer answers pulls with a handle_pull of "
                                         "its own.*keras.optimizers.schedules"):
        trainer.train(fashion_train, verbose=0,
                      callbacks=[keras.callbacks.ReduceLROnPlateau()])
    assert trainer.get_history() == []


def test_early_stopping_ends_averaging_trainer_on_a_plateau(spark, fashion_train):
    import keras

    from distkeras.trainers import AveragingTrainer

    # An improvement no epoch can make: EarlyStopping stops after the second one.
    stopping = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)
    trainer = AveragingTrainer(build_mlp(32), "adam", "categorical_crossentropy",
                               num_workers=2, num_epoch=5)
    trainer.train(fashion_train, verbose=0, callbacks=[stopping])

    assert {record["epoch"] for record in trainer.get_history()} == {0, 1}
    assert stopping.stopped_epoch == 1


@pytest.mark.parametrize("callback, trainer_name, error, message", [
    ("not a callback", "SingleTrainer", TypeError, "must be keras.callbacks.Callback"),
    ("SwapEMAWeights", "SingleTrainer", ValueError, "acts on Keras's own training loop"),
    ("BackupAndRestore", "SingleTrainer", ValueError,
     "would change nothing. To go on after an interrupted run, pass train\\(df, "
     "checkpoint_dir=..., resume=True\\)"),
    ("ProgbarLogger", "ADAG", ValueError, "train\\(\\) draws its own \\(verbose=1"),
    ("EarlyStopping", "EnsembleTrainer", ValueError, "independent models: callbacks"),
])
def test_callbacks_that_cannot_work_are_refused(callback, trainer_name, error, message,
                                                fashion_train, tmp_path):
    import keras

    from distkeras import trainers

    if callback == "BackupAndRestore":
        callback = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    elif callback != "not a callback":
        callback = getattr(keras.callbacks, callback)()
    trainer = getattr(trainers, trainer_name)(build_mlp(32), "adam",
                                              "categorical_crossentropy")
    with pytest.raises(error, match=message):
        trainer.train(fashion_train, verbose=0, callbacks=[callback])
    assert trainer.get_history() == []


def test_a_checkpoint_saved_every_few_batches_is_refused(fashion_train, tmp_path):
    import keras

    from distkeras.trainers import SingleTrainer

    # Callbacks see epoch ends only: a checkpoint saved on batch ends would never be.
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "m{epoch}.keras"),
                                                 save_freq=20)
    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy", num_epoch=2)

    with pytest.raises(ValueError, match="save_freq=20.*would save nothing. Use "
                                         "save_freq='epoch'"):
        trainer.train(fashion_train, verbose=0, callbacks=[checkpoint])
    assert trainer.get_history() == [] and list(tmp_path.iterdir()) == []


def test_a_callback_acting_on_batches_only_is_refused(fashion_train):
    import keras

    from distkeras.trainers import ADAG

    steps = []
    callback = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs:
                                              steps.append(logs["loss"]))
    trainer = ADAG(build_mlp(32), "adam", "categorical_crossentropy", num_workers=2)
    # fit calls it at every step; train() never would: it would record nothing, silently.
    with pytest.raises(ValueError, match="LambdaCallback's on_train_batch_end would never "
                                         "be called.*it would do nothing"):
        trainer.train(fashion_train, verbose=0, callbacks=[callback])
    assert trainer.get_history() == [] and steps == []


def test_a_callbacks_batch_hooks_that_never_run_are_warned_of(caplog):
    import keras

    from distkeras.training.callbacks import check_callbacks

    class Both(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            pass

        def on_test_batch_end(self, batch, logs=None):
            pass

    class Checkpoint(keras.callbacks.ModelCheckpoint):  # the user's, on Keras's
        def on_train_batch_begin(self, batch, logs=None):
            pass

    keras_own = [keras.callbacks.EarlyStopping(), keras.callbacks.TerminateOnNaN(),
                 keras.callbacks.ModelCheckpoint("m.keras"), keras.callbacks.History(),
                 keras.callbacks.LambdaCallback(on_epoch_end=print)]
    with caplog.at_level("WARNING", logger="distkeras"):
        check_callbacks(keras_own)
        assert caplog.messages == []
        check_callbacks([Both(), Checkpoint("m.keras"),
                         keras.callbacks.LambdaCallback(on_epoch_end=print,
                                                        on_batch_end=print)])
    assert [message.split(" would")[0] for message in caplog.messages] == [
        "Both's on_test_batch_end", "Checkpoint's on_train_batch_begin",
        "LambdaCallback's on_batch_end"]


def test_tensorboards_batch_options_are_warned_of(caplog, tmp_path):
    import keras

    from distkeras.training.callbacks import check_callbacks

    with caplog.at_level("WARNING", logger="distkeras"):
        check_callbacks([keras.callbacks.TensorBoard(str(tmp_path / "epochs"))])
        assert caplog.messages == []  # epoch summaries: written as in fit
        board = keras.callbacks.TensorBoard(str(tmp_path / "batches"), update_freq=10)
        # As Keras keeps profile_batch=(2, 4) where it can profile (JAX needs Python 3.12).
        board._start_batch, board._stop_batch = 2, 4
        check_callbacks([board])
    assert len(caplog.messages) == 1
    message = caplog.messages[0]
    assert "update_freq=10" in message and "profile_batch=(2, 4)" in message
    assert "epoch summaries alone" in message and "get_history()" in message


@pytest.mark.parametrize("wrap", ["alone", "CallbackList"])
def test_callbacks_are_taken_alone_or_in_a_callback_list_as_fit_takes_them(
        wrap, spark, fashion_train):
    import keras

    from distkeras.trainers import SingleTrainer

    # An improvement no epoch can make: EarlyStopping stops after the second one.
    stopping = keras.callbacks.EarlyStopping(monitor="loss", patience=0, min_delta=10.0)
    callbacks = stopping if wrap == "alone" else keras.callbacks.CallbackList([stopping])
    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy", num_epoch=4)
    trainer.train(fashion_train.limit(500), verbose=0, callbacks=callbacks)

    assert stopping.stopped_epoch == 1
    assert {record["epoch"] for record in trainer.get_history()} == {0, 1}


def test_too_many_validation_rows_are_refused_before_training(spark, fashion_train,
                                                              monkeypatch):
    from distkeras.trainers import SingleTrainer
    from distkeras.training import validation_data

    monkeypatch.setattr(validation_data, "MAX_ROWS", 100)
    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy")

    with pytest.raises(ValueError, match="more than 100 rows; they are held on the driver"):
        trainer.train(fashion_train, verbose=0, validation_data=fashion_train.limit(101))
    assert trainer.get_history() == []


def test_monitor_keeps_no_per_step_records_without_validation():
    from distkeras.training.monitor import TrainingMonitor

    server = _Server()
    monitor = TrainingMonitor(server, None, "group", total_samples=10**6, verbose=0)
    for _ in range(500):
        server.history.append({"batch_size": 32, "loss": 1.0})
    monitor._update(None, 0.0)

    assert monitor._epoch_records == [] and len(monitor._recent_losses) <= 50


def test_numpy_arrays_validate_as_in_keras_fit(spark, fashion_train, fashion_test):
    from distkeras.trainers import SingleTrainer

    images, labels = fashion_test[0][:300], fashion_test[1][:300]
    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy", num_epoch=2)
    model = trainer.train(fashion_train.limit(1000), verbose=0,
                          validation_data=(images.reshape(300, 28, 28), np.eye(10)[labels]))

    records = trainer.get_validation_history()
    assert [record["epoch"] for record in records] == [1, 2]
    expected = model.evaluate(images, np.eye(10)[labels], verbose=0, return_dict=True)
    assert records[-1]["val_loss"] == pytest.approx(expected["loss"], rel=1e-5)


def test_validation_runs_in_minibatches_of_the_batch_size_as_fit_validates(spark):
    """A loss summed per minibatch (or averaged over the labels it does not ignore) is a
    mean over minibatches that depends on their size: `fit`'s val_loss is evaluate's at
    its batch_size (val_loss was 10 times fit's here, the rows evaluated in one call)."""
    import keras

    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(320, 8)).astype("float32")
    y = x[:, :3].argmax(axis=1).astype("int64")

    def model():
        keras.utils.set_random_seed(5)
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])

    def loss():
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="sum")

    reference = model()
    reference.compile(keras.optimizers.SGD(0.1), loss())
    history = reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0,
                            validation_data=(x, y)).history
    frame = spark.createDataFrame([(row.tolist(), int(label)) for row, label in zip(x, y)],
                                  "features array<float>, label long").coalesce(1)
    trainer = SingleTrainer(model(), keras.optimizers.SGD(0.1), loss(), metrics=[],
                            batch_size=32)
    trainer.train(frame, verbose=0, validation_data=(x, y))
    (record,) = trainer.get_validation_history()
    assert record["loss"] == pytest.approx(history["loss"][0], rel=1e-5)
    assert record["val_loss"] == pytest.approx(history["val_loss"][0], rel=1e-5)


def test_validation_sample_weights_weigh_the_validation_loss_as_in_keras(spark, fashion_train,
                                                                      fashion_test):
    from pyspark.sql import functions as F

    from distkeras.trainers import SingleTrainer

    images, labels = fashion_test[0][:300], fashion_test[1][:300]
    y = np.eye(10)[labels]
    weights = np.where(labels < 5, 3.0, 0.5)  # half the classes count 6 times the others
    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy")
    model = trainer.train(fashion_train.limit(1000), verbose=0,
                          validation_data=[images, y, weights])  # a list, as fit takes too
    (record,) = trainer.get_validation_history()
    weighted = model.evaluate(images, y, sample_weight=weights, verbose=0, return_dict=True)
    plain = model.evaluate(images, y, verbose=0, return_dict=True)
    assert record["val_loss"] == pytest.approx(weighted["loss"], rel=1e-5)
    assert abs(weighted["loss"] - plain["loss"]) > 1e-3  # the weights changed the loss

    # A DataFrame's rows are weighted by the training's sample_weight_col, where they have
    # it (as Keras's validation_split keeps the training weights).
    frame = _frame(spark, images, labels).withColumn(
        "weight", F.when(F.array_position("label", 1.0) <= 5, 3.0).otherwise(0.5))
    training = fashion_train.limit(1000).withColumn("weight", F.lit(1.0))
    model = trainer.train(training, verbose=0, validation_data=frame,
                          sample_weight_col="weight")
    (record,) = trainer.get_validation_history()
    weighted = model.evaluate(images, y, sample_weight=weights, verbose=0, return_dict=True)
    assert record["val_loss"] == pytest.approx(weighted["loss"], rel=1e-5)
    model = trainer.train(training, verbose=0, validation_data=frame.drop("weight"),
                          sample_weight_col="weight")
    (record,) = trainer.get_validation_history()
    plain = model.evaluate(images, y, verbose=0, return_dict=True)
    assert record["val_loss"] == pytest.approx(plain["loss"], rel=1e-5)


@pytest.mark.parametrize("data, error, message", [
    ((np.zeros((4, 784)), np.zeros((4, 10)), None, None), ValueError,
     r"must be a tuple \(x, y\) or \(x, y, sample_weight\).*a tuple of 4"),
    # (x,): fit(x)'s, for a model trained without labels (label_col=None).
    ((np.zeros((4, 784)),), ValueError,
     r"holds no labels \(y is None\).*label_col='label'.*give \(x, y\)"),
    ((np.zeros((4, 784)), np.zeros((4, 10)), np.ones(3)), ValueError,
     r"sample_weight must hold one number per row \(4 rows\)"),
    ((np.zeros((4, 784)), np.zeros((4, 10)), np.array([1.0, -1.0, 1.0, 1.0])), ValueError,
     "sample_weight must be finite numbers >= 0"),
    ((np.zeros((4, 783)), np.zeros((4, 10))), ValueError,
     r"x has rows of shape \(783,\); the model expects \(784,\)"),
    ((np.zeros((4, 784)), np.zeros((3, 10))), ValueError, r"different numbers of rows: \[3, 4\]"),
    ((np.zeros((4, 784)), np.array([0, 1, 2, 10])), ValueError,
     "validation_data's y holds the class index 10, but the model's output has 10 classes"),
    ((np.zeros((4, 784)), np.array([0, 1, 2, 3])), ValueError,
     "In validation_data: .*sparse_categorical_crossentropy"),
    ((np.array([["a"] * 784] * 4), np.zeros((4, 10))), TypeError,
     "x must be a numeric numpy array"),
    ([np.zeros((4, 784))], ValueError, "a tuple \\(x, y\\) of numpy arrays"),  # [x, y] is fine
])
def test_validation_arrays_that_do_not_fit_are_refused_before_training(data, error, message,
                                                                       fashion_train):
    from distkeras.trainers import SingleTrainer

    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy")
    with pytest.raises(error, match=message):
        trainer.train(fashion_train, verbose=0, validation_data=data)
    assert trainer.get_history() == []


@pytest.mark.parametrize("trainer_name", ["SingleTrainer", "AveragingTrainer", "DynSGD"])
def test_every_trainer_calls_each_epochs_begin_and_end(trainer_name, fashion_train):
    import keras

    from distkeras import trainers

    class Order(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.calls = []

        def on_epoch_begin(self, epoch, logs=None):
            self.calls.append(f"begin {epoch}")

        def on_epoch_end(self, epoch, logs=None):
            self.calls.append(f"end {epoch}")

    order = Order()
    trainer = getattr(trainers, trainer_name)(build_mlp(32), "adam",
                                              "categorical_crossentropy", num_epoch=3)
    trainer.train(fashion_train.limit(500), verbose=0, callbacks=[order])
    assert order.calls == ["begin 0", "end 0", "begin 1", "end 1", "begin 2", "end 2"]


@pytest.mark.parametrize("trainer_name", ["SingleTrainer", "ADAG"])
def test_on_train_end_gets_the_last_epochs_logs_as_fit_gives_them(trainer_name,
                                                                  fashion_train):
    import keras

    from distkeras import trainers

    class Last(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epoch_logs = []
            self.train_end_logs = "not called"

        def on_epoch_end(self, epoch, logs=None):
            self.epoch_logs.append(logs)

        def on_train_end(self, logs=None):
            self.train_end_logs = None if logs is None else dict(logs)

        def on_train_begin(self, logs=None):
            self.begin_params = dict(self.params)

    last = Last()
    callbacks = [keras.callbacks.ReduceLROnPlateau(monitor="val_loss"), last]
    trainer = getattr(trainers, trainer_name)(build_mlp(32), "adam",
                                              "categorical_crossentropy",
                                              metrics=["accuracy"], num_epoch=2)
    trainer.train(fashion_train.limit(500), verbose=0, validation_data=0.2,
                  callbacks=callbacks)
    # fit calls on_train_end(logs=<the last epoch's logs>), without the `learning_rate`
    # that ReduceLROnPlateau adds to the copy the callbacks see.
    assert len(last.epoch_logs) == 2
    expected = {key: value for key, value in last.epoch_logs[-1].items()
                if key != "learning_rate"}
    assert last.train_end_logs == expected
    assert set(expected) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    # fit's params: the epochs and the minibatches of an epoch (here, over all workers;
    # each partition's last minibatch may be partial, hence one more per worker at most).
    steps = sum(1 for record in trainer.get_history() if record.get("epoch", 0) == 0)
    assert last.begin_params["epochs"] == 2
    assert 0 <= steps - last.begin_params["steps"] <= 1


def test_terminate_on_nan_stops_at_the_end_of_an_epoch_whose_loss_is_nan():
    import keras

    from distkeras.training.validator import Validator

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    validator = Validator(model, callbacks=[keras.callbacks.TerminateOnNaN()], num_epoch=5)
    validator.begin()
    validator.evaluate(model.get_weights(), 1, 10, loss=0.5)
    assert not validator.stop_requested
    validator.evaluate(model.get_weights(), 2, 20, loss=float("nan"))
    assert validator.stop_requested and validator.stopped_epoch == 2


def _linear_validator(callbacks, num_epoch):
    """A Validator of y = x on a Dense(1) without bias: weight 1 fits, others do not."""
    import keras

    from distkeras.training.validator import Validator

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.linspace(-1, 1, 20, dtype="float32").reshape(-1, 1)
    return model, Validator(model, x, x, callbacks=callbacks, num_epoch=num_epoch)


def test_the_returned_models_record_is_the_best_epochs_that_early_stopping_restored(
        capsys):
    import keras

    from distkeras.training.monitor import report_returned_validation

    # Epoch 1 reached the best weights, epochs 2 and 3 worse ones; patience lets all three
    # run, and EarlyStopping restores epoch 1's at the train's end (as after fit).
    stopping = keras.callbacks.EarlyStopping(patience=5, restore_best_weights=True)
    model, validator = _linear_validator([stopping], num_epoch=3)
    validator.begin()
    for epoch, weight in ((1, 1.0), (2, 0.5)):
        validator.evaluate([np.array([[weight]], "float32")], epoch, 20 * epoch)
    returned = keras.models.clone_model(model)
    returned.compile(optimizer="sgd", loss="mse")
    returned.set_weights([np.array([[0.0]], "float32")])  # the last epoch's
    validator.end(returned, 60)

    assert returned.get_weights()[0][0, 0] == 1.0
    best = validator.records[0]
    assert validator.returned_record["epoch"] == 1
    assert validator.returned_record["val_loss"] == pytest.approx(best["val_loss"])
    # The line after the progress says the returned model's loss, not the last epoch's.
    report_returned_validation("ADAG", [validator.returned_record], verbose=2)
    assert capsys.readouterr().err == "ADAG, returned model (epoch 1): val_loss=0.0000\n"


def test_the_returned_models_record_is_the_last_where_no_callback_changed_it():
    model, validator = _linear_validator([], num_epoch=2)
    validator.begin()
    validator.evaluate([np.array([[0.5]], "float32")], 1, 20)
    model.set_weights([np.array([[1.0]], "float32")])
    validator.end(model, 40)
    assert validator.returned_record is validator.records[-1]
    assert validator.returned_record["epoch"] == 2


def test_the_progress_names_the_epoch_early_stopping_restored(fashion_train, fashion_test,
                                                              capsys):
    import keras

    from distkeras.trainers import SingleTrainer

    images, labels = fashion_test[0][:300], fashion_test[1][:300]
    # mode="max" on val_loss: the best epoch is the worst one, rarely the last.
    stopping = keras.callbacks.EarlyStopping(monitor="val_loss", mode="max", patience=5,
                                             restore_best_weights=True)
    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy", num_epoch=3)
    model = trainer.train(fashion_train.limit(600), verbose=2,
                          validation_data=(images, np.eye(10)[labels]), callbacks=[stopping])
    returned = model.evaluate(images, np.eye(10)[labels], verbose=0, return_dict=True)
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"SingleTrainer, returned model (epoch {stopping.best_epoch + 1}): "
        f"val_accuracy={returned['accuracy']:.4f}, val_loss={returned['loss']:.4f}")


@pytest.mark.parametrize("trainer_name", ["SingleTrainer", "AveragingTrainer", "ADAG"])
def test_callbacks_see_the_training_metrics_as_fit_gives_them(trainer_name, fashion_train):
    import keras

    from distkeras import trainers

    class Logs(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.seen = []

        def on_epoch_end(self, epoch, logs=None):
            self.seen.append(dict(logs))

    callback = Logs()
    trainer = getattr(trainers, trainer_name)(build_mlp(32), "adam",
                                              "categorical_crossentropy",
                                              metrics=["accuracy"], num_epoch=2)
    trainer.train(fashion_train.limit(640), verbose=0, validation_data=0.25,
                  callbacks=[callback])
    seen = callback.seen
    # fit's epoch logs: the training loss and metrics, and their val_ twins.
    assert [set(logs) for logs in seen] == [{"loss", "accuracy", "val_loss",
                                             "val_accuracy"}] * 2
    if trainer_name != "ADAG":  # epochs that end exactly: the means of their steps
        first = [record for record in trainer.get_history() if record["epoch"] == 0]
        rows = [record["batch_size"] for record in first]  # each step weighs its rows
        assert seen[0]["accuracy"] == pytest.approx(
            np.average([record["accuracy"] for record in first], weights=rows))
        assert seen[0]["loss"] == pytest.approx(
            np.average([record["loss"] for record in first], weights=rows))


def test_keras_accumulating_metrics_need_no_step_mean_warning(fashion_train, caplog):
    import keras

    from distkeras.trainers import SingleTrainer

    # Their epoch values are fit's (tests/training/test_epoch_metrics.py).
    trainer = SingleTrainer(build_mlp(32), "adam", "categorical_crossentropy",
                            metrics=["accuracy", keras.metrics.AUC(name="auc"),
                                     "precision"])
    with caplog.at_level("WARNING", logger="distkeras"):
        trainer.train(fashion_train.limit(200), verbose=0,
                      callbacks=[keras.callbacks.CSVLogger(os.devnull)])
    assert not [record for record in caplog.records
                if "mean of per-step values" in record.getMessage()]


def _peak_metric():
    """A metric class of the user's own, whose result is not a mean."""
    import keras

    @keras.saving.register_keras_serializable("distkeras_tests")
    class Peak(keras.metrics.Metric):
        def __init__(self, name="peak", **kwargs):
            super().__init__(name=name, **kwargs)
            self.peak = self.add_variable((), "zeros", name="peak")

        def update_state(self, y_true, y_pred, sample_weight=None):
            self.peak.assign(keras.ops.maximum(self.peak, keras.ops.max(y_pred)))

        def result(self):
            return self.peak

    return Peak


def test_only_metrics_of_the_users_own_classes_are_warned_of(caplog):
    import keras

    from distkeras.training.callbacks import warn_of_step_mean_metrics

    with caplog.at_level("WARNING", logger="distkeras"):
        warn_of_step_mean_metrics(["accuracy", "acc", "mae", "AUC",
                                   keras.metrics.SparseCategoricalAccuracy(),
                                   {"out": ["mse", keras.metrics.RootMeanSquaredError()]},
                                   None])
    assert caplog.records == []
    with caplog.at_level("WARNING", logger="distkeras"):
        warn_of_step_mean_metrics({"out": [_peak_metric()(), "precision"]})
    message = caplog.records[0].getMessage()
    assert "training peak is" in message and "precision" not in message


def test_step_mean_metrics_given_by_config_are_named_as_their_logs(caplog):
    from distkeras.keras_io.compile_config import serialize_keras_object
    from distkeras.training.callbacks import warn_of_step_mean_metrics

    peak = _peak_metric()
    peak(), peak()  # earlier instances: Keras might number the next "peak_2"
    with caplog.at_level("WARNING", logger="distkeras"):
        warn_of_step_mean_metrics([serialize_keras_object(peak()), "AUC"])
    message = caplog.records[0].getMessage()
    assert "monitor val_peak." in message


def test_epoch_logs_average_each_measured_value():
    from distkeras.training.validator import epoch_logs

    records = [{"worker_id": 0, "iteration": 1, "timestamp": 5.0, "batch_size": 32,
                "epoch": 0, "loss": 1.0, "accuracy": 0.5},
               {"worker_id": 1, "iteration": 1, "timestamp": 6.0, "batch_size": 32,
                "epoch": 0, "loss": 3.0, "accuracy": 0.25, "mae": 2.0}]
    assert epoch_logs(records) == {"loss": 2.0, "accuracy": 0.375, "mae": 2.0}
    assert np.isnan(epoch_logs([{"loss": float("nan")}, {"loss": 1.0}])["loss"])
    assert epoch_logs([]) == {}


def test_epoch_logs_weigh_each_step_by_its_rows():
    # fit's epoch logs: an epoch of 40 rows in batches of 32 is 32 rows of one step's loss
    # and 8 of the other's, not the two steps' plain mean.
    from distkeras.training.validator import epoch_logs

    records = [{"worker_id": 0, "iteration": 1, "timestamp": 5.0, "batch_size": 32,
                "epoch": 0, "loss": 1.0, "accuracy": 0.5},
               {"worker_id": 0, "iteration": 2, "timestamp": 6.0, "batch_size": 8,
                "epoch": 0, "loss": 6.0, "accuracy": 1.0}]
    assert epoch_logs(records) == pytest.approx({"loss": 2.0, "accuracy": 0.6})


class _LateWorker:
    """Makes worker 1 start two seconds after worker 0 (a slow executor, a skewed
    scheduler): mixed into a built-in worker class below."""

    def setup(self):
        import time

        if self.worker_id == 1:
            time.sleep(2.0)
        super().setup()


def test_each_epoch_ends_on_its_own_center_when_a_worker_starts_late(spark, fashion_train):
    """Worker 1 trains its short epochs after worker 0 has finished, and the driver's first
    validation (which compiles) takes longer than they do: epochs 1 to 3 all ended at once,
    on the last center (the same val_loss three times, which EarlyStopping counts as no
    improvement, and ModelCheckpoint saved the same weights)."""
    import keras

    from distkeras import trainers, workers

    class LateADAGWorker(_LateWorker, workers.ADAGWorker):
        pass

    class LateADAG(trainers.ADAG):
        def allocate_worker(self):
            return LateADAGWorker(self.master_model)

    class Centers(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.centers = []

        def on_epoch_end(self, epoch, logs=None):
            self.centers.append(self.model.get_weights()[0].copy())

    centers = Centers()
    frame = fashion_train.limit(1000).repartition(2).cache()
    x, y = np.random.default_rng(0).random((200, 784), np.float32), \
        np.eye(10, dtype=np.float32)[np.arange(200) % 10]
    trainer = LateADAG(build_mlp(32), "adam", "categorical_crossentropy", num_workers=2,
                       communication_window=2, num_epoch=4)
    trainer.train(frame, verbose=0, validation_data=(x, y), callbacks=[centers])
    frame.unpersist()

    assert len(centers.centers) == 4
    for earlier, later in zip(centers.centers, centers.centers[1:]):
        assert not np.array_equal(earlier, later)
    losses = [record["val_loss"] for record in trainer.get_validation_history()]
    assert len(set(losses)) == len(losses) == 4
    # Each with the samples trained as it ended (they were those trained when the driver
    # looked: the same for the epochs that ended at once).
    samples = [record["samples"] for record in trainer.get_validation_history()]
    assert samples == sorted(set(samples)) and samples[-1] == 4000
    assert all(count >= 1000 * epoch for epoch, count in enumerate(samples, 1))
