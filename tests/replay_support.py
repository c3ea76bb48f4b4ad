"""A worker replayed by hand against its server (tests/executor/test_workers.py and
tests/algorithms/test_algorithms.py): the settings, the server recording each commit, the
worker's minibatches by window and the model Keras compiles for the replay."""

import distkeras  # noqa: F401  (selects the JAX backend before Keras is imported)

import keras
import numpy as np

from distkeras import parameter_servers, workers
from distkeras.transport.networking import weights_array
from distkeras.utils import serialize_model
from worker_support import arrays, make_worker, record_batches, small_model

ROWS, BATCH, WINDOW = 200, 16, 3  # 13 steps: four windows of 3 and one of 1
RHO, ELASTIC_RATE, MOMENTUM = 5.0, 0.1, 0.9
EXPERIMENTAL_RATE = 0.01
LEARNING_RATE = 0.01

SERVERS = {
    workers.DOWNPOURWorker: parameter_servers.DeltaParameterServer,
    workers.ADAGWorker: parameter_servers.ADAGParameterServer,
    workers.DynSGDWorker: parameter_servers.DynSGDParameterServer,
    workers.AEASGDWorker: parameter_servers.DeltaParameterServer,
    workers.EAMSGDWorker: parameter_servers.DeltaParameterServer,
    workers.ExperimentalWorker: parameter_servers.ExperimentalParameterServer,
}
WORKER_ARGUMENTS = {
    workers.AEASGDWorker: {"rho": RHO, "learning_rate": ELASTIC_RATE},
    workers.EAMSGDWorker: {"rho": RHO, "learning_rate": ELASTIC_RATE, "momentum": MOMENTUM},
}


def checkpoint_weights():
    """The center the server starts from: not the worker's model's initial weights."""
    rng = np.random.default_rng(11)
    return weights_array([weight + rng.normal(scale=0.1, size=weight.shape).astype("float32")
                          for weight in small_model().get_weights()])


def others_commit():
    """Another worker's commit ``P``, applied right after each pull of the tested worker."""
    rng = np.random.default_rng(12)
    return weights_array([rng.normal(scale=0.05, size=weight.shape).astype("float32")
                          for weight in small_model().get_weights()])


def recording(algorithm, applied):
    """A copy of ``algorithm`` whose `apply` appends ``(update, context)`` to ``applied``
    before it applies them."""
    class Recording(type(algorithm)):
        def apply(self, center, update, context):
            applied.append((update, context))
            return super().apply(center, update, context)

    copy = Recording.__new__(Recording)
    copy.__dict__.update(vars(algorithm))
    return copy


def observed(server_cls, others):
    """``server_cls``, recording each commit's rule arguments; with ``others``, another
    worker's fresh commit (``C + others``, one update) lands after every pull."""

    class Observed(server_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.applied = []
            if not self.algorithm.adds_commits_as_sent:  # its `apply` is the rule
                self.algorithm = recording(self.algorithm, self.applied)

        def apply_rule(self, rule, *args):  # C += update, as sent
            self.applied.append(args)
            super().apply_rule(rule, *args)

        def handle_pull(self, conn, addr):
            super().handle_pull(conn, addr)
            if others is not None:
                with self.mutex:  # every rule adds a fresh commit whole
                    self.center_variable = self.center_variable + others
                    self.num_updates += 1

    return Observed


def train_worker(worker_cls, optimizer, others=None):
    """Trains one worker of ``worker_cls`` on `arrays` (``ROWS`` rows) against its server.

    Returns:
        (server, worker), both done.
    """
    server_cls = observed(SERVERS[worker_cls], others)
    model = small_model()
    model.set_weights(list(checkpoint_weights()))
    kwargs = {"learning_rate": EXPERIMENTAL_RATE} if \
        worker_cls is workers.ExperimentalWorker else {}
    server = server_cls(model, **kwargs)
    return server, run_worker(server, worker_cls, optimizer,
                              **WORKER_ARGUMENTS.get(worker_cls, {}))


def run_worker(server, worker_cls, optimizer, **kwargs):
    """Starts ``server``, trains one worker of ``worker_cls`` (``kwargs``: its own
    arguments) on `arrays` (``ROWS`` rows) against it, then stops it.

    Returns:
        The worker, done.
    """
    server.start()
    try:
        worker = make_worker(worker_cls, server, serialize_model(small_model()),
                             window=WINDOW, optimizer=optimizer, **kwargs)
        worker.run(0, record_batches(rows=ROWS), [(3,)])
        assert server.transport.wait_for_goodbyes(timeout=30)
    finally:
        server.stop()
    assert server.transport.errors == []
    return worker


def keras_copy():
    """The worker's model as Keras compiles it: its initial weights, Adam at
    ``LEARNING_RATE``."""
    model = small_model()
    model.compile(optimizer=keras.optimizers.Adam(LEARNING_RATE),
                  loss="categorical_crossentropy")
    return model


def windows():
    """The worker's minibatches, in its order, grouped by communication window."""
    x, y = arrays(ROWS)
    batches = [(x[start:start + BATCH], y[start:start + BATCH])
               for start in range(0, ROWS, BATCH)]
    return [batches[start:start + WINDOW] for start in range(0, len(batches), WINDOW)]


def get(model):
    return [np.array(weight) for weight in model.get_weights()]


def plus(a, b):
    return [x + y for x, y in zip(a, b)]


def minus(a, b):
    return [x - y for x, y in zip(a, b)]


def assert_close(got, want, what):
    assert len(got) == len(want), what
    for index, (got_part, want_part) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(got_part), want_part, rtol=2e-5, atol=2e-6,
                                   err_msg=f"{what}, weight {index}")
