"""The GPUs of a task as its backend sees them (`executor.devices`), without Spark: the
mapping TorchDistributor uses, the environment set and restored, and the work of a task
whose process already loaded Keras on other devices run in a fresh child process."""

import os

import pyarrow as pa
import pytest

from distkeras.errors import InvalidDataError
from distkeras.executor import devices
from worker_support import record_batches, small_model


def test_addresses_are_the_devices_when_no_devices_are_listed():
    assert devices.owned_devices(["0", "1"]) == ["0", "1"]
    assert devices.owned_devices([3]) == ["3"]


def test_addresses_index_into_an_existing_cuda_visible_devices():
    # As TorchDistributor: YARN or a container gave the executor GPUs 4, 5 and 6.
    assert devices.owned_devices(["2", "0"], "4,5,6") == ["6", "4"]
    assert devices.owned_devices(["1"], "GPU-aa, GPU-bb") == ["GPU-bb"]


@pytest.mark.parametrize("addresses, visible, says", [
    (["01"], None, "not GPU indices"),
    (["gpu0"], None, "not GPU indices"),
    (["-1"], "0,1", "not GPU indices"),
    (["2"], "4,5", "past its end"),
    (["0"], "", "has 0 entries"),
])
def test_addresses_that_name_no_device_are_refused(addresses, visible, says):
    with pytest.raises(ValueError, match=says):
        devices.owned_devices(addresses, visible)


@pytest.fixture
def clean_environment(monkeypatch):
    """No GPU settings in the environment; the record of Keras's devices emptied."""
    for name in (devices.CUDA_DEVICES, devices.JAX_FRACTION, *devices.SHARING_SETTINGS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(devices, "_LOADED", {})


def test_a_task_sees_its_devices_and_the_environment_comes_back(clean_environment,
                                                                monkeypatch):
    monkeypatch.setenv(devices.CUDA_DEVICES, "4,5,6")
    monkeypatch.setenv("TF_FORCE_GPU_ALLOW_GROWTH", "false")  # the user's: kept
    with devices.task_devices(["2"]) as task:
        assert os.environ[devices.CUDA_DEVICES] == "6" == task.devices
        assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
        assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "false"
    assert os.environ[devices.CUDA_DEVICES] == "4,5,6"
    assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ


def test_a_memory_fraction_of_the_user_replaces_on_demand_allocation(clean_environment,
                                                                     monkeypatch):
    monkeypatch.setenv(devices.JAX_FRACTION, "0.45")
    with devices.task_devices(["0"]):
        assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ
        assert os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] == "true"


def test_a_task_without_gpus_changes_nothing(clean_environment):
    before = dict(os.environ)
    with devices.task_devices([]) as task:
        assert dict(os.environ) == before
        assert task.devices is None and not task.needs_child
    assert devices.task_devices is not None and dict(os.environ) == before
    # Outside a Spark task there is no TaskContext: no GPU.
    with devices.task_devices() as task:
        assert task.devices is None


def test_keras_loaded_with_other_devices_needs_a_child(clean_environment, monkeypatch):
    import keras  # noqa: F401  (Keras loaded in this process, as in a reused worker)

    monkeypatch.setattr(devices, "_LOADED", {"devices": "0"})
    with devices.task_devices(["0"]) as task:
        assert not task.needs_child
        task.refuse_if_needs_child()
    with devices.task_devices(["1"]) as task:
        assert task.needs_child
        with pytest.raises(devices.DeviceConflictError,
                           match="spark.python.worker.reuse=false"):
            task.refuse_if_needs_child()
    # Loaded before any task pinned: with the process's own CUDA_VISIBLE_DEVICES (all).
    monkeypatch.setattr(devices, "_LOADED", {})
    with devices.task_devices(["0"]) as task:
        assert task.needs_child and task.loaded_with is None


def _rows_and_environment(batches):
    return sum(batch.num_rows for batch in batches), os.environ.get(devices.CUDA_DEVICES), \
        os.getpid()


def test_the_child_gets_the_batches_and_the_devices_and_returns_the_result(
        clean_environment, monkeypatch):
    monkeypatch.setattr(devices, "_LOADED", {"devices": "0"})
    with devices.task_devices(["1"]) as task:
        rows, seen, pid = task.call(_rows_and_environment, record_batches(rows=300))
    assert (rows, seen) == (300, "1") and pid != os.getpid()
    # No batches at all (an empty partition).
    assert devices.run_in_child(_rows_and_environment, iter([]))[0] == 0


def _epochs_and_task(batches):
    from pyspark import TaskContext

    return [None if batch is None else batch.num_rows for batch in batches], \
        TaskContext.get().partitionId()


def test_the_child_gets_the_epoch_ends_and_the_task_context(clean_environment):
    from pyspark import TaskContext

    from distkeras.executor.epochs import EPOCH_END

    task = TaskContext._getOrCreate()  # as PySpark's worker sets it up for a task
    task._partitionId = 3
    try:
        found = devices.run_in_child(_epochs_and_task,
                                     [*record_batches(rows=300), EPOCH_END,
                                      *record_batches(rows=200)])
    finally:
        TaskContext._setTaskContext(None)
    assert found == ([128, 128, 44, None, 128, 72], 3)


def _bad_rows(batches):
    next(iter(batches))
    raise InvalidDataError("row 3 holds a null")


def test_the_childs_exception_is_raised_with_its_class(clean_environment):
    many = (pa.RecordBatch.from_pydict({"x": list(range(50_000))}) for _ in range(40))
    with pytest.raises(InvalidDataError, match="row 3 holds a null"):
        devices.run_in_child(_bad_rows, many)  # stops reading: no deadlock


def test_a_worker_trains_in_the_child(clean_environment):
    from distkeras import workers
    from distkeras.keras_io.archives import serialize_model

    worker = workers.SequentialWorker(
        serialize_model(small_model()), optimizer="adam", loss="categorical_crossentropy",
        metrics=["accuracy"], features_col="features", label_col="label", batch_size=16,
        num_epoch=1)
    message = devices.run_in_child(lambda batches: worker.run(1, batches, [(3,)]),
                                   record_batches(rows=500))
    assert message["worker_id"] == 1 and message["samples"] == 500


def test_the_driver_says_where_its_keras_runs(caplog):
    import logging

    assert devices.keras_devices() == "cpu:0"  # JAX, on this machine without a GPU
    with caplog.at_level(logging.INFO, logger="distkeras.executor.devices"):
        devices.log_driver_devices("ADAG")
    assert "ADAG: the driver's Keras (validation, BatchNormalization's statistics) runs " \
        "on cpu:0; the parameter server's updates on the CPU" in caplog.text
