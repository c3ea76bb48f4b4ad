"""The learning rate that the driver's callbacks set reaches parameter-server workers.

`ReduceLROnPlateau` and `LearningRateScheduler` change the driver's model; the server
sends that rate with every pull and each worker gives it to its own optimizer. Over real
loopback sockets, without Spark.
"""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from distkeras import parameter_servers, workers  # noqa: E402
from distkeras.transport import exchange_checks, networking  # noqa: E402
from distkeras.utils import serialize_model  # noqa: E402
from worker_support import make_worker, record_batches, small_model  # noqa: E402


class StoppingADAGServer(parameter_servers.ADAGParameterServer):
    """Sets the workers' learning rate to 0 once ``stop_after`` commits are applied, and
    keeps each commit's center."""

    stop_after = 3

    def __init__(self, model):
        super().__init__(model)
        self.centers = []

    def handle_commit(self, conn, addr):
        super().handle_commit(conn, addr)
        with self.mutex:
            self.centers.append([np.array(layer) for layer in self.center_variable])
            if self.num_updates == self.stop_after:
                self.center.optimizer_learning_rate = 0.0


def _train_alone(server, overlap=False, worker_cls=workers.ADAGWorker):
    server.start()
    try:
        worker = make_worker(worker_cls, server, serialize_model(small_model()), overlap,
                             window=3)
        worker.run(0, record_batches(), [(3,)])
        assert server.transport.wait_for_goodbyes(timeout=10)
    finally:
        server.stop()
    return worker


@pytest.mark.parametrize("worker_cls", [workers.ADAGWorker, workers.DOWNPOURWorker,
                                        workers.AEASGDWorker])
def test_a_rate_set_before_training_reaches_the_workers_first_step(worker_cls):
    model = small_model()
    initial = model.get_weights()
    server = parameter_servers.DeltaParameterServer(model)
    server.center.optimizer_learning_rate = 0.0  # LearningRateScheduler's rate for epoch 1

    worker = _train_alone(server, worker_cls=worker_cls)

    assert float(np.asarray(worker.model.optimizer.learning_rate)) == 0.0
    assert server.num_updates > 5
    for center, start in zip(server.center_variable, initial):
        np.testing.assert_array_equal(center, start)  # Adam at rate 0 moves nothing


def test_the_worker_takes_a_new_rate_at_its_next_pull():
    server = StoppingADAGServer(small_model())

    worker = _train_alone(server)

    # 32 steps in windows of 3: eleven commits. The fourth window trained after the pull
    # that brought rate 0, so every later commit is exactly zero.
    assert len(server.centers) == 11
    assert not np.array_equal(server.centers[2][0], server.centers[1][0])
    for later in server.centers[3:]:
        for got, want in zip(later, server.centers[2]):
            np.testing.assert_array_equal(got, want)
    assert float(np.asarray(worker.model.optimizer.learning_rate)) == 0.0


def test_an_overlapped_worker_takes_it_one_window_later():
    server = StoppingADAGServer(small_model())

    _train_alone(server, overlap=True)

    # The pull that brings the rate runs while the fourth window trains: that window
    # still moves the center, the ones after it do not.
    assert not np.array_equal(server.centers[3][0], server.centers[2][0])
    for later in server.centers[4:]:
        for got, want in zip(later, server.centers[3]):
            np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("rate", ["0.1", float("nan"), True])
def test_a_rate_that_is_not_a_finite_number_is_a_protocol_error(rate):
    with pytest.raises(networking.ProtocolError, match="optimizer_learning_rate is not a "
                                                       "finite number"):
        exchange_checks.learning_rate_field({"optimizer_learning_rate": rate},
                                            "optimizer_learning_rate")
