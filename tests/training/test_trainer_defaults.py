"""Defaults chosen for good models and full speed on every kind of model."""

import pytest
from conftest import build_mlp


@pytest.mark.parametrize("workers, window", [(1, 1), (2, 2), (8, 8), (12, 12), (40, 12)])
def test_adag_window_defaults_to_the_number_of_workers_up_to_12(workers, window):
    from distkeras.trainers import ADAG

    trainer = ADAG(build_mlp(), num_workers=workers)
    assert trainer.communication_window == window
    assert trainer.get_config()["communication_window"] == window


@pytest.mark.parametrize("workers, window", [(1, 1), (2, 2), (5, 5), (40, 5)])
def test_experimental_window_defaults_to_the_number_of_workers_up_to_5(workers, window):
    from distkeras.trainers import Experimental

    assert Experimental(build_mlp(), num_workers=workers).communication_window == window


def test_a_given_window_is_kept_and_other_trainers_keep_theirs():
    from distkeras.trainers import ADAG, AEASGD, DOWNPOUR, DynSGD

    assert ADAG(build_mlp(), num_workers=2, communication_window=12).communication_window == 12
    assert DOWNPOUR(build_mlp(), num_workers=40).communication_window == 5
    assert DynSGD(build_mlp(), num_workers=40).communication_window == 5
    assert AEASGD(build_mlp(), num_workers=2).communication_window == 16


def test_a_bad_worker_count_still_gets_a_window_and_is_refused_by_train():
    from distkeras.trainers import ADAG

    trainer = ADAG(build_mlp(), worker_optimizer="adam", loss="mse", num_workers=0)
    assert trainer.communication_window == 12
    with pytest.raises(ValueError, match="num_workers"):
        trainer.validate_arguments()


@pytest.mark.spark
def test_executors_keep_every_xla_thread_unless_told(spark):
    """A lone worker (SingleTrainer) runs a convolution on every core, as `fit` does."""
    import os

    conf = spark.sparkContext.getConf()
    expected = os.environ.get("DISTKERAS_EXECUTOR_XLA_FLAGS")
    assert conf.get("spark.executorEnv.XLA_FLAGS") == expected
    flags = spark.sparkContext.parallelize([0], 1).map(
        lambda _: __import__("os").environ.get("XLA_FLAGS")).collect()
    assert flags == [os.environ.get("XLA_FLAGS")]


@pytest.mark.parametrize("optimizer, momentum", [
    ("adam", 0.0), ({"class_name": "AdamW", "config": {}}, 0.0), ("nadam", 0.0),
    ("sgd", 0.9), ("adagrad", 0.9), ("rmsprop", 0.9),
    ("OPTIMIZER_SGD_MOMENTUM", 0.0), ("OPTIMIZER_RMSPROP_MOMENTUM", 0.0),
])
def test_eamsgd_adds_its_momentum_only_to_optimizers_without_their_own(optimizer, momentum):
    """The paper's 0.9 on top of Adam's own moving average cost the zoo's MLP 12 points."""
    import keras

    from distkeras.trainers import EAMSGD

    optimizer = {"OPTIMIZER_SGD_MOMENTUM": keras.optimizers.SGD(momentum=0.5),
                 "OPTIMIZER_RMSPROP_MOMENTUM": keras.optimizers.RMSprop(momentum=0.3),
                 }.get(optimizer, optimizer) if isinstance(optimizer, str) else optimizer
    trainer = EAMSGD(build_mlp(), worker_optimizer=optimizer, loss="mse")
    assert trainer.make_algorithm().momentum == momentum
    assert trainer.allocate_worker().algorithm.momentum == momentum
    assert trainer.get_config()["momentum"] is None  # what was passed, untouched
    assert EAMSGD(build_mlp(), worker_optimizer=optimizer, loss="mse",
                  momentum=0.7).make_algorithm().momentum == 0.7


@pytest.mark.parametrize("name, averages", [
    ("AEASGD", True), ("EAMSGD", True), ("DiLoCo", True), ("FedAdam", True),
    ("ADAG", False), ("DOWNPOUR", False), ("DynSGD", False), ("Experimental", False),
])
def test_trainers_whose_center_no_worker_trained_measure_batch_statistics_again(
        name, averages):
    """The algorithm declares it (`Algorithm.averages_weights`); its trainer follows.
    DiLoCo's zoo CNN scored 0.74 without it, against `fit`'s 0.83."""
    from distkeras import algorithms, trainers

    assert getattr(algorithms, name).averages_weights is averages
    assert getattr(trainers, name).averages_weights is averages


@pytest.mark.spark
@pytest.mark.parametrize("name", ["DiLoCo", "FedAdam"])
def test_outer_step_trainers_return_statistics_measured_with_the_returned_weights(spark, name):
    """A BatchNormalization layer on the features: measured again, its moving mean is the
    features' mean over the sampled rows' batches, whatever the center's weights."""
    import keras
    import numpy as np

    from distkeras import trainers

    keras.utils.set_random_seed(0)
    inputs = keras.Input((4,))
    outputs = keras.layers.Dense(2, activation="softmax")(
        keras.layers.BatchNormalization(name="bn")(inputs))
    rng = np.random.default_rng(1)
    x = (rng.normal(size=(512, 4)) * [1.0, 3.0, 0.5, 2.0] + [5.0, -2.0, 0.0, 1.0]
         ).astype("float32")
    labels = (x[:, 0] > 5.0).astype("int64")
    frame = spark.createDataFrame([(row.tolist(), [float(1 - l), float(l)])
                                   for row, l in zip(x, labels)],
                                  "features array<float>, label array<float>").coalesce(1)
    trainer = getattr(trainers, name)(
        keras.Model(inputs, outputs), worker_optimizer="adam",
        loss="categorical_crossentropy", num_workers=2, batch_size=32, num_epoch=1,
        communication_window=4)
    model = trainer.train(frame)
    expected = np.mean([x[:256].mean(axis=0), x[256:].mean(axis=0)], axis=0)
    np.testing.assert_allclose(model.get_layer("bn").moving_mean.numpy(), expected,
                               rtol=1e-4)


def _workers_rate(trainer):
    """The learning rate in the optimizer config that ``trainer``'s workers (and its
    returned model) are given; None where it is the optimizer's name, unchanged."""
    from distkeras.keras_io.compile_config import optimizer_as_compiled, serialize_keras_object

    config = serialize_keras_object(optimizer_as_compiled(trainer._workers_optimizer(),
                                                          trainer.master_model))
    return None if isinstance(config, str) else config["config"]["learning_rate"]


@pytest.mark.parametrize("workers, optimizer, rate", [
    (2, "adam", 0.002), (8, "adam", 0.002), (2, "sgd", 0.02), (1, "adam", None),
])
def test_adag_workers_run_at_twice_their_optimizers_rate_from_a_window_of_2(
        workers, optimizer, rate):
    """At window 2 the center keeps half of each window's progress: the zoo's ViT stayed
    2.8 points below `fit` (3 seeds); at twice the rate, +0.3."""
    from distkeras.trainers import ADAG

    trainer = ADAG(build_mlp(), worker_optimizer=optimizer, loss="mse", num_workers=workers)
    assert _workers_rate(trainer) == pytest.approx(rate) if rate else \
        _workers_rate(trainer) is None
    assert trainer.get_config()["learning_rate"] is None  # what was passed, untouched


@pytest.mark.parametrize("name, workers, window, rate", [
    ("DynSGD", 2, None, 0.002), ("DynSGD", 4, 1, 0.002), ("DynSGD", 1, None, None),
    ("Experimental", 2, None, 0.002), ("Experimental", 2, 1, None),
    ("Experimental", 1, None, None), ("AEASGD", 2, None, 0.002), ("EAMSGD", 2, 8, 0.002),
    ("AEASGD", 1, None, None), ("FedAdam", 2, None, 0.002), ("FedAdam", 1, None, None),
    ("DiLoCo", 2, None, 0.002), ("DiLoCo", 1, None, None),
])
def test_rules_that_keep_part_of_each_commit_run_workers_at_twice_the_rate(
        name, workers, window, rate):
    """DynSGD divides a commit by its staleness (about the other workers' count),
    Experimental by the window, as ADAG; AEASGD's center is a lagging average of replicas
    that each took 1/k of the steps: at Adam's own rate the zoo's LSTM ended 3.9, 1.4 and
    2.7 points below `fit` (3 seeds); at twice it, +0.6, -0.5 and -0.8. FedAdam and DiLoCo
    divide by the staleness too (DiLoCo's outer rate went from 0.7 to 0.5 with it)."""
    from distkeras import trainers

    trainer = getattr(trainers, name)(build_mlp(), worker_optimizer="adam", loss="mse",
                                      num_workers=workers, communication_window=window)
    assert _workers_rate(trainer) == pytest.approx(rate) if rate else \
        _workers_rate(trainer) is None
    # The trainer's own learning_rate (None, Experimental's damping, AEASGD's elastic
    # force) is untouched: only the workers' optimizer is given the rate.
    assert trainer.get_config()["learning_rate"] in (None, 1.0, 0.1)


def test_a_chosen_rate_and_other_rules_keep_the_optimizers_rate():
    """Only Keras's default rate, of an optimizer given by name, is scaled: a rate given to
    the trainer, or in an optimizer instance or config (a KerasEstimator's learningRate
    arrives so), is the user's choice."""
    import keras

    from distkeras.trainers import ADAG, DOWNPOUR

    def adag(optimizer, **extra):
        return ADAG(build_mlp(), worker_optimizer=optimizer, loss="mse", **extra)

    assert _workers_rate(adag("adam", learning_rate=0.01)) == pytest.approx(0.01)
    assert _workers_rate(adag("adam", communication_window=1)) is None
    assert _workers_rate(DOWNPOUR(build_mlp(), worker_optimizer="adam", loss="mse")) is None
    assert _workers_rate(adag(keras.optimizers.Adam())) == pytest.approx(0.001)
    assert _workers_rate(adag({"class_name": "SGD", "config": {"learning_rate": 0.05}})) \
        == pytest.approx(0.05)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.01, 100, 0.9)
    rate = _workers_rate(adag(keras.optimizers.Adam(schedule)))
    assert rate["config"]["initial_learning_rate"] == pytest.approx(0.01)  # unscaled


def test_fedadams_server_takes_small_changes_about_whole_over_staleness_and_caps_large_ones():
    """FedAdam's defaults (no first moment, the rate equal to epsilon): a weight whose
    change is small against epsilon moves by about the change over its staleness + 1, as
    DynSGD's; a large change moves it by about the rate once the second moment has seen
    it. At the paper's first moment (0.9, rate 0.003, epsilon 0.001 here before) the
    center kept a tenth of a first commit and lagged the workers: 6 to 17 points below
    `fit` on the zoo."""
    import numpy as np

    from distkeras.algorithms import FedAdam
    from distkeras.algorithms.base import ServerContext

    rule = FedAdam()
    assert (rule.beta_1, rule.server_learning_rate, rule.epsilon) == (0.0, 0.01, 0.01)
    change = [np.array([1e-4, 1.0], "float32")]  # one small weight's change, one large

    def steps(staleness, count):
        state, center, moved = {}, [np.zeros(2, "float32")], []
        for number in range(count):
            after = rule.apply(center, change,
                               ServerContext(staleness, None, [True], state, number))
            moved.append(after[0] - center[0])
            center = after
        return moved

    fresh = steps(0, 200)
    first, last = fresh[0], fresh[-1]
    np.testing.assert_allclose(first[0], 1e-4 * 0.01 / (0.1 * 1e-4 + 0.01), rtol=1e-3)
    assert 0.99e-4 < first[0] < 1e-4 and 0.98e-4 < last[0] < 1e-4  # about whole
    assert last[1] == pytest.approx(0.01 / (np.sqrt(1 - 0.99 ** 200) + 0.01), rel=1e-3)
    assert last[1] < 0.012  # a large change: capped near the rate
    overtaken = steps(1, 1)[0]  # one other commit since this worker's pull: half
    assert 0.49e-4 < overtaken[0] < 0.5e-4
