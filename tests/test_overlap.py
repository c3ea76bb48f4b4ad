"""Overlapped communication: the exchange runs while the next window trains.

One worker alone must follow exactly the path of the synchronous loop, so the server ends
with the same center, bit for bit; with two workers training must still converge, and the
worker's error reaches the caller.
"""

import threading

import numpy as np
import pyarrow as pa
import pytest

keras = pytest.importorskip("keras")

from distkeras import parameter_servers, workers  # noqa: E402
from distkeras.utils import serialize_model  # noqa: E402


def _model():
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")])


def _record_batches(rows=500, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 6)).astype("float32")
    y = np.eye(3, dtype="float32")[(x[:, 0] > 0).astype(int) + (x[:, 1] > 1).astype(int)]
    for start in range(0, rows, 128):  # several record batches, a ragged last minibatch
        yield pa.RecordBatch.from_arrays(
            [pa.FixedSizeListArray.from_arrays(pa.array(x[start:start + 128].ravel()), 6),
             pa.FixedSizeListArray.from_arrays(pa.array(y[start:start + 128].ravel()), 3)],
            names=["features", "label"])


def _worker(cls, server, model_bytes, overlap, worker_id=0):
    worker = cls(model_bytes, optimizer="adam", loss="categorical_crossentropy",
                 metrics=["accuracy"], features_col="features", label_col="label",
                 batch_size=16, num_epoch=1, master_host="127.0.0.1",
                 master_port=server.port, communication_window=4)
    worker.token = server.token
    worker.overlap_communication = overlap
    worker.worker_id = worker_id
    return worker


def _train_alone(worker_cls, server_cls, overlap):
    model = _model()
    server = server_cls(model)
    server.start()
    try:
        worker = _worker(worker_cls, server, serialize_model(model), overlap)
        worker.run(0, _record_batches(), [(3,)])
        assert server.wait_for_goodbyes(timeout=10)
        return list(server.center_variable), server.num_updates, len(server.history)
    finally:
        server.stop()


@pytest.mark.parametrize("worker_cls, server_cls", [
    (workers.ADAGWorker, parameter_servers.ADAGParameterServer),
    (workers.DOWNPOURWorker, parameter_servers.DeltaParameterServer),
])
def test_one_worker_follows_the_synchronous_path_exactly(worker_cls, server_cls):
    sync_center, sync_updates, sync_steps = _train_alone(worker_cls, server_cls, False)
    overlap_center, overlap_updates, overlap_steps = _train_alone(worker_cls, server_cls, True)
    assert overlap_updates == sync_updates == 8  # 32 steps, window 4
    assert overlap_steps == sync_steps == 32     # every step's record reached the driver
    for synchronous, overlapped in zip(sync_center, overlap_center):
        np.testing.assert_array_equal(overlapped, synchronous)
    initial = _model().get_weights()
    assert not np.allclose(sync_center[0], initial[0])  # it did train


def test_two_overlapped_workers_commit_everything():
    model = _model()
    server = parameter_servers.ADAGParameterServer(model)
    server.start()
    model_bytes = serialize_model(model)
    errors = []

    def run(worker_id):
        try:
            worker = _worker(workers.ADAGWorker, server, model_bytes, True, worker_id)
            worker.run(worker_id, _record_batches(seed=worker_id), [(3,)])
        except Exception as error:  # noqa: BLE001 - reported to the test thread below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(2)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert server.wait_for_goodbyes(timeout=10)
    finally:
        server.stop()
    assert not errors
    assert server.num_updates == 16
    assert {record["worker_id"] for record in server.history} == {0, 1}


def test_a_failed_exchange_reaches_the_worker():
    model = _model()
    server = parameter_servers.ADAGParameterServer(model)
    server.start()
    worker = _worker(workers.ADAGWorker, server, serialize_model(model), True)
    original = worker.pull
    calls = []

    def pull_then_break():
        calls.append(1)
        if len(calls) == 3:  # the second background exchange
            raise ConnectionResetError("the server went away")
        original()

    worker.pull = pull_then_break
    try:
        with pytest.raises(ConnectionResetError, match="went away"):
            worker.run(0, _record_batches(), [(3,)])
    finally:
        server.stop()


def test_a_worker_without_window_update_refuses_to_overlap():
    model = _model()
    worker = workers.AEASGDWorker(serialize_model(model))
    with pytest.raises(ValueError, match="cannot overlap"):
        worker._check_overlap()
