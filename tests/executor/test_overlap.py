"""Overlapped communication: the exchange runs while the next window trains.

One worker alone must follow exactly the path of the synchronous loop, so the server ends
with the same center, bit for bit; with two workers the center is the initial weights plus
every commit of both, and fits the data better than where it started; the worker's error
reaches the caller.
"""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from distkeras import parameter_servers, workers  # noqa: E402
from distkeras.utils import serialize_model  # noqa: E402
from worker_support import (  # noqa: E402
    arrays, make_worker, record_batches, small_model, train_together)


def _train_alone(worker_cls, server_cls, overlap):
    model = small_model()
    server = server_cls(model)
    server.start()
    try:
        worker = make_worker(worker_cls, server, serialize_model(model), overlap)
        worker.run(0, record_batches(), [(3,)])
        assert server.transport.wait_for_goodbyes(timeout=10)
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


class RecordingADAGServer(parameter_servers.ADAGParameterServer):
    """An ADAG server that keeps every update it applied, in order."""

    def __init__(self, model):
        super().__init__(model)
        self.applied = []

    def apply_rule(self, rule, *args):
        self.applied.append(args[0])
        super().apply_rule(rule, *args)


def _loss(weights, x, y):
    model = small_model()
    model.set_weights(list(weights))
    model.compile(loss="categorical_crossentropy")
    return model.evaluate(x, y, verbose=0)


def test_two_overlapped_workers_commit_everything():
    model = small_model()
    initial = model.get_weights()
    server = RecordingADAGServer(model)
    server.start()
    train_together(server, serialize_model(model), overlap=True)
    assert server.num_updates == len(server.applied) == 16  # 32 steps each, window 4
    assert sorted(worker for worker, _ in server.center.staleness) == [0] * 8 + [1] * 8
    assert {record["worker_id"] for record in server.history} == {0, 1}
    center = initial
    for update in server.applied:  # the server's own float32 additions, in its order
        center = [part + change for part, change in zip(center, update)]
    for got, want in zip(server.center_variable, center):
        np.testing.assert_array_equal(got, want)
    # Both workers' progress shows: the center fits the data better than one worker's
    # training alone (measured here), which fits it better than the initial weights.
    alone, _, _ = _train_alone(workers.ADAGWorker, parameter_servers.ADAGParameterServer,
                               False)
    x, y = (np.concatenate(parts) for parts in zip(arrays(seed=0), arrays(seed=1)))
    assert _loss(server.center_variable, x, y) < _loss(alone, x, y) < _loss(initial, x, y)


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
        worker.check_overlap()
