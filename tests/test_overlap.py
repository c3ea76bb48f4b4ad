"""Overlapped communication: the exchange runs while the next window trains.

One worker alone must follow exactly the path of the synchronous loop, so the server ends
with the same center, bit for bit; with two workers training must still converge, and the
worker's error reaches the caller.
"""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from distkeras import parameter_servers, workers  # noqa: E402
from distkeras.utils import serialize_model  # noqa: E402
from worker_support import (  # noqa: E402
    make_worker, record_batches, small_model, train_together)


def _train_alone(worker_cls, server_cls, overlap):
    model = small_model()
    server = server_cls(model)
    server.start()
    try:
        worker = make_worker(worker_cls, server, serialize_model(model), overlap)
        worker.run(0, record_batches(), [(3,)])
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
    initial = small_model().get_weights()
    assert not np.allclose(sync_center[0], initial[0])  # it did train


def test_two_overlapped_workers_commit_everything():
    model = small_model()
    server = parameter_servers.ADAGParameterServer(model)
    server.start()
    train_together(server, serialize_model(model), overlap=True)
    assert server.num_updates == 16
    assert {record["worker_id"] for record in server.history} == {0, 1}


def test_a_failed_exchange_reaches_the_worker():
    model = small_model()
    server = parameter_servers.ADAGParameterServer(model)
    server.start()
    worker = make_worker(workers.ADAGWorker, server, serialize_model(model), True)
    original = worker.pull_unless_own
    calls = []

    def pull_then_break():
        calls.append(1)
        if len(calls) == 2:  # the second background exchange
            raise ConnectionResetError("the server went away")
        return original()

    worker.pull_unless_own = pull_then_break
    try:
        with pytest.raises(ConnectionResetError, match="went away"):
            worker.run(0, record_batches(), [(3,)])
    finally:
        server.stop()


def test_a_worker_without_window_update_refuses_to_overlap():
    model = small_model()
    worker = workers.AEASGDWorker(serialize_model(model))
    with pytest.raises(ValueError, match="cannot overlap"):
        worker._check_overlap()
