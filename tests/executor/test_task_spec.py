"""The task spec: one frozen description of a Spark task, built by the driver, shipped
with the worker (cloudpickle), and the only place a worker reads its settings from."""

import dataclasses

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from pyspark import cloudpickle  # noqa: E402

from distkeras import algorithms, trainers, workers  # noqa: E402
from distkeras.executor.task_spec import TaskSpec  # noqa: E402
from distkeras.utils import serialize_model  # noqa: E402
from worker_support import small_model  # noqa: E402


@pytest.fixture(scope="module")
def model_bytes():
    return serialize_model(small_model())


def test_a_spec_is_frozen(model_bytes):
    spec = TaskSpec(model_bytes=model_bytes, batch_size=16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.batch_size = 32
    assert spec.replace(batch_size=32).batch_size == 32
    assert spec.batch_size == 16  # replace made a copy


def test_a_spec_round_trips_through_sparks_closure_serialization(model_bytes):
    spec = TaskSpec(model_bytes=model_bytes, optimizer="adam", batch_size=16,
                    features_col=["a", "b"], custom_objects={}, master_host="127.0.0.1",
                    master_port=4000, token="secret", communication_window=4,
                    algorithm=algorithms.AEASGD(rho=2.0), seed_states=[np.arange(2)],
                    execution_options={"jit_compile": False})
    back = cloudpickle.loads(cloudpickle.dumps(spec))
    assert back.replace(algorithm=None, seed_states=None) == \
        spec.replace(algorithm=None, seed_states=None)
    assert back.algorithm.get_config() == spec.algorithm.get_config()
    np.testing.assert_array_equal(back.seed_states[0], spec.seed_states[0])


def test_a_worker_ships_its_spec_and_its_attributes_read_it(model_bytes):
    worker = workers.AEASGDWorker(model_bytes, batch_size=16, communication_window=4,
                                  rho=2.0, learning_rate=0.1)
    before = worker.spec
    worker.token = "secret"  # seed 000's and dist-keras's scripts set attributes
    assert worker.spec.token == "secret" and before.token is None
    shipped = cloudpickle.loads(cloudpickle.dumps(worker))
    assert shipped.spec.batch_size == shipped.batch_size == 16
    assert shipped.communication_window == 4 and shipped.token == "secret"
    assert shipped.algorithm.rho == 2.0 and shipped.spec.algorithm.learning_rate == 0.1


def test_the_token_and_the_model_stay_out_of_the_repr(model_bytes):
    text = repr(TaskSpec(model_bytes=model_bytes, token="s3cr3t-token", batch_size=8))
    assert "s3cr3t-token" not in text and "batch_size=8" in text
    assert len(text) < 1000  # not the model's bytes


def test_filled_keeps_what_the_worker_set(model_bytes):
    spec = TaskSpec(model_bytes=model_bytes, batch_size=8)
    filled = spec.filled(batch_size=32, num_epoch=3)
    assert (filled.batch_size, filled.num_epoch) == (8, 3)


@pytest.mark.parametrize("changes, message", [
    ({"batch_size": 0}, "TaskSpec.batch_size must be a positive integer"),
    ({"communication_window": 2.5}, "TaskSpec.communication_window must be a positive"),
    ({"model_bytes": "model.keras"}, "must be the bytes of a .keras archive"),
    ({"custom_objects": None}, "TaskSpec.custom_objects must be a dict"),
    ({"batchsize": 8}, "TaskSpec has no field batchsize"),
])
def test_bad_settings_are_refused_with_what_to_do(model_bytes, changes, message):
    with pytest.raises((TypeError, ValueError), match=message):
        TaskSpec(model_bytes=model_bytes).replace(**changes)


def test_a_worker_takes_only_a_spec_as_its_spec(model_bytes):
    worker = workers.Worker(model_bytes)
    with pytest.raises(TypeError, match="must be a distkeras.executor.task_spec.TaskSpec"):
        worker.spec = {"batch_size": 8}


def test_a_setting_set_before_the_workers_init_says_what_to_do(model_bytes):
    class Early(workers.NetworkWorker):
        def __init__(self, model):
            self.communication_window = 3
            super().__init__(model)

    with pytest.raises(AttributeError, match=r"must call super\(\).__init__\(model"):
        Early(model_bytes)


class SpecADAG(trainers.ADAG):
    """ADAG whose workers are handed a spec of their own: batches of 20 rows."""

    def allocate_worker(self):
        worker = super().allocate_worker()
        worker.spec = worker.spec.replace(batch_size=20)
        return worker


def test_a_worker_trains_on_spark_by_its_spec(fashion_train):
    """The trainer fills the spec (model, compile settings, columns, server address,
    token, window) and leaves what the worker's spec set: its batch size."""
    from conftest import build_mlp

    trainer = SpecADAG(keras_model=build_mlp(16), worker_optimizer="adam",
                       loss="categorical_crossentropy", num_workers=2, batch_size=32,
                       communication_window=2)
    trainer.train(fashion_train.limit(200))
    history = trainer.get_history()
    assert max(record["batch_size"] for record in history) == 20  # not the trainer's 32
    assert sum(record["batch_size"] for record in history) == 200
    steps = [sum(1 for record in history if record["worker_id"] == worker_id)
             for worker_id in (0, 1)]
    # Each worker commits after every 2 steps and after its last (the trainer's window).
    assert trainer.parameter_server.num_updates == sum((count + 1) // 2 for count in steps)
