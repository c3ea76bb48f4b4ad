"""The JAX fast path of the worker's `train_on_batch` against Keras's own."""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from distkeras.executor.jax_steps import JaxTrainStep  # noqa: E402
from distkeras.executor.replica import ModelReplica  # noqa: E402

pytestmark = pytest.mark.skipif(keras.backend.backend() != "jax", reason="JAX backend only")


def _model_with_batch_norm(seed=3):
    """Trainable and non-trainable weights interleaved in `model.weights`."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([
        keras.Input((6,)),
        keras.layers.Dense(8, activation="relu"),
        keras.layers.BatchNormalization(),
        keras.layers.Dense(3, activation="softmax"),
    ])
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    return model


def _batches(count, seed=0):
    rng = np.random.default_rng(seed)
    for _ in range(count):
        x = rng.normal(size=(16, 6)).astype("float32")
        y = np.eye(3, dtype="float32")[rng.integers(0, 3, 16)]
        yield x, y


def test_fast_steps_match_keras_train_on_batch():
    reference = _model_with_batch_norm()
    fast_model = _model_with_batch_norm()
    records = []
    replica = ModelReplica(fast_model, lambda logs, size: records.append(logs))
    assert replica._fast_step is not None
    for x, y in _batches(12):
        expected = reference.train_on_batch(x, y, return_dict=True)
        got = replica.train_on_batch(x, y, return_dict=True)
        # Per-batch logs, not running averages over the steps.
        assert got["loss"] == pytest.approx(expected["loss"], rel=1e-4)
        assert got["accuracy"] == pytest.approx(expected["accuracy"])
    for mine, theirs in zip(replica.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)
    assert len(records) == 12


def test_weights_written_into_the_state_are_trained_from():
    model = _model_with_batch_norm()
    replica = ModelReplica(model, lambda logs, size: None)
    batches = list(_batches(3))
    replica.train_on_batch(*batches[0])
    fresh = _model_with_batch_norm(seed=9)
    replica.set_weights(fresh.get_weights())
    # Read back before any step: exactly what was written, in get_weights order.
    for mine, theirs in zip(replica.get_weights(), fresh.get_weights()):
        np.testing.assert_array_equal(mine, theirs)
    # The Keras variables see them too once synced (any other attribute access syncs).
    for variable, theirs in zip(replica.weights, fresh.get_weights()):
        np.testing.assert_array_equal(np.asarray(variable.value), theirs)


def test_a_weight_of_the_wrong_shape_is_refused_and_the_state_kept():
    model = _model_with_batch_norm()
    step = JaxTrainStep(model)
    step(*next(_batches(1)))
    before = step.get_weights()
    wrong = [np.zeros((2, 2), "float32")] + before[1:]
    with pytest.raises(ValueError, match="shape"):
        step.set_weights(wrong)
    for mine, theirs in zip(step.get_weights(), before):
        np.testing.assert_array_equal(mine, theirs)


def test_a_window_in_one_call_matches_step_by_step():
    stepwise = ModelReplica(_model_with_batch_norm(), lambda logs, size: None)
    stepwise_losses = [stepwise.train_on_batch(x, y, return_dict=True)["loss"]
                       for x, y in _batches(6)]
    windows = []
    windowed = ModelReplica(_model_with_batch_norm(), lambda logs, size: None,
                            lambda logs, size, count: windows.append((logs, size, count)))
    windowed.train_on_window(list(_batches(6)))
    (logs, size, count), = windows
    assert (size, count) == (16, 6)
    np.testing.assert_allclose(np.asarray(logs["loss"]), stepwise_losses, rtol=1e-4)
    for mine, theirs in zip(windowed.get_weights(), stepwise.get_weights()):
        np.testing.assert_allclose(mine, theirs, rtol=1e-4, atol=1e-5)


def test_a_window_of_unequal_batches_runs_step_by_step():
    steps = []
    replica = ModelReplica(_model_with_batch_norm(), lambda logs, size: steps.append(size),
                           lambda logs, size, count: steps.append(("window", count)))
    batches = list(_batches(3))
    batches[-1] = (batches[-1][0][:5], batches[-1][1][:5])  # the last, partial minibatch
    replica.train_on_window(batches)
    assert steps == [16, 16, 5]


def test_history_log_keeps_one_record_per_step_of_a_window():
    from distkeras.executor.step_history import HistoryLog

    log = HistoryLog()
    log.append({"worker_id": 0, "iteration": 1, "loss": 2.0})
    log.extend({"worker_id": 0, "iteration": np.arange(2, 5),
                "loss": jnp_array([1.5, 1.0, 0.5])}, 3)
    columns = log.drain()
    assert columns["iteration"] == [1, 2, 3, 4]
    assert all(isinstance(value, int) for value in columns["iteration"])
    assert columns["loss"] == [2.0, 1.5, 1.0, 0.5]
    assert columns["worker_id"] == [0, 0, 0, 0]
    assert log.size == 0


def jnp_array(values):
    import jax.numpy as jnp

    return jnp.asarray(values, dtype=jnp.float32)


def test_weights_go_through_keras_when_the_state_cannot_place_them():
    replica = ModelReplica(_model_with_batch_norm(), lambda logs, size: None)
    batches = list(_batches(2))
    replica.train_on_batch(*batches[0])
    replica._fast_step._weight_slots = None  # as for a weight outside both variable lists
    fresh = _model_with_batch_norm(seed=11).get_weights()
    replica.set_weights(fresh)
    for mine, theirs in zip(replica.get_weights(), fresh):
        np.testing.assert_array_equal(mine, theirs)
    replica.train_on_batch(*batches[1])  # trains on from the weights written through Keras
    assert not np.array_equal(replica.get_weights()[0], fresh[0])
