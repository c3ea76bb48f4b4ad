"""The callbacks' training values of the metrics that ``fit`` accumulates over an epoch
(AUC, Precision, RootMeanSquaredError, R2Score, ...) are fit's, not means of steps."""

import numpy as np
import pytest


def _binary_data(fashion_test, rows=256):
    images, labels = fashion_test
    return images[:rows], (labels[:rows] < 5).astype(np.float32).reshape(-1, 1)


def _frame(spark, x, y):
    rows = [(features.tolist(), label.tolist()) for features, label in zip(x, y)]
    return spark.createDataFrame(rows, "features array<float>, label array<float>")


def _model(outputs=1, activation="sigmoid"):
    import keras

    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(outputs, activation=activation)])


def _recorder(seen):
    import keras

    return keras.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: seen.append(logs))


def _fit_and_train(spark, x, y, loss, metrics):
    """The epoch logs of fit, and of SingleTrainer on the same rows and initial weights."""
    import keras

    from distkeras.trainers import SingleTrainer

    logs = {}
    for way in ("fit", "train"):
        keras.utils.set_random_seed(3)
        model, seen = _model(), []
        if way == "fit":
            model.compile(keras.optimizers.Adam(0.01), loss, metrics=metrics())
            model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0,
                      callbacks=[_recorder(seen)])
        else:
            trainer = SingleTrainer(model, keras.optimizers.Adam(0.01), loss,
                                    metrics=metrics(), num_epoch=2, batch_size=32)
            trainer.train(_frame(spark, x, y).coalesce(1), verbose=0,
                          callbacks=[_recorder(seen)])
            logs["history"] = trainer.get_history()
        logs[way] = seen
    return logs


def _step_mean(history, name, epoch):
    steps = [record for record in history if record["epoch"] == epoch]
    return np.average([record[name] for record in steps],
                      weights=[record["batch_size"] for record in steps])


def test_single_trainer_logs_fits_epoch_auc_and_precision(spark, fashion_test):
    import keras

    x, y = _binary_data(fashion_test)
    logs = _fit_and_train(spark, x, y, "binary_crossentropy",
                          lambda: [keras.metrics.AUC(name="auc"), "precision", "accuracy"])
    assert len(logs["train"]) == len(logs["fit"]) == 2
    for epoch, (got, want) in enumerate(zip(logs["train"], logs["fit"])):
        for name in ("auc", "precision", "accuracy", "loss"):
            assert got[name] == pytest.approx(want[name], rel=1e-5, abs=1e-6), (epoch, name)
    # Not the steps' mean, which the history still holds step by step.
    assert abs(_step_mean(logs["history"], "auc", 0) - logs["train"][0]["auc"]) > 1e-3


def test_single_trainer_logs_fits_epoch_rmse_and_r2(spark, fashion_test):
    import keras

    images, labels = fashion_test
    x, y = images[:256], (labels[:256] / 9.0).astype(np.float32).reshape(-1, 1)
    logs = _fit_and_train(spark, x, y, "mse",
                          lambda: [keras.metrics.RootMeanSquaredError(name="rmse"),
                                   keras.metrics.R2Score(name="r2"), "mae"])
    for epoch, (got, want) in enumerate(zip(logs["train"], logs["fit"])):
        for name in ("rmse", "r2", "mae", "loss"):
            assert got[name] == pytest.approx(want[name], rel=1e-5, abs=1e-6), (epoch, name)
    assert abs(_step_mean(logs["history"], "rmse", 0) - logs["train"][0]["rmse"]) > 1e-4


@pytest.mark.parametrize("trainer_name", ["ADAG", "AveragingTrainer"])
def test_two_workers_log_the_auc_of_all_the_epochs_rows(spark, fashion_test, trainer_name):
    # A learning rate of 0: every step sees the initial model, so the epoch's AUC over both
    # workers' rows is that model's AUC over all the rows, computed here at once.
    import keras

    from distkeras import trainers

    x, y = _binary_data(fashion_test)
    keras.utils.set_random_seed(4)
    model, seen = _model(), []
    scores = model.predict(x, verbose=0)
    want = {}
    for name, metric in (("auc", keras.metrics.AUC()), ("precision", keras.metrics.Precision())):
        metric.update_state(y, scores)
        want[name] = float(metric.result())
    trainer = getattr(trainers, trainer_name)(
        model, keras.optimizers.SGD(0.0), "binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc"), "precision"], num_workers=2, num_epoch=2,
        batch_size=32)
    trainer.train(_frame(spark, x, y).repartition(2), verbose=0,
                  callbacks=[_recorder(seen)])
    assert len(seen) == 2
    for logs in seen:
        assert logs["auc"] == pytest.approx(want["auc"], rel=1e-5)
        assert logs["precision"] == pytest.approx(want["precision"], rel=1e-5)
    assert abs(_step_mean(trainer.get_history(), "auc", 0) - want["auc"]) > 1e-3


def test_exact_logs_add_the_workers_states():
    import keras

    from distkeras.training.epoch_metrics import exact_logs

    rng = np.random.default_rng(0)
    y, scores = rng.integers(0, 2, (100, 1)), rng.random((100, 1))
    whole, halves = keras.metrics.AUC(), [keras.metrics.AUC(), keras.metrics.AUC()]
    whole.update_state(y, scores)
    halves[0].update_state(y[:30], scores[:30])
    halves[1].update_state(y[30:], scores[30:])
    spec = {"config": keras.metrics.serialize(whole)}
    reports = [{"worker_id": index, "epoch": 0, "name": "auc", "spec": spec,
                "state": [np.asarray(v) for v in half.variables]}
               for index, half in enumerate(halves)]
    reports.append(dict(reports[0], superseded=True))  # a failed attempt's: not counted
    assert exact_logs(reports)["auc"] == pytest.approx(float(whole.result()), rel=1e-6)


@pytest.mark.parametrize("spec, state", [
    ({"mean": True}, [np.ones(1), np.ones(1), np.ones(1)]),  # a mean of three parts
    ({"config": {"module": "keras.layers", "class_name": "Dense",
                 "config": {"units": 1}}}, [np.ones(1)]),  # not a metric
    ({"config": {"module": "keras.metrics", "class_name": "AUC",
                 "config": {"num_thresholds": "many"}}}, [np.ones(1)]),  # does not build
    ({"config": {"module": "keras.metrics", "class_name": "AUC",
                 "config": {}}}, [np.ones(3)]),  # state shaped unlike its variables
    ({"config": "AUC"}, [np.ones(1)]),
    ({}, [np.ones(1)]),
])
def test_a_report_the_driver_cannot_use_leaves_the_steps_mean(spec, state):
    """A worker's report is read off the network: one whose spec is not what workers send
    failed the driver's epoch end (a ValueError unpacking a mean of three parts, an
    AttributeError building a layer's config), stopping the training."""
    from distkeras.training.epoch_metrics import exact_logs

    good = {"worker_id": 0, "epoch": 0, "name": "loss", "spec": {"mean": True},
            "state": [np.asarray(6.0), np.asarray(3.0)]}
    bad = {"worker_id": 1, "epoch": 0, "name": "odd", "spec": spec, "state": state}
    assert exact_logs([good, bad]) == {"loss": 2.0}


def test_a_window_returns_only_the_metric_state_the_epoch_adds_up():
    # A MeanIoU over 300 classes keeps the steps' mean (its state is too large to report):
    # the compiled window must not stack a copy of its 300 x 300 state per step.
    import jax
    import keras

    from distkeras.executor.metric_sums import EpochMetricSums
    from distkeras.executor.jax_steps import JaxTrainStep

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(300, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy",
                  metrics=[keras.metrics.MeanIoU(num_classes=300, sparse_y_pred=False),
                           "accuracy"])
    rng = np.random.default_rng(0)
    batches = [(rng.random((8, 4), np.float32), rng.integers(0, 300, 8)) for _ in range(4)]
    step = JaxTrainStep(model)
    step.run_window(batches)
    returned = sum(leaf.size for leaf in jax.tree_util.tree_leaves(step.metric_values))
    assert returned < 4 * 300 * 300
    sums = EpochMetricSums()
    sums.bind(model)
    assert [name for name, _, _ in sums.slots] == ["loss", "accuracy"]
    sums.add_window(np.zeros(4, np.int64), step.metric_values)  # what it adds is there
    assert sums.drain()
