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

from distkeras import workers  # noqa: E402
from replay_support import (  # noqa: E402
    ELASTIC_RATE, EXPERIMENTAL_RATE, LEARNING_RATE, MOMENTUM, RHO, SERVERS, WINDOW,
    assert_close, checkpoint_weights, get, keras_copy, minus, others_commit, plus,
    train_worker, windows)


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
