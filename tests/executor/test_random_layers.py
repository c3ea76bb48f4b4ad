"""Random layers on the workers: each worker draws Dropout masks of its own, a job per
epoch draws new ones every epoch, and ``keras.utils.set_random_seed`` on the driver makes a
run repeatable, as it makes Keras's ``fit``.

The models see rows of ones through a Dropout and a frozen Dense of ones (a learning rate of
0), so a step's loss depends on that step's masks alone: equal losses, step for step, are
equal masks.
"""

import numpy as np
import pytest

from distkeras.training import launch

DIM = 16
ROWS = 64  # per worker


@pytest.fixture(scope="module")
def ones(spark):
    frame = spark.createDataFrame([([1.0] * DIM, 0.0)] * (2 * ROWS), ["features", "label"])
    frame = frame.repartition(2).cache()
    frame.count()
    yield frame
    frame.unpersist()


def _model(seed=None):
    import keras

    return keras.Sequential([
        keras.Input((DIM,)),
        keras.layers.Dropout(0.5, seed=seed),
        keras.layers.Dense(1, use_bias=False, kernel_initializer="ones"),
    ])


def _settings(learning_rate=0.0):
    import keras

    return dict(worker_optimizer=keras.optimizers.SGD(learning_rate), loss="mse",
                metrics=[], batch_size=8)


def _losses(trainer, worker_id, epoch=None):
    return [record["loss"] for record in trainer.get_executor_history(worker_id)
            if epoch is None or record["epoch"] == epoch]


@pytest.mark.parametrize("name", ["AveragingTrainer", "ADAG"])
def test_workers_draw_masks_of_their_own(ones, name):
    # A layer's seed reached every worker unchanged: all drew the same masks, step for step.
    from distkeras import trainers

    trainer = getattr(trainers, name)(_model(seed=42), num_workers=2, **_settings())
    trainer.train(ones)
    first, second = _losses(trainer, 0), _losses(trainer, 1)
    assert len(first) == len(second) == ROWS // 8
    assert first != second


def test_ensemble_members_draw_masks_of_their_own(ones):
    from distkeras import trainers

    trainer = trainers.EnsembleTrainer(_model(seed=42), num_ensembles=2, **_settings())
    trainer.train(ones)
    assert _losses(trainer, 0) != _losses(trainer, 1)


def test_a_job_per_epoch_draws_new_masks_every_epoch(ones, monkeypatch):
    # Each epoch's task started its layers from their seed again: the same masks every epoch.
    from distkeras import trainers

    trainer = trainers.AveragingTrainer(_model(seed=42), num_workers=2, num_epoch=2,
                                        **_settings())
    monkeypatch.setattr(launch, "slots_for_one_job", lambda *args: False)
    trainer.train(ones)
    assert _losses(trainer, 0, epoch=0) != _losses(trainer, 0, epoch=1)


def test_set_random_seed_repeats_a_run_with_fits_masks(ones):
    # The `.keras` bytes leave the seed generators out: the worker drew its layers' seeds
    # from the executor's `random`, which the driver's set_random_seed does not reach.
    import keras

    from distkeras import trainers

    data = np.ones((ROWS * 2, DIM), "float32"), np.zeros(ROWS * 2, "float32")
    kernels = []
    for _ in range(2):
        keras.utils.set_random_seed(7)
        trainer = trainers.SingleTrainer(_model(), num_epoch=2, **_settings(0.01))
        kernels.append(trainer.train(ones).get_weights()[0])
    np.testing.assert_array_equal(kernels[0], kernels[1])
    # One replica draws the masks the model's own fit draws.
    keras.utils.set_random_seed(7)
    model = _model()
    model.compile(keras.optimizers.SGD(0.01), "mse")
    model.fit(*data, batch_size=8, epochs=2, shuffle=False, verbose=0)
    np.testing.assert_allclose(kernels[0], model.get_weights()[0], rtol=1e-5, atol=1e-6)


def test_seed_states_travel_unchanged_to_worker_zero_only():
    import keras

    from distkeras.keras_io import model_state

    model = _model(seed=42)
    states = model_state.seed_states(model)
    assert states == [[42, 0]]
    copy = keras.models.clone_model(model)
    model_state.seed_worker_generators(copy, [[42, 5]], worker_id=0, steps_before=0)
    assert model_state.seed_states(copy) == [[42, 5]]
    seeds = set()
    for worker_id, steps_before in ((1, 0), (0, 8), (1, 8)):
        model_state.seed_worker_generators(copy, [[42, 5]], worker_id, steps_before)
        seed, counter = model_state.seed_states(copy)[0]
        assert counter == 5 and seed != 42
        seeds.add(seed)
    assert len(seeds) == 3
    with pytest.raises(ValueError, match="1 seed generators; 2 seed states"):
        model_state.seed_worker_generators(copy, [[1, 0], [2, 0]], 0, 0)
