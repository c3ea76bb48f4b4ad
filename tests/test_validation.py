"""Validation during training: the split, the monitor's per-epoch evaluations of the
center variable, and the records each trainer keeps, against Keras's own evaluate."""

import threading

import numpy as np
import pytest
from conftest import build_mlp


def test_a_fraction_splits_the_rows_once_and_for_all(spark):
    from distkeras.validation import split

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
    from distkeras.validation import split

    with pytest.raises(ValueError, match="`validation_data` must be a Spark DataFrame"):
        split(spark.range(3), value)


class _Server:
    def __init__(self):
        self.mutex = threading.RLock()
        self.center_variable = [np.zeros(2, np.float32)]
        self.history = []
        self.num_updates = 0


class _Validator:
    def __init__(self):
        self.calls = []
        self.records = []

    def evaluate(self, weights, epoch, samples):
        self.calls.append((float(weights[0][0]), epoch, samples))
        self.records.append({"val_loss": 1.0 / epoch})


class _Progress:
    def __init__(self):
        self.postfixes = []

    def update(self, samples, postfix):
        self.postfixes.append(dict(postfix))


def test_monitor_evaluates_the_center_once_per_finished_epoch_but_not_the_last():
    from distkeras.monitor import TrainingMonitor

    server, validator = _Server(), _Validator()
    monitor = TrainingMonitor(server, None, "group", total_samples=300, verbose=0,
                              validator=validator, num_epoch=3)

    progress = _Progress()

    def trained(samples, center):
        server.history.append({"batch_size": samples, "loss": 1.0})
        server.center_variable = [np.full(2, center, np.float32)]
        monitor._update(progress, 0.0)

    trained(60, 1.0)     # 60 of 100 samples in epoch 1: nothing yet
    trained(50, 2.0)     # 110: epoch 1 done
    trained(40, 3.0)     # 150
    trained(120, 4.0)    # 270: epoch 2 done
    trained(30, 5.0)     # 300: all done, the trainer evaluates the returned model

    assert validator.calls == [(2.0, 1, 110), (4.0, 2, 270)]
    # The progress shows the latest validation loss once there is one.
    assert [postfix.get("val_loss") for postfix in progress.postfixes] == \
        [None, "1.0000", "1.0000", "0.5000", "0.5000"]


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
