"""Pulls that skip the weights when only the worker's own commit moved the center.

A DOWNPOUR or ADAG worker whose commit is the only update since its last pull is told
"unchanged" and adds its update to its center itself, as the server did: a lone worker
gets the weights once. Its center must stay exactly the server's, and training must end
where the path that pulls the weights every time ends.
"""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from distkeras import parameter_servers, workers  # noqa: E402
from distkeras.utils import serialize_model  # noqa: E402
from worker_support import (  # noqa: E402
    make_worker, record_batches, small_model, train_together)


class CountingADAGServer(parameter_servers.ADAGParameterServer):
    """An ADAG server that counts the pulls that sent the weights."""

    weights_sent = 0

    def handle_pull(self, conn, addr):
        self.weights_sent += 1
        super().handle_pull(conn, addr)


class AlwaysSendingWorker(workers.ADAGWorker):
    """ADAG's worker with plain pulls: the weights come back every window."""

    def pull_unless_own(self):
        self.pull()
        return False


def _train_alone(worker_cls=workers.ADAGWorker, server_cls=CountingADAGServer, window=3,
                 overlap=False):
    model = small_model()
    server = server_cls(model)
    server.start()
    try:
        worker = make_worker(worker_cls, server, serialize_model(model), overlap,
                             window=window)
        worker.run(0, record_batches(), [(3,)])
        assert server.transport.wait_for_goodbyes(timeout=10)
        return server, [np.array(weight) for weight in worker.model.get_weights()], worker
    finally:
        server.stop()


def test_lone_worker_gets_the_weights_once_and_keeps_the_servers_center_exactly():
    server, final, worker = _train_alone()
    assert server.num_updates == 11  # 32 steps, window 3: ten full windows and the rest
    assert server.weights_sent == 1  # the first pull only
    for weight, center, pulled in zip(final, server.center_variable, worker.center_variable):
        np.testing.assert_array_equal(weight, center)
        np.testing.assert_array_equal(pulled, center)
    assert not np.allclose(final[0], small_model().get_weights()[0])  # it did train


def test_an_overlapped_lone_worker_gets_the_weights_once_too():
    server, final, _ = _train_alone(overlap=True)
    synchronous, synchronous_final, _ = _train_alone()
    assert server.weights_sent == 1 and server.num_updates == 11
    for got, want in zip(server.center_variable, synchronous.center_variable):
        np.testing.assert_array_equal(got, want)


def test_skipping_the_weights_ends_where_pulling_them_ends():
    skipping, skipping_final, _ = _train_alone()
    pulling, pulling_final, _ = _train_alone(AlwaysSendingWorker)
    assert pulling.weights_sent == pulling.num_updates + 1
    for got, want in zip(skipping.center_variable, pulling.center_variable):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(skipping_final, pulling_final):
        np.testing.assert_array_equal(got, want)


def test_a_rescaling_server_always_sends_the_weights():
    class CountingDynSGDServer(parameter_servers.DynSGDParameterServer):
        weights_sent = 0

        def handle_pull(self, conn, addr):
            self.weights_sent += 1
            super().handle_pull(conn, addr)

    server, final, _ = _train_alone(workers.DynSGDWorker, CountingDynSGDServer)
    assert server.weights_sent == server.num_updates + 1 == 12
    for weight, center in zip(final, server.center_variable):
        np.testing.assert_array_equal(weight, center)


def test_two_workers_commit_everything_and_the_last_holds_the_final_center():
    model = small_model()
    server = CountingADAGServer(model)
    server.start()
    trained = train_together(server, serialize_model(model))
    assert server.num_updates == 16
    # The worker that pulled last holds the final center, told "unchanged" or not.
    last = max(trained, key=lambda worker: worker.last_update)
    for center, pulled in zip(server.center_variable, last.center_variable):
        np.testing.assert_array_equal(pulled, center)


def test_a_worker_reads_replies_as_large_as_its_model(monkeypatch):
    """A worker read its server's frames under a fixed limit (2 GiB) while the server's
    grows with the model, so a model past it (SingleTrainer's epoch server sends about
    180M float32 weights with Adam's state in 2 GiB) could not come back. Here that fixed
    limit is 1 KiB and the model's weights 1.4 MB: pulled whole every window."""
    from distkeras.transport import networking

    monkeypatch.setattr(networking, "DEFAULT_MAX_FRAME_BYTES", 1024)
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(600, activation="relu"),
                              keras.layers.Dense(600, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    assert sum(weight.nbytes for weight in model.get_weights()) > (1 << 20) + 1024
    server = CountingADAGServer(model)
    server.start()
    try:
        worker = make_worker(AlwaysSendingWorker, server, serialize_model(model), window=8)
        worker.run(0, record_batches(rows=256), [(3,)])
        assert server.transport.wait_for_goodbyes(timeout=10)
        assert server.weights_sent == server.num_updates + 1 == 3  # 16 steps, window 8
        for pulled, center in zip(worker.center_variable, server.center_variable):
            np.testing.assert_array_equal(pulled, center)
    finally:
        server.stop()
