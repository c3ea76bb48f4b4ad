"""The update-rule family: golden values for every rule in `update_rules`, EAMSGD's momentum
(by hand and through a real worker step), and the DynSGD / Experimental / Delta servers over
real loopback sockets, including lying clients and concurrent commits. No Spark.

All numbers are exact binary fractions (or quotients that are exact in float32), so most
comparisons are exact.
"""

import sys
import threading
import time

import distkeras  # noqa: F401  (selects the JAX backend before Keras is imported)

import keras
import numpy as np
import pytest

from distkeras.transport import networking
from distkeras.algorithms import update_rules
from distkeras.networking import recv_data, send_data
from distkeras.transport.networking import weights_array
from distkeras.parameter_servers import (
    ADAGParameterServer,
    DeltaParameterServer,
    DynSGDParameterServer,
    ExperimentalParameterServer,
)
from distkeras.executor.replica import ModelReplica
from distkeras.workers import AEASGDWorker, DynSGDWorker, EAMSGDWorker, ExperimentalWorker
from ps_support import BIAS, KERNEL, expect_closed_by_server, make_model

F32 = np.float32


# -- helpers ------------------------------------------------------------------------------


def w2(layer0, layer1, dtype=F32):
    """Two layers of different shapes, (2, 2) and (3,), as a weights object array."""
    return weights_array([np.array(layer0, dtype), np.array(layer1, dtype)])


def snapshot(weights):
    return [np.array(layer, copy=True) for layer in weights]


def assert_weights_equal(got, want):
    assert len(got) == len(want)
    for got_layer, want_layer in zip(got, want):
        got_layer, want_layer = np.asarray(got_layer), np.asarray(want_layer)
        assert got_layer.shape == want_layer.shape
        np.testing.assert_array_equal(got_layer, want_layer)


def assert_float32(weights):
    assert [np.asarray(layer).dtype for layer in weights] == [F32] * len(weights)


# -- 1. golden values for every update rule --------------------------------------------------

W = w2([[1.0, 2.0], [-1.0, 0.5]], [0.25, -0.75, 3.0])
C = w2([[0.5, 2.0], [1.0, -0.5]], [0.25, 0.25, -1.0])


def test_elastic_difference_golden():
    weights, center = snapshot(W), snapshot(C)
    # rho * lr = 5 * 0.1 = 0.5 (exactly, in binary); W - C = [[0.5, 0], [-2, 1]], [0, -1, 4].
    elastic = update_rules.elastic_difference(W, C, rho=5.0, learning_rate=0.1)
    assert_weights_equal(elastic, [[[0.25, 0.0], [-1.0, 0.5]], [0.0, -0.5, 2.0]])
    assert_float32(elastic)
    # The worker's W - E and the server's C + E move towards each other by the same E.
    assert_weights_equal(W - elastic, [[[0.75, 2.0], [0.0, 0.0]], [0.25, -0.25, 1.0]])
    assert_weights_equal(C + elastic, [[[0.75, 2.0], [0.0, 0.0]], [0.25, -0.25, 1.0]])
    # rho * lr = 1: the elastic force is the whole difference.
    assert_weights_equal(update_rules.elastic_difference(W, C, rho=2.0, learning_rate=0.5),
                         [[[0.5, 0.0], [-2.0, 1.0]], [0.0, -1.0, 4.0]])
    assert_weights_equal(W, weights)
    assert_weights_equal(C, center)


def test_lookahead_golden():
    weights = snapshot(W)
    velocity = w2([[0.5, -1.0], [2.0, 0.0]], [1.0, -0.5, 0.25])
    velocity_before = snapshot(velocity)
    look = update_rules.lookahead(W, velocity, 0.5)
    assert_weights_equal(look, [[[1.25, 1.5], [0.0, 0.5]], [0.75, -1.0, 3.125]])
    assert_float32(look)
    look = update_rules.lookahead(W, velocity, 0.25)
    assert_weights_equal(look, [[[1.125, 1.75], [-0.5, 0.5]], [0.5, -0.875, 3.0625]])
    # No momentum: the look-ahead point is the weights themselves, in a new array.
    look = update_rules.lookahead(W, velocity, 0.0)
    assert_weights_equal(look, weights)
    assert look is not W
    assert_weights_equal(W, weights)
    assert_weights_equal(velocity, velocity_before)


def test_momentum_velocity_golden():
    weights, center = snapshot(W), snapshot(C)
    old_velocity = w2([[100.0, 100.0], [100.0, 100.0]], [100.0, 100.0, 100.0])
    # The new velocity is where the step ended minus where it started; the old one only
    # entered through the look-ahead point.
    velocity = update_rules.momentum_velocity(old_velocity, W, C)
    assert_weights_equal(velocity, [[[-0.5, 0.0], [2.0, -1.0]], [0.0, 1.0, -4.0]])
    assert_float32(velocity)
    assert_weights_equal(W, weights)
    assert_weights_equal(C, center)
    assert_weights_equal(old_velocity, [np.full((2, 2), 100.0), np.full(3, 100.0)])


def test_dynsgd_update_golden():
    center = snapshot(C)
    delta = w2([[1.0, -2.0], [0.5, 4.0]], [0.25, -1.0, 8.0])
    delta_before = snapshot(delta)
    # 7 updates made, the worker saw 4: staleness 3, divided by 3 + 1 = 4.
    result = update_rules.dynsgd_update(C, delta, 7, 4)
    assert_weights_equal(result, [[[0.75, 1.5], [1.125, 0.5]], [0.3125, 0.0, 1.0]])
    assert_float32(result)
    # A fresh worker (num_updates == last_update): divided by 1, the whole delta.
    result = update_rules.dynsgd_update(C, delta, 5, 5)
    assert_weights_equal(result, [[[1.5, 0.0], [1.5, 3.5]], [0.5, -0.75, 7.0]])
    assert_float32(result)
    # 1 update since the pull: halved.
    result = update_rules.dynsgd_update(C, delta, 1, 0)
    assert_weights_equal(result, [[[1.0, 1.0], [1.25, 1.5]], [0.375, -0.25, 3.0]])
    assert_weights_equal(C, center)
    assert_weights_equal(delta, delta_before)


def test_dynsgd_adds_non_trainable_changes_whole():
    # The second weight is state the workers measure (a BatchNorm statistic, a counter):
    # divided by the staleness, it lagged what the workers measured (as ADAG's once did).
    delta = w2([[1.0, -2.0], [0.5, 4.0]], [0.25, -1.0, 8.0])
    result = update_rules.dynsgd_update(C, delta, 7, 4, trainable=[True, False])
    assert_weights_equal(result, [[[0.75, 1.5], [1.125, 0.5]], [0.5, -0.75, 7.0]])
    assert_float32(result)
    assert_weights_equal(update_rules.dynsgd_update(C, delta, 7, 4, trainable=[True, True]),
                         update_rules.dynsgd_update(C, delta, 7, 4))
    with pytest.raises(ValueError, match="1 trainable flags for 2 weights"):
        update_rules.dynsgd_update(C, delta, 7, 4, trainable=[True])
    # The server applies it with its model's flags (BatchNorm's moving mean and variance).
    model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization()])
    assert DynSGDParameterServer(model).trainable == [True, True, False, False]


# C - C_stale differs per element: [[0, 1], [-1, 2]] and [0.5, -2, 0].
EXP_STALE = w2([[0.5, 1.0], [2.0, -2.5]], [-0.25, 2.25, -1.0])
EXP_RESIDUAL = w2([[0.75, 3.0], [-6.0, 45.0]], [3.75, 45.0, -0.5])


@pytest.mark.parametrize("learning_rate, want", [
    # lr = 1:   denominators (D**2 + 1)   = [[1, 2], [2, 5]], [1.25, 5, 1]
    #           residual / denominator    = [[0.75, 1.5], [-3, 9]], [3, 9, -0.5]
    (1.0, [[[1.25, 3.5], [-2.0, 8.5]], [3.25, 9.25, -1.5]]),
    # lr = 0.5: denominators (2*D**2 + 1) = [[1, 3], [3, 9]], [1.5, 9, 1]
    #           residual / denominator    = [[0.75, 1], [-2, 5]], [2.5, 5, -0.5]
    (0.5, [[[1.25, 3.0], [-1.0, 4.5]], [2.75, 5.25, -1.5]]),
])
def test_experimental_update_golden_elementwise(learning_rate, want):
    center, stale, residual = snapshot(C), snapshot(EXP_STALE), snapshot(EXP_RESIDUAL)
    result = update_rules.experimental_update(C, EXP_RESIDUAL, EXP_STALE, learning_rate)
    assert_weights_equal(result, want)
    assert_float32(result)
    assert_weights_equal(C, center)
    assert_weights_equal(EXP_STALE, stale)
    assert_weights_equal(EXP_RESIDUAL, residual)


def test_experimental_update_without_disagreement_adds_residual():
    result = update_rules.experimental_update(C, EXP_RESIDUAL, C, 0.001)
    assert_weights_equal(result, C + EXP_RESIDUAL)


def test_experimental_update_adds_non_trainable_residuals_undamped():
    # The second weight is state the workers measure (a BatchNorm statistic): damped by the
    # disagreement, the center would lag what the workers measured.
    result = update_rules.experimental_update(C, EXP_RESIDUAL, EXP_STALE, 1.0,
                                              trainable=[True, False])
    # First weight as in the golden test at lr 1; second: C + residual, undamped.
    assert_weights_equal(result, [[[1.25, 3.5], [-2.0, 8.5]], [4.0, 45.25, -1.5]])
    assert_float32(result)
    model = keras.Sequential([keras.Input((3,)), keras.layers.BatchNormalization()])
    assert ExperimentalParameterServer(model).trainable == [True, True, False, False]


def test_average_weights_golden():
    a = w2([[1.0, 2.0], [0.0, -3.0]], [0.5, 1.0, 6.0])
    b = w2([[2.0, 0.5], [3.0, 0.0]], [0.25, -1.0, 0.0])
    c = w2([[0.0, 0.5], [-1.5, 0.0]], [0.75, 0.75, -3.0])
    before = [snapshot(x) for x in (a, b, c)]
    # Sums [[3, 3], [1.5, -3]], [1.5, 0.75, 3]; divided by 3.
    want = [[[1.0, 1.0], [0.5, -1.0]], [0.5, 0.25, 1.0]]
    mean = update_rules.average_weights([a, b, c])
    assert_weights_equal(mean, want)
    assert_float32(mean)
    assert_weights_equal(update_rules.average_weights(x for x in (c, a, b)), want)
    for x, x_before in zip((a, b, c), before):
        assert_weights_equal(x, x_before)
    single = update_rules.average_weights([a])
    assert_weights_equal(single, before[0])
    assert all(new is not old for new, old in zip(single, a))


def test_rules_keep_integer_state_in_its_dtype():
    # A Normalization layer's count is int32 state: scaled or divided, it stays int32 (the
    # server refuses a float64 array where the model holds int32), rounded.
    weights = weights_array([np.array([1.0, 2.0], F32), np.array(7, np.int32)])
    center = weights_array([np.array([0.0, 2.0], F32), np.array(4, np.int32)])
    results = {
        "elastic": update_rules.elastic_difference(weights, center, 5.0, 0.1),
        "dynsgd": update_rules.dynsgd_update(center, weights, 3, 1),
        "experimental": update_rules.experimental_update(center, weights, center, 1.0),
        "average": update_rules.average_weights([weights, center]),
        "adag": update_rules.adag_residual(weights, center, 2),
    }
    want = {"elastic": ([0.5, 0.0], 2), "dynsgd": ([1.0 / 3, 2.0 + 2.0 / 3], 6),
            "experimental": ([1.0, 4.0], 11), "average": ([0.5, 2.0], 6),
            "adag": ([0.5, 0.0], 2)}
    for name, result in results.items():
        assert [np.asarray(part).dtype for part in result] == [F32, np.int32], name
        np.testing.assert_allclose(result[0], want[name][0], rtol=1e-6)
        assert int(result[1]) == want[name][1], name


# -- 2. EAMSGD momentum ---------------------------------------------------------------------


def test_eamsgd_momentum_by_hand():
    """Three EAMSGD local steps with the stand-in optimizer step s(W) = -0.1 * W, m = 0.9.

    W0 = 1, v0 = 0
    step 1: look = 1 + 0.9 * 0            = 1
            after = 1 - 0.1                 = 0.9     v = 0.9 - 1       = -0.1
    step 2: look = 0.9 + 0.9 * -0.1       = 0.81
            after = 0.81 - 0.081            = 0.729   v = 0.729 - 0.9   = -0.171
    step 3: look = 0.729 + 0.9 * -0.171   = 0.729 - 0.1539 = 0.5751
            after = 0.5751 - 0.05751        = 0.51759 v = 0.51759 - 0.729 = -0.21141
    The second layer starts at -2 and is scaled by the same factors (x -2).
    """
    momentum = 0.9
    weights = weights_array([np.array([1.0]), np.array([[-2.0]])])
    velocity = weights * 0.0
    trace = []
    for _ in range(3):
        look = update_rules.lookahead(weights, velocity, momentum)
        after = look + (-0.1) * look
        velocity = update_rules.momentum_velocity(velocity, weights, after)
        weights = after
        trace.append((float(look[0][0]), float(weights[0][0]), float(velocity[0][0])))
    want = [(1.0, 0.9, -0.1), (0.81, 0.729, -0.171), (0.5751, 0.51759, -0.21141)]
    np.testing.assert_allclose(np.array(trace), np.array(want), rtol=1e-12)
    np.testing.assert_allclose(weights[1], [[-2 * 0.51759]], rtol=1e-12)
    np.testing.assert_allclose(velocity[1], [[-2 * -0.21141]], rtol=1e-12)
    # Without momentum the same three steps give 0.9**3 = 0.729: momentum went further.
    assert weights[0][0] < 0.729 - 0.2


KERNEL0 = np.array([[0.5], [-0.25]], np.float32)
X_BATCH = np.array([[1.0, 2.0], [0.5, -1.0], [-1.5, 0.25], [2.0, 1.0]], np.float32)
Y_BATCH = np.array([[1.0], [-0.5], [0.25], [2.0]], np.float32)


def compiled_linear_model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False)])
    model.set_weights([KERNEL0])
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=0.1), loss="mse")
    return model


def numpy_eamsgd(kernel, steps, lr=0.1, momentum=0.9):
    """SGD on mse at the look-ahead point; returns (weights, velocity) after ``steps``."""
    x, y = X_BATCH.astype(np.float64), Y_BATCH.astype(np.float64)
    weights = kernel.astype(np.float64)
    velocity = np.zeros_like(weights)
    for _ in range(steps):
        look = weights + momentum * velocity
        grad = 2.0 / x.shape[0] * x.T @ (x @ look - y)  # mse: mean over batch and outputs
        after = look - lr * grad
        velocity = after - weights
        weights = after
    return weights, velocity


def test_eamsgd_worker_train_step_matches_numpy():
    model = compiled_linear_model()
    worker = EAMSGDWorker(model, rho=5.0, learning_rate=0.1, momentum=0.9)
    worker.model = ModelReplica(model, worker._record_step)
    for _ in range(3):
        worker.train_step(X_BATCH, Y_BATCH)
    got = worker.model.get_weights()
    want, want_velocity = numpy_eamsgd(KERNEL0, 3)
    assert len(got) == 1
    np.testing.assert_allclose(got[0], want, atol=1e-5, rtol=0)
    np.testing.assert_allclose(worker.velocity[0], want_velocity, atol=1e-5, rtol=0)
    assert got[0].dtype == np.float32
    # The momentum matters here: plain SGD ends somewhere measurably different.
    plain, _ = numpy_eamsgd(KERNEL0, 3, momentum=0.0)
    assert np.abs(plain - want).max() > 1e-2
    assert worker.history.size == 3


# -- 3. servers over real loopback sockets ----------------------------------------------------



def layers(kernel, bias):
    return weights_array([np.array(kernel, F32), np.array(bias, F32)])


def full(kernel_value, bias_value):
    return layers(np.full((3, 2), kernel_value), np.full(2, bias_value))


def initial():
    return layers(KERNEL, BIAS)


class Client:
    """A fake worker speaking the wire protocol on its own socket."""

    def __init__(self, server, worker_id):
        self.sock = networking.connect("127.0.0.1", server.port, timeout=5)
        self.sock.settimeout(10)
        networking.authenticate(self.sock, server.token, worker_id)
        self.last_update = None

    def pull(self):
        networking.send_action(self.sock, networking.ACTION_PULL)
        data = recv_data(self.sock)
        self.last_update = data["num_updates"]
        return data

    def commit(self, message):
        networking.send_action(self.sock, networking.ACTION_COMMIT)
        send_data(self.sock, message)

    def quit(self):
        networking.send_action(self.sock, networking.ACTION_QUIT)
        networking.close_socket(self.sock)


def center_of(server):
    with server.mutex:
        return snapshot(server.center_variable)


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


# -- DynSGD -----------------------------------------------------------------------------------


def b_delta(k):
    return full(0.5 * (k + 1), -0.25)


def fresh_commits_by_b(server, worker_id=2):
    """B pulls and commits three times, each with the last_update of its fresh pull."""
    b = Client(server, worker_id)
    for k in range(3):
        pulled = b.pull()
        assert pulled["num_updates"] == k
        b.commit({"delta": b_delta(k), "last_update": b.last_update})
    assert b.pull()["num_updates"] == 3  # the pull is answered after the commit was applied
    b.quit()
    # Each was fresh (divided by 1): kernel + 0.5 + 1 + 1.5, bias - 0.75.
    return [KERNEL + F32(3.0), BIAS - F32(0.75)]


A_DELTA = layers([[4.0, -8.0], [2.0, 1.0], [0.0, 0.5]], [-4.0, 12.0])
A_DELTA_QUARTER = [np.array([[1.0, -2.0], [0.5, 0.25], [0.0, 0.125]], F32),
                   np.array([-1.0, 3.0], F32)]


def test_dynsgd_stale_commit_is_divided_by_staleness_plus_one(servers):
    server = servers(DynSGDParameterServer)
    a = Client(server, 1)
    assert a.pull()["num_updates"] == 0
    after_b = fresh_commits_by_b(server)
    assert_weights_equal(server.center_variable, after_b)
    assert server.center.staleness == [(2, 0), (2, 0), (2, 0)]
    # A saw 0 updates; 3 were made since: A's delta counts 1 / (3 + 1).
    a.commit({"delta": A_DELTA, "last_update": 0})
    pulled = a.pull()
    a.quit()
    want = [after_b[0] + A_DELTA_QUARTER[0], after_b[1] + A_DELTA_QUARTER[1]]
    assert_weights_equal(pulled["center"], want)
    assert_weights_equal(server.center_variable, want)
    assert_float32(server.center_variable)
    assert pulled["num_updates"] == 4
    assert server.num_updates == 4
    assert server.center.staleness == [(2, 0), (2, 0), (2, 0), (1, 3)]
    assert server.transport.errors == []


@pytest.mark.parametrize("last_update, divisor", [
    (0, 4),  # honest: saw 0 of 3
    (2, 2),  # honest-looking: saw 2 of 3
    (3, 1),  # fresh
    # A count larger than num_updates is clamped to num_updates: treated as fresh (/1).
    (4, 1),
    (100, 1),
    (2**70, 1),
    # A negative count is clamped to 0: treated as having seen nothing (/ (3 + 1)).
    (-1, 4),
    (-3, 4),
])
def test_dynsgd_clamps_lying_last_update(servers, last_update, divisor):
    server = servers(DynSGDParameterServer)
    liar = Client(server, 7)  # connects first but never pulls
    after_b = fresh_commits_by_b(server)
    liar.commit({"delta": A_DELTA, "last_update": last_update})
    pulled = liar.pull()
    liar.quit()
    want = [after_b[0] + A_DELTA[0] / F32(divisor), after_b[1] + A_DELTA[1] / F32(divisor)]
    assert_weights_equal(pulled["center"], want)
    assert_weights_equal(server.center_variable, want)
    assert_float32(server.center_variable)
    assert server.num_updates == 4
    # The recorded staleness is the server's own count since this connection's last pull
    # (it never pulled: 3), whatever the client claimed.
    assert server.center.staleness[-1] == (7, 3)
    assert server.transport.errors == []


@pytest.mark.parametrize("extra", [
    {},                          # missing
    {"last_update": None},
    {"last_update": 1.5},
    {"last_update": 2.0},        # a float, even a whole one, is not a count
    {"last_update": "1"},
    {"last_update": True},       # bool is not an int here
    {"last_update": [1]},
], ids=["missing", "none", "float", "whole-float", "string", "bool", "list"])
def test_dynsgd_commit_without_int_last_update_is_refused(servers, extra):
    server = servers(DynSGDParameterServer)
    after_b = fresh_commits_by_b(server)
    bad = Client(server, 9)
    bad.pull()
    bad.commit({"delta": A_DELTA, **extra})
    expect_closed_by_server(bad.sock)
    assert_weights_equal(center_of(server), after_b)
    assert server.num_updates == 3
    assert len(server.center.staleness) == 3
    assert server.transport.errors == []
    # The server still serves honest workers.
    good = Client(server, 10)
    good.pull()
    good.commit({"delta": full(1.0, 1.0), "last_update": good.last_update})
    pulled = good.pull()
    good.quit()
    assert pulled["num_updates"] == 4
    assert_weights_equal(pulled["center"], [after_b[0] + F32(1.0), after_b[1] + F32(1.0)])


def test_dynsgd_worker_commits_its_last_update(servers):
    """A real DynSGDWorker sends the count of its last pull: its deltas count 1/4, then 1/2."""
    server = servers(DynSGDParameterServer)
    model = make_model()
    model.compile(optimizer="sgd", loss="mse")
    worker = DynSGDWorker(model)
    worker.model = ModelReplica(model, worker._record_step)
    worker.master_host, worker.master_port, worker.token = "127.0.0.1", server.port, server.token
    worker.worker_id, worker.connect_timeout = 5, 5.0
    worker.setup()
    try:
        worker.pull()
        assert worker.last_update == 0
        after_b = fresh_commits_by_b(server)
        worker.model.set_weights(initial() + A_DELTA)  # W - W_pull == A_DELTA
        worker.communicate()  # commit (W - W_pull, last_update=0), then pull
        want = [after_b[0] + A_DELTA_QUARTER[0], after_b[1] + A_DELTA_QUARTER[1]]
        assert worker.last_update == 4
        assert_weights_equal(worker.center_variable, want)
        assert_weights_equal(worker.model.get_weights(), want)
        assert_weights_equal(server.center_variable, want)
        assert server.center.staleness[-1] == (5, 3)
        # Second window: the worker's pull saw 4; one more update by another client, so
        # this delta counts 1 / (5 - 4 + 1) = 1/2.
        other = Client(server, 11)
        other.pull()
        other.commit({"delta": full(1.0, 1.0), "last_update": other.last_update})
        other.pull()
        other.quit()
        worker.model.set_weights(worker.center_variable + A_DELTA)
        worker.communicate()
        want = [layer + F32(1.0) + delta / F32(2) for layer, delta in zip(want, A_DELTA)]
        assert worker.last_update == 6
        assert_weights_equal(worker.center_variable, want)
        assert_weights_equal(server.center_variable, want)
        assert server.center.staleness[-1] == (5, 1)
    finally:
        worker.teardown()
    assert server.transport.errors == []


# -- Experimental -------------------------------------------------------------------------

# C - C_stale per element: kernel [[0, 1], [-1, 2], [0.5, 0]], bias [-2, 1].
SRV_STALE = layers([[0.5, -2.0], [1.25, 0.0], [-1.25, 0.0]], [2.125, -1.5])
SRV_RESIDUAL = layers([[0.75, 3.0], [-6.0, 45.0], [3.75, -0.5]], [45.0, -6.0])


def test_experimental_server_applies_elementwise_rule(servers):
    server = servers(ExperimentalParameterServer, learning_rate=1.0)
    client = Client(server, 3)
    client.commit({"delta": SRV_RESIDUAL, "center": SRV_STALE})
    pulled = client.pull()
    client.quit()
    # Denominators (C - C_stale)**2 + 1 = [[1, 2], [2, 5], [1.25, 1]], [5, 2];
    # residual / denominator = [[0.75, 1.5], [-3, 9], [3, -0.5]], [9, -3]; plus C.
    want = [np.array([[1.25, 0.5], [-2.75, 11.0], [2.25, -0.5]], F32),
            np.array([9.125, -3.5], F32)]
    assert_weights_equal(pulled["center"], want)
    assert_weights_equal(server.center_variable, want)
    assert_float32(server.center_variable)
    assert server.num_updates == 1
    assert server.center.staleness == [(3, 0)]
    assert server.transport.errors == []


@pytest.mark.parametrize("message", [
    {"delta": SRV_RESIDUAL},
    {"delta": SRV_RESIDUAL, "center": None},
    {"delta": SRV_RESIDUAL, "center": 1.0},
    {"delta": SRV_RESIDUAL, "center": np.ones(2, F32)},
    {"delta": SRV_RESIDUAL, "center": [np.ones((2, 3), F32), np.ones(2, F32)]},
    {"center": SRV_STALE},
], ids=["missing-center", "none-center", "scalar-center", "single-array-center",
        "misshapen-center", "missing-delta"])
def test_experimental_server_refuses_incomplete_commit(servers, message):
    server = servers(ExperimentalParameterServer, learning_rate=1.0)
    before = center_of(server)
    client = Client(server, 3)
    client.commit(message)
    expect_closed_by_server(client.sock)
    assert_weights_equal(center_of(server), before)
    assert server.num_updates == 0
    assert server.center.staleness == []
    assert server.transport.errors == []


def test_experimental_worker_against_server(servers):
    """The worker sends the center it pulled; another commit in between damps its residual."""
    server = servers(ExperimentalParameterServer, learning_rate=1.0)
    model = make_model()
    model.compile(optimizer="sgd", loss="mse")
    worker = ExperimentalWorker(model, communication_window=2)
    worker.model = ModelReplica(model, worker._record_step)
    worker.master_host, worker.master_port, worker.token = "127.0.0.1", server.port, server.token
    worker.worker_id, worker.connect_timeout = 4, 5.0
    worker.setup()
    try:
        worker.pull()
        # W - C0 = 2 * SRV_RESIDUAL, so the residual over a window of 2 is SRV_RESIDUAL.
        worker.model.set_weights(layers([[2.0, 5.0], [-11.75, 92.0], [6.75, -1.0]],
                                        [90.125, -12.5]))
        other = Client(server, 8)
        r2 = layers([[0.0, 1.0], [-1.0, 2.0], [0.5, 0.0]], [-2.0, 1.0])
        other.commit({"delta": r2, "center": initial()})  # no disagreement: C0 + r2
        other.pull()
        other.quit()
        worker.communicate()
        # C - C_stale = r2, so the worker's residual is divided by r2**2 + 1.
        want = [np.array([[1.25, 1.5], [-3.75, 13.0], [2.75, -0.5]], F32),
                np.array([7.125, -2.5], F32)]
        assert_weights_equal(worker.center_variable, want)
        assert_weights_equal(worker.model.get_weights(), want)
        assert_weights_equal(server.center_variable, want)
        assert server.num_updates == 2
    finally:
        worker.teardown()
    assert server.transport.errors == []


def test_aeasgd_worker_elastic_exchange(servers):
    """rho * lr = 0.5: the worker and the center each move half way towards the other."""
    server = servers(DeltaParameterServer)
    model = make_model()
    model.compile(optimizer="sgd", loss="mse")
    worker = AEASGDWorker(model, rho=5.0, learning_rate=0.1)
    worker.model = ModelReplica(model, worker._record_step)
    worker.master_host, worker.master_port, worker.token = "127.0.0.1", server.port, server.token
    worker.worker_id, worker.connect_timeout = 6, 5.0
    worker.setup()
    try:
        worker.model.set_weights(initial() + full(2.0, -1.0))  # W - C = 2 / -1
        worker.communicate()
        worker.pull()  # answered after the commit was applied
        assert_weights_equal(worker.model.get_weights(), [KERNEL + F32(1.0), BIAS - F32(0.5)])
        assert_weights_equal(server.center_variable, [KERNEL + F32(1.0), BIAS - F32(0.5)])
        assert server.num_updates == 1
    finally:
        worker.teardown()
    assert server.transport.errors == []


# -- concurrency -----------------------------------------------------------------------------

THREADS, COMMITS = 8, 20


def worker_delta(worker_id):
    """Each worker commits its own exact delta, so the sum also checks attribution."""
    return full((worker_id + 1) * 2.0**-4, -(worker_id + 1) * 2.0**-6)


def hammer(server, threads=THREADS, commits=COMMITS, pull_first=True):
    """``threads`` clients, each ``commits`` times: pull (unless not ``pull_first``), then
    commit with that pull's count."""
    errors = []
    barrier = threading.Barrier(threads)

    def run(worker_id):
        try:
            client = Client(server, worker_id)
            client.pull()
            barrier.wait(timeout=10)
            delta = worker_delta(worker_id)
            for _ in range(commits):
                if pull_first:
                    client.pull()
                client.commit({"delta": delta, "last_update": client.last_update})
            client.pull()  # every commit of this client has been applied
            client.quit()
        except Exception as error:  # reported by the main thread
            errors.append(f"worker {worker_id}: {type(error).__name__}: {error}")

    started = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in started)
    assert errors == []


def test_concurrent_dynsgd_commits_match_recorded_staleness(servers):
    server = servers(DynSGDParameterServer)
    hammer(server)
    assert server.num_updates == THREADS * COMMITS
    assert len(server.center.staleness) == THREADS * COMMITS
    assert sorted(wid for wid, _ in server.center.staleness) == \
        sorted(list(range(THREADS)) * COMMITS)
    assert all(0 <= s < THREADS * COMMITS for _, s in server.center.staleness)
    assert_dynsgd_center_replays_its_staleness(server)


def assert_dynsgd_center_replays_its_staleness(server):
    """Each client sent the count of its own pull, so each divisor was the recorded
    staleness + 1 (``server.center.staleness`` is in apply order): the center is that sum."""
    start = initial()
    expected64 = [layer.astype(np.float64) for layer in start]
    replay32 = start
    for worker_id, staleness in server.center.staleness:
        delta = worker_delta(worker_id)
        expected64 = [e + d.astype(np.float64) / (staleness + 1)
                      for e, d in zip(expected64, delta)]
        replay32 = replay32 + delta / (staleness + 1)
    final = center_of(server)
    for got, want in zip(final, expected64):  # float32 sums of up to 640 terms: 1e-5
        np.testing.assert_allclose(got, want, rtol=1e-5)
    # Replaying the same float32 operations in the same order is exact.
    assert_weights_equal(final, replay32)
    assert_float32(final)
    assert server.transport.errors == []


def test_concurrent_delta_commits_sum_exactly(servers):
    server = servers(DeltaParameterServer)
    hammer(server)
    assert server.num_updates == THREADS * COMMITS
    assert len(server.center.staleness) == THREADS * COMMITS
    total = sum((worker_id + 1) for worker_id in range(THREADS)) * COMMITS  # 720
    want = [KERNEL + F32(total * 2.0**-4), BIAS - F32(total * 2.0**-6)]
    assert_weights_equal(center_of(server), want)
    assert_float32(server.center_variable)
    assert server.transport.errors == []


@pytest.fixture
def switch_at_every_chance():
    """The interpreter switches threads after (almost) every bytecode, as free threading
    or a busy machine would: a handler without its lock loses updates under the GIL too."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(interval)


@pytest.mark.parametrize("server_cls", [DeltaParameterServer, ADAGParameterServer,
                                        DynSGDParameterServer])
def test_concurrent_commits_lose_nothing_when_threads_switch_often(servers, server_cls,
                                                                    switch_at_every_chance):
    threads, commits = 24, 60  # 16 x 40 let a server without its lock pass 1 run in 3
    server = servers(server_cls)
    hammer(server, threads, commits, pull_first=False)
    assert server.num_updates == threads * commits
    assert len(server.center.staleness) == threads * commits
    if server_cls is DynSGDParameterServer:  # each commit divided by its own staleness
        assert_dynsgd_center_replays_its_staleness(server)
        return
    total = sum(worker_id + 1 for worker_id in range(threads)) * commits  # 18000
    want = [KERNEL + F32(total * 2.0**-4), BIAS - F32(total * 2.0**-6)]
    assert_weights_equal(center_of(server), want)
    assert server.transport.errors == []


def test_average_weights_of_identical_replicas_is_exact():
    # A frozen layer holds the same weights on every replica: their mean must be those
    # weights bit for bit (sum / 3 rounded float32 values, and +0.0 for -0.0).
    rng = np.random.default_rng(3)
    kernel = rng.normal(size=(64, 16)).astype(F32)
    bias = np.array([-0.0, 0.0, 1e-30, -7.25], F32)
    frozen = weights_array([kernel, bias])
    for replicas in (2, 3, 5, 7):
        mean = update_rules.average_weights([frozen] * replicas)
        for got, want in zip(mean, frozen):
            assert got.dtype == want.dtype
            assert got.tobytes() == want.tobytes(), replicas
