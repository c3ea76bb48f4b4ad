"""Each trainer's worker, exactly: what it commits and what the server's center becomes.

A real worker trains against a real parameter server on 127.0.0.1 (no Spark). The same
minibatches are replayed through Keras's own `train_on_batch` on a copy of the model, and
the rule's arithmetic is done here by hand, in numpy (not through `update_rules`), so a
change to a worker's or a server's arithmetic fails here. The server's center starts
away from the worker's model (a checkpoint, a center other workers moved): a worker must
start from the center it pulled. With ``others``, another worker's commit ``P`` lands
right after each of this worker's pulls, so each commit meets a center that moved: the
stale paths (DynSGD's division, Experimental's damping, a pull that brings weights).
"""

import numpy as np
import pytest

keras = pytest.importorskip("keras")

from distkeras import parameter_servers, workers  # noqa: E402
from distkeras.networking import weights_array  # noqa: E402
from distkeras.utils import serialize_model  # noqa: E402
from worker_support import arrays, make_worker, record_batches, small_model  # noqa: E402

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


def observed(server_cls, others):
    """``server_cls``, recording each commit's rule arguments; with ``others``, another
    worker's fresh commit (``C + others``, one update) lands after every pull."""

    class Observed(server_cls):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.applied = []

        def apply_rule(self, rule, *args):
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
        assert server.wait_for_goodbyes(timeout=30)
    finally:
        server.stop()
    assert server.errors == []
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


def replay_commit_then_pull(worker_cls, others):
    """DOWNPOUR, ADAG, DynSGD, Experimental by hand: train a window from the pulled center
    ``S``; commit; the server applies it; pull the center and go on from it.

    Returns:
        (the server's final center, the worker's final weights, the commits sent).
    """
    model = keras_copy()
    center, count = list(checkpoint_weights()), 0
    start, pulled_count = center, count
    if others is not None:
        center, count = plus(center, others), count + 1
    model.set_weights(start)
    commits = []
    for window in windows():
        for x, y in window:
            model.train_on_batch(x, y)
        change = minus(get(model), start)
        if worker_cls in (workers.DOWNPOURWorker, workers.DynSGDWorker):
            commit = change
        else:  # ADAG and Experimental: the change averaged over the window
            commit = [part / np.float32(WINDOW) for part in change]
        if worker_cls is workers.DynSGDWorker:  # divided by the staleness + 1
            center = [c + part / np.float32(count - pulled_count + 1)
                      for c, part in zip(center, commit)]
        elif worker_cls is workers.ExperimentalWorker:  # damped by the disagreement
            center = [c + part / (np.float32(1 / EXPERIMENTAL_RATE) * (c - s) ** 2 + 1)
                      for c, part, s in zip(center, commit, start)]
        else:
            center = plus(center, commit)
        commits.append(commit)
        count += 1
        start, pulled_count = center, count
        if others is not None:
            center, count = plus(center, others), count + 1
        model.set_weights(start)
    return center, get(model), commits


def replay_elastic(worker_cls, others):
    """AEASGD and EAMSGD by hand: train a window (EAMSGD: each step at ``W + m v``, then
    ``v`` = where it ended minus ``W``); pull ``C``; ``E = rho lr (W - C)``; ``W -= E``;
    the server adds ``E``.

    Returns:
        (the server's final center, the worker's final weights, the commits sent).
    """
    model = keras_copy()
    center = list(checkpoint_weights())
    model.set_weights(center)  # the first pull
    if others is not None:
        center = plus(center, others)
    velocity = [np.zeros_like(weight) for weight in center]
    commits = []
    for window in windows():
        for x, y in window:
            if worker_cls is workers.EAMSGDWorker:
                before = get(model)
                model.set_weights([w + np.float32(MOMENTUM) * v
                                   for w, v in zip(before, velocity)])
                model.train_on_batch(x, y)
                velocity = minus(get(model), before)
            else:
                model.train_on_batch(x, y)
        pulled = center
        if others is not None:
            center = plus(center, others)
        weights = get(model)
        elastic = [np.float32(RHO * ELASTIC_RATE) * (w - c) for w, c in zip(weights, pulled)]
        model.set_weights(minus(weights, elastic))
        center = plus(center, elastic)
        commits.append(elastic)
    return center, get(model), commits


def replay(worker_cls, others):
    if worker_cls in (workers.AEASGDWorker, workers.EAMSGDWorker):
        return replay_elastic(worker_cls, others)
    return replay_commit_then_pull(worker_cls, others)


def assert_close(got, want, what):
    assert len(got) == len(want), what
    for index, (got_part, want_part) in enumerate(zip(got, want)):
        np.testing.assert_allclose(np.asarray(got_part), want_part, rtol=2e-5, atol=2e-6,
                                   err_msg=f"{what}, weight {index}")


@pytest.mark.parametrize("others", [None, others_commit()], ids=["alone", "others-commit"])
@pytest.mark.parametrize("worker_cls", list(SERVERS), ids=lambda cls: cls.__name__)
def test_a_worker_commits_and_the_center_becomes_what_its_rule_says(worker_cls, others):
    server, worker = train_worker(worker_cls, keras.optimizers.Adam(LEARNING_RATE), others)
    want_center, want_weights, want_commits = replay(worker_cls, others)
    sent = [args[0] for args in server.applied]  # each commit's update, as received
    assert len(sent) == len(want_commits) == len(windows())
    for index, (got, want) in enumerate(zip(sent, want_commits)):
        assert_close(got, want, f"commit {index}")
    assert_close(server.center_variable, want_center, "the server's center")
    assert_close(worker.model.get_weights(), want_weights, "the worker's weights")
    if worker_cls is workers.DynSGDWorker:  # each commit met one other's commit, or none
        stale = 1 if others is not None else 0
        assert [context.staleness for _, context in server.applied] == [stale] * len(sent)
    if worker_cls is workers.ExperimentalWorker:  # it sends the center it pulled
        pulled = [context.pulled for _, context in server.applied]
        assert_close(pulled[0], checkpoint_weights(), "the first pulled center")


@pytest.mark.parametrize("worker_cls", list(SERVERS), ids=lambda cls: cls.__name__)
def test_a_worker_at_learning_rate_zero_returns_the_center_it_pulled_bit_for_bit(worker_cls):
    """A resumed or retried worker starts from the server's center (the checkpoint, or
    where the others took it), not from its model's initial weights: at learning rate 0
    nothing moves, so the center comes back as it was, bit for bit."""
    server, worker = train_worker(worker_cls, keras.optimizers.SGD(0.0))
    assert len(server.applied) == len(windows())
    for got, want in zip(server.center_variable, checkpoint_weights()):
        assert got.tobytes() == want.tobytes()
    for got, want in zip(worker.model.get_weights(), checkpoint_weights()):
        assert np.asarray(got).tobytes() == want.tobytes()
