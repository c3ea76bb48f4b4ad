"""Update rules and the socket parameter servers, over real loopback TCP; no Spark."""

import errno
import logging
import socket
import struct
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
    SocketParameterServer,
)
from ps_support import (BIAS, KERNEL, Client, assert_weights_equal, center_copy, copy_weights,
                        expect_closed_by_server, layers, make_model)

PREFIX = struct.Struct("<2sBBIQ")


# -- update rules ---------------------------------------------------------------------------


def golden_weights():
    weights = weights_array([np.array([[1.0, 2.0], [3.0, 4.0]]), np.array([0.5, -0.5])])
    pulled = weights_array([np.array([[0.0, 1.0], [1.0, 1.0]]), np.array([0.25, 0.5])])
    return weights, pulled


def test_downpour_delta_golden():
    weights, pulled = golden_weights()
    before = copy_weights(weights), copy_weights(pulled)
    delta = update_rules.downpour_delta(weights, pulled)
    assert_weights_equal(delta, [np.array([[1.0, 1.0], [2.0, 3.0]]), np.array([0.25, -1.0])])
    assert_weights_equal(weights, before[0])
    assert_weights_equal(pulled, before[1])


def test_adag_residual_golden():
    weights, pulled = golden_weights()
    before = copy_weights(weights), copy_weights(pulled)
    residual = update_rules.adag_residual(weights, pulled, 4)
    assert_weights_equal(residual, [np.array([[0.25, 0.25], [0.5, 0.75]]),
                                    np.array([0.0625, -0.25])])
    assert_weights_equal(weights, before[0])
    assert_weights_equal(pulled, before[1])


def test_adag_residual_leaves_non_trainable_weights_whole():
    weights, pulled = golden_weights()
    before = copy_weights(weights), copy_weights(pulled)
    # The second weight is state (a moving statistic): its change is sent as it is.
    residual = update_rules.adag_residual(weights, pulled, 4, trainable=[True, False])
    assert_weights_equal(residual, [np.array([[0.25, 0.25], [0.5, 0.75]]),
                                    np.array([0.25, -1.0])])
    assert_weights_equal(weights, before[0])
    assert_weights_equal(pulled, before[1])
    all_trainable = update_rules.adag_residual(weights, pulled, 4, trainable=[True, True])
    assert_weights_equal(all_trainable, update_rules.adag_residual(weights, pulled, 4))
    with pytest.raises(ValueError, match="1 trainable flags for 2 weights"):
        update_rules.adag_residual(weights, pulled, 4, trainable=[True])


def test_add_update_golden():
    center, update = golden_weights()
    before = copy_weights(center), copy_weights(update)
    result = update_rules.add_update(center, update)
    assert_weights_equal(result, [np.array([[1.0, 3.0], [4.0, 5.0]]), np.array([0.75, 0.0])])
    assert result is not center
    assert all(new is not old for new, old in zip(result, center))
    assert_weights_equal(center, before[0])
    assert_weights_equal(update, before[1])


def test_update_rules_keep_float32():
    center = weights_array([np.ones((2, 2), np.float32), np.ones(2, np.float32)])
    delta = weights_array([np.full((2, 2), 0.5, np.float32), np.full(2, 0.5, np.float32)])
    for result in (update_rules.add_update(center, delta),
                   update_rules.downpour_delta(center, delta),
                   update_rules.adag_residual(center, delta, 4)):
        assert [layer.dtype for layer in result] == [np.float32, np.float32]


# -- helpers ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def model():
    return make_model()


def assert_honest_client_works(server, worker_id=99):
    before = center_copy(server)
    updates = server.num_updates
    client = Client(server, worker_id)
    client.commit(layers(0.5, -0.25))
    pulled = client.pull()
    client.quit()
    assert pulled["num_updates"] == updates + 1
    want = [before[0] + np.float32(0.5), before[1] - np.float32(0.25)]
    assert_weights_equal(pulled["center"], want)
    assert_weights_equal(server.center_variable, want)
    assert [layer.dtype for layer in server.center_variable] == [np.float32, np.float32]


# -- basic protocol -------------------------------------------------------------------------


def test_server_starts_on_loopback_with_free_port(servers):
    server = servers()
    assert server.transport.host == "127.0.0.1"
    assert isinstance(server.port, int) and server.port > 0
    assert isinstance(server.token, str) and len(server.token) >= 32
    assert server.center.weight_spec == [((3, 2), np.float32), ((2,), np.float32)]
    assert server.num_updates == 0


def test_pull_returns_center_and_num_updates(servers):
    server = servers()
    client = Client(server, 1)
    pulled = client.pull()
    assert pulled["num_updates"] == 0
    assert pulled["center"].dtype == object
    assert_weights_equal(pulled["center"], [KERNEL, BIAS])
    client.commit(layers(1.0, 2.0))
    pulled = client.pull()
    assert pulled["num_updates"] == 1
    assert_weights_equal(pulled["center"], [KERNEL + 1, BIAS + 2])
    client.quit()


def _pause_inside_the_first_commit(monkeypatch, server, seconds=2.0):
    """Holds the first commit between reading the center and writing it back, until
    another commit reaches the same point or ``seconds`` pass: without the lock around
    the commit, the other one gets in and one of the two updates is lost, every time."""
    server_class = type(server)
    apply_rule, first, second_in = server_class.apply_rule, [], threading.Event()

    def pausing_apply_rule(self, rule, *args):
        def rule_then_pause(center_variable, *rest):
            result = rule(center_variable, *rest)  # from the center as read
            first.append(None)
            if len(first) == 1:
                second_in.wait(seconds)
            else:
                second_in.set()
            return result
        return apply_rule(self, rule_then_pause, *args)

    monkeypatch.setattr(server_class, "apply_rule", pausing_apply_rule)


def test_concurrent_commits_sum_exactly(servers, monkeypatch):
    server = servers()
    _pause_inside_the_first_commit(monkeypatch, server)
    threads, per_thread, errors = 8, 25, []

    def work(worker_id):
        try:
            client = Client(server, worker_id)
            for step in range(per_thread):
                client.commit(layers(0.25 * (worker_id + 1), -0.125 * (step % 4)))
                if step % 10 == 0:
                    client.pull()
            client.pull()  # the server serves a connection in order: every commit is applied
            client.quit()
        except Exception as error:  # reported below
            errors.append(error)

    pool = [threading.Thread(target=work, args=(worker,)) for worker in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join(timeout=30)
    assert not errors
    assert not any(thread.is_alive() for thread in pool)

    kernel_sum = per_thread * sum(0.25 * (worker + 1) for worker in range(threads))
    bias_sum = threads * sum(-0.125 * (step % 4) for step in range(per_thread))
    assert server.num_updates == threads * per_thread == 200
    assert len(server.center.staleness) == 200
    assert sorted({worker for worker, _ in server.center.staleness}) == list(range(threads))
    assert all(staleness >= 0 for _, staleness in server.center.staleness)
    assert_weights_equal(server.center_variable, [KERNEL + kernel_sum, BIAS + bias_sum])
    assert server.transport.errors == []


def test_staleness_counts_updates_by_others_since_last_pull(servers):
    server = servers()
    a, b = Client(server, 0), Client(server, 1)
    a.pull()
    b.commit(layers(1.0, 1.0))
    b.commit(layers(1.0, 1.0))
    b.pull()  # both of B's commits are applied before A commits
    a.commit(layers(1.0, 1.0))
    assert a.pull()["num_updates"] == 3
    a.quit()
    b.quit()
    assert server.center.staleness == [(1, 0), (1, 1), (0, 2)]


def test_adag_server_applies_delta_and_residual(servers):
    server = servers(ADAGParameterServer)
    client = Client(server, 0)
    client.commit(layers(0.5, 0.25), key="delta")
    client.commit(layers(-0.125, 1.0), key="residual")
    pulled = client.pull()
    client.quit()
    assert pulled["num_updates"] == 2
    assert_weights_equal(pulled["center"], [KERNEL + 0.375, BIAS + 1.25])


def test_adag_prefers_residual_when_both_are_sent(servers):
    server = servers(ADAGParameterServer)
    client = Client(server, 0)
    client.commit(layers(100.0, 100.0), key="delta", residual=weights_array(layers(1.0, 2.0)))
    pulled = client.pull()
    client.quit()
    assert_weights_equal(pulled["center"], [KERNEL + 1, BIAS + 2])


def test_custom_subclass_like_the_tutorial(servers):
    class MyParameterServer(SocketParameterServer):
        def handle_commit(self, conn, addr):
            data = recv_data(conn)
            with self.mutex:
                self.center_variable = self.center_variable + 0.5 * data['delta']

    server = servers(MyParameterServer)
    client = Client(server, 5)
    delta = [np.full((3, 2), 2.0, np.float32), np.array([1.0, -3.0], np.float32)]
    client.commit(delta)
    pulled = client.pull()
    client.quit()
    assert_weights_equal(pulled["center"], [KERNEL + 1.0, BIAS + np.array([0.5, -1.5])])
    assert pulled["num_updates"] == 1
    assert server.num_updates == 1
    assert server.center.staleness == [(5, 0)]


def test_base_server_without_handle_commit_reports_error(servers):
    server = servers(SocketParameterServer)
    client = Client(server, 0)
    try:
        client.commit(layers(1.0, 1.0))
    except ConnectionError:
        pass  # the server may close before the whole frame was sent
    expect_closed_by_server(client.sock)
    assert any("NotImplementedError" in error for error in server.transport.errors)
    assert_weights_equal(server.center_variable, [KERNEL, BIAS])


def test_history_action(servers):
    server = servers()
    client = Client(server, 0)
    client.send_history({"worker_id": [0, 0], "iteration": [1, 2], "timestamp": [1.0, 2.0],
                         "loss": [0.5, 0.4]})
    client.pull()  # the history was handled before the pull was answered
    client.quit()
    assert server.history == [
        {"worker_id": 0, "iteration": 1, "timestamp": 1.0, "loss": 0.5},
        {"worker_id": 0, "iteration": 2, "timestamp": 2.0, "loss": 0.4},
    ]
    assert server.num_updates == 0


def test_history_with_missing_values(servers):
    server = servers()
    client = Client(server, 0)
    client.send_history({"iteration": [1, 2], "acc": [None, 0.75]})
    client.pull()
    client.quit()
    assert server.history == [{"iteration": 1}, {"iteration": 2, "acc": 0.75}]



def _metric_report(shape, epoch=0):
    return {"metric_state_index": [{"epoch": epoch, "name": "m", "spec": {"mean": True},
                                    "shapes": [shape]}],
            "metric_state_values": np.zeros(4, np.float32)}


MALFORMED_HISTORY = {
    "column_not_a_list": {"history": {"loss": 5}},
    "columns_of_different_lengths": {"history": {"loss": [0.5, 0.4], "epoch": [0]}},
    "epoch_not_a_number": {"history": {"epoch": ["one"], "batch_size": [4]}},
    "epoch_nan": {"history": {"epoch": [float("nan")], "batch_size": [4]}},
    "batch_size_not_a_number": {"history": {"epoch": [0], "batch_size": ["four"]}},
    "loss_a_dict": {"history": {"loss": [{"a": 1}]}},
    "metric_state_negative_shape": {"history": {}, **_metric_report([-2, -2])},
    "metric_state_shape_overflowing_int64": {"history": {}, **_metric_report([2**62, 4])},
    "metric_state_shape_beyond_int64": {"history": {}, **_metric_report([2**70])},
    "metric_state_empty_shape_too_big": {"history": {}, **_metric_report([0, 2**70])},
    "metric_state_one_negative_dimension": {"history": {}, **_metric_report([-1])},
    # JSON as Python reads it holds Infinity and NaN: int() of them raised OverflowError,
    # counted as the server's bug, which stopped the training.
    "metric_state_epoch_infinite": {"history": {}, **_metric_report([4], float("inf"))},
    "metric_state_epoch_nan": {"history": {}, **_metric_report([4], float("nan"))},
    "metric_state_shape_infinite": {"history": {}, **_metric_report([float("inf")])},
    "metric_state_shape_minus_infinite": {"history": {}, **_metric_report([float("-inf")])},
}


@pytest.mark.parametrize("message", MALFORMED_HISTORY.values(), ids=MALFORMED_HISTORY)
def test_malformed_history_closes_the_connection_and_keeps_nothing(servers, message):
    """A malformed history frame is the peer's fault, not a bug of the server's (which
    stops the run): it closes that connection and no record of it is kept (a stored bad
    record failed every later report's epoch count)."""
    server = servers()
    server.sink.track_epochs(2, 3)
    honest = Client(server, 1)
    honest.send_history({"worker_id": [1], "epoch": [0], "batch_size": [4], "loss": [0.5]})
    honest.pull()
    client = Client(server, 0)
    networking.send_action(client.sock, networking.ACTION_HISTORY)
    send_data(client.sock, message)
    expect_closed_by_server(client.sock)
    assert server.transport.errors == []
    assert server.history == [{"worker_id": 1, "epoch": 0, "batch_size": 4, "loss": 0.5}]
    assert server.sink.metric_states == []
    # the reports after it are still counted
    honest.send_history({"worker_id": [1], "epoch": [1], "batch_size": [4], "loss": [0.4]})
    honest.pull()
    honest.quit()
    assert len(server.history) == 2 and server.transport.errors == []


def test_a_long_windows_history_reaches_the_server_whole(servers):
    """A window of 20,000 steps sends its records with its commit: as one frame their
    numbers outgrew the frame header's 1 MiB and the server closed the connection (the
    training failed). They travel in several frames, the epoch's metric state first."""
    from distkeras.executor.step_history import send_history_columns

    server = servers()
    server.sink.track_epochs(1, 1)
    steps = 20_000
    columns = {"worker_id": [0] * steps, "iteration": list(range(1, steps + 1)),
               "batch_size": [32] * steps, "epoch": [0] * steps,
               "timestamp": [1796178445.1237721 + step for step in range(steps)],
               "loss": [0.123456789012345 + step * 1e-9 for step in range(steps)],
               "accuracy": [0.8765432109876543] * steps}
    client = Client(server, 0)
    send_history_columns(client.sock, columns, _metric_report([2, 2]))
    client.pull()  # answered after every history frame before it was handled
    client.quit()
    assert server.transport.errors == []
    assert len(server.history) == steps
    assert [record["iteration"] for record in server.history] == columns["iteration"]
    assert server.history[-1]["loss"] == columns["loss"][-1]
    assert len(server.sink.metric_states) == 1


def test_the_server_keeps_the_samples_trained_as_each_epoch_ends(servers):
    """Worker 1 runs late: epoch 1 ends when it records a step of epoch 2, after worker 0
    has trained on. The samples kept are those trained then (the center's), not those the
    driver counts when it looks (the same for two epochs that ended before it did)."""
    server = servers()
    server.sink.track_epochs(2, 3)
    early, late = Client(server, 0), Client(server, 1)

    def steps(client, worker, epochs, rows):
        client.send_history({"worker_id": [worker] * len(epochs), "epoch": epochs,
                             "iteration": list(range(1, len(epochs) + 1)),
                             "batch_size": [rows] * len(epochs)})
        client.pull()  # the history was handled before the pull was answered

    steps(early, 0, [0, 1], 100)
    steps(late, 1, [0], 60)
    assert server.sink.epoch_end(1) is None  # worker 1 is still in epoch 1
    steps(late, 1, [1], 60)  # epoch 1 ends: 320 samples
    steps(early, 0, [2], 100)
    steps(late, 1, [2], 60)  # epoch 2 ends: 480 samples
    early.quit()
    late.quit()
    center, samples = server.sink.epoch_end(1)
    assert samples == 320 and [w.shape for w in center] == [(3, 2), (2,)]
    assert server.sink.epoch_end(2)[1] == 480
    assert server.sink.epoch_end(2) is None  # taken

def test_get_model_holds_the_center(servers):
    server = servers()
    client = Client(server, 0)
    client.commit(layers(0.5, 0.5))
    client.pull()
    client.quit()
    model = server.get_model()
    assert isinstance(model, keras.Model)
    assert model is not server.center.model
    assert_weights_equal(model.get_weights(), server.center_variable)
    assert_weights_equal(model.get_weights(), [KERNEL + 0.5, BIAS + 0.5])
    # the master model itself is left alone
    assert_weights_equal(server.center.model.get_weights(), [KERNEL, BIAS])
    x = np.ones((1, 3), np.float32)
    np.testing.assert_allclose(model.predict(x, verbose=0),
                               x @ (KERNEL + 0.5) + (BIAS + 0.5), rtol=1e-6)


# -- hostile input ----------------------------------------------------------------------------


def frame_prefix(header_len, body_len):
    return PREFIX.pack(b"DK", 1, 0, header_len, body_len)


def hostile_wrong_token(server):
    client = Client(server, 0, token="0" * 64)
    return client.sock


def hostile_non_string_token(server):
    client = Client(server, 0, authenticate=False)
    send_data(client.sock, {"token": 12345, "worker_id": 0})
    return client.sock


def hostile_surrogate_token(server):
    """A lone surrogate, which JSON allows and UTF-8 cannot encode."""
    client = Client(server, 0, authenticate=False)
    send_data(client.sock, {"token": "\ud800", "worker_id": 0})
    return client.sock


def hostile_no_token(server):
    client = Client(server, 0, authenticate=False)
    send_data(client.sock, {"worker_id": 0})
    return client.sock


def hostile_garbage_before_auth(server):
    client = Client(server, 0, authenticate=False)
    client.sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    return client.sock


def hostile_malformed_header_before_auth(server):
    client = Client(server, 0, authenticate=False)
    header = b'{"f": {}, "a": [[["<f4"], [1]]]}'
    client.sock.sendall(frame_prefix(len(header), 4) + header + b"\0" * 4)
    return client.sock


def hostile_garbage_after_auth(server):
    client = Client(server, 0)
    networking.send_action(client.sock, networking.ACTION_COMMIT)
    client.sock.sendall(bytes(range(256)) * 4)
    return client.sock


def hostile_truncated_commit(server):
    client = Client(server, 0)
    frame = networking.encode_message({"delta": weights_array(layers(1.0, 1.0))})
    networking.send_action(client.sock, networking.ACTION_COMMIT)
    client.sock.sendall(frame[:len(frame) - 5])
    client.sock.shutdown(socket.SHUT_WR)  # the peer closes mid-frame
    return client.sock


def hostile_ten_gigabytes(server):
    client = Client(server, 0)
    header = (b'{"f":{"delta":{"t":"array","i":0}},"a":[["|u1",[%d]]]}' % (10 * 2**30))
    networking.send_action(client.sock, networking.ACTION_COMMIT)
    client.sock.sendall(frame_prefix(len(header), 10 * 2**30) + header)
    return client.sock


def hostile_ten_gigabytes_before_auth(server):
    client = Client(server, 0, authenticate=False)
    header = b'{"f":{"token":{"t":"array","i":0}},"a":[["|u1",[%d]]]}' % (10 * 2**30)
    client.sock.sendall(frame_prefix(len(header), 10 * 2**30) + header)
    return client.sock


def hostile_wrong_shapes(server):
    client = Client(server, 0)
    client.commit([np.ones((2, 3), np.float32), np.ones(2, np.float32)])
    return client.sock


def hostile_wrong_layer_count(server):
    client = Client(server, 0)
    client.commit([np.ones((3, 2), np.float32)])
    return client.sock


def hostile_wrong_dtype(server):
    client = Client(server, 0)
    client.commit([np.ones((3, 2), np.float64), np.ones(2, np.float64)])
    return client.sock


def hostile_delta_as_one_array(server):
    client = Client(server, 0)
    networking.send_action(client.sock, networking.ACTION_COMMIT)
    send_data(client.sock, {"delta": np.ones(2, np.float64)})
    return client.sock


def hostile_delta_as_number(server):
    client = Client(server, 0)
    networking.send_action(client.sock, networking.ACTION_COMMIT)
    send_data(client.sock, {"delta": 1.0})
    return client.sock


def hostile_commit_without_delta(server):
    client = Client(server, 0)
    networking.send_action(client.sock, networking.ACTION_COMMIT)
    send_data(client.sock, {"center": weights_array(layers(1.0, 1.0))})
    return client.sock


def hostile_unknown_action(server):
    client = Client(server, 0)
    client.sock.sendall(b"x")
    return client.sock


def hostile_bad_history(server):
    client = Client(server, 0)
    networking.send_action(client.sock, networking.ACTION_HISTORY)
    send_data(client.sock, {"history": [1, 2, 3]})
    return client.sock


HOSTILE = [
    hostile_wrong_token, hostile_non_string_token, hostile_surrogate_token, hostile_no_token,
    hostile_garbage_before_auth, hostile_malformed_header_before_auth,
    hostile_garbage_after_auth, hostile_truncated_commit, hostile_ten_gigabytes,
    hostile_ten_gigabytes_before_auth, hostile_wrong_shapes, hostile_wrong_layer_count,
    hostile_wrong_dtype, hostile_delta_as_one_array, hostile_delta_as_number,
    hostile_commit_without_delta, hostile_unknown_action, hostile_bad_history,
]


@pytest.mark.parametrize("server_cls", [DeltaParameterServer, ADAGParameterServer])
@pytest.mark.parametrize("attack", HOSTILE, ids=lambda attack: attack.__name__[8:])
def test_hostile_input_leaves_center_unchanged(servers, server_cls, attack):
    server = servers(server_cls)
    honest = Client(server, 7)
    honest.commit(layers(0.25, 0.25))
    assert honest.pull()["num_updates"] == 1
    before = center_copy(server)

    elapsed = expect_closed_by_server(attack(server))
    assert elapsed < 3.0

    assert_weights_equal(server.center_variable, before)
    assert server.num_updates == 1
    assert server.history == []
    # the honest connection that was open all along still works
    pulled = honest.pull()
    assert_weights_equal(pulled["center"], before)
    honest.commit(layers(0.25, 0.25))
    assert honest.pull()["num_updates"] == 2
    honest.quit()
    assert_weights_equal(server.center_variable, [before[0] + 0.25, before[1] + 0.25])
    # and so does a new one
    assert_honest_client_works(server)
    assert server.num_updates == 3


def test_hostile_input_before_auth_is_no_server_error(servers):
    """None of these is a bug of the server's (which stops the run): a token that UTF-8
    cannot encode was, for anyone reaching the port."""
    server = servers()
    for attack in (hostile_wrong_token, hostile_surrogate_token, hostile_garbage_before_auth,
                   hostile_malformed_header_before_auth, hostile_ten_gigabytes_before_auth):
        expect_closed_by_server(attack(server))
    assert_honest_client_works(server)
    assert server.transport.errors == []


def test_silent_client_is_dropped_after_handshake_timeout(servers):
    server = servers(handshake_timeout=0.5)
    before = center_copy(server)
    silent = Client(server, 0, authenticate=False)
    elapsed = expect_closed_by_server(silent.sock)
    assert 0.3 <= elapsed < 3.0
    assert_weights_equal(server.center_variable, before)
    assert_honest_client_works(server)


def test_a_client_trickling_its_handshake_is_dropped_after_the_timeout(servers):
    """The handshake timeout bounds the whole handshake, not each read: a client sending
    one byte of its first frame now and then held its connection (and thread) forever."""
    server = servers(handshake_timeout=1.0)
    client = Client(server, 0, authenticate=False)
    header = b'{"f":{"token":{"t":"json","v":"%s"}},"a":[]}' % (b"0" * 64)
    frame = frame_prefix(len(header), 0) + header
    start = time.monotonic()
    try:
        for byte in frame:  # 0.3 s apart: each read alone is well within the timeout
            client.sock.sendall(bytes([byte]))
            time.sleep(0.3)
        pytest.fail("the server read a trickled handshake for %.1f s"
                    % (time.monotonic() - start))
    except (BrokenPipeError, ConnectionResetError):
        pass
    assert time.monotonic() - start < 3.0
    expect_closed_by_server(client.sock)
    assert server.transport.errors == []
    assert_honest_client_works(server)


def test_a_large_frame_before_the_token_is_refused_from_its_prefix(servers):
    """Before its token is checked, a connection may send only a small frame: one as large
    as the weights allow was read (and its body allocated) for anyone reaching the port."""
    server = servers(handshake_timeout=10.0)
    body = 256 << 10  # within the frame limit of this model's commits (1 MiB and more)
    assert body < server.center.max_frame_bytes
    client = Client(server, 0, authenticate=False)
    header = b'{"f":{"token":{"t":"array","i":0}},"a":[["|u1",[%d]]]}' % body
    client.sock.sendall(frame_prefix(len(header), body) + header)
    assert expect_closed_by_server(client.sock) < 2.0  # not after the handshake timeout
    assert server.transport.errors == []
    assert_honest_client_works(server)


def test_handshake_timeout_does_not_apply_after_auth(servers):
    server = servers(handshake_timeout=0.5)
    client = Client(server, 0)
    time.sleep(1.0)
    client.commit(layers(1.0, 1.0))
    assert client.pull()["num_updates"] == 1
    client.quit()


def test_a_flood_of_connections_without_the_token_holds_at_most_the_cap(servers, caplog):
    """Each connection that never sends the token held a thread until the handshake
    deadline, so anyone reaching the port could open thousands. Past the cap the oldest
    are closed at once; workers already in, and one that joins while the flood holds
    every place, train on."""
    server = servers(handshake_timeout=30.0)
    cap = server.transport.max_pending_handshakes
    assert cap == SocketParameterServer.MAX_PENDING_HANDSHAKES == 64
    joined = [Client(server, worker_id) for worker_id in range(3)]
    for client in joined:
        client.pull()  # answered: its token was read, it no longer counts
    extra = 16
    with caplog.at_level("WARNING", logger="distkeras"):
        flood = [Client(server, 0, authenticate=False) for _ in range(cap + extra)]
        for client in flood[:extra]:  # the oldest, long before the 30 s deadline
            assert expect_closed_by_server(client.sock) < 5.0
    assert "have not sent the run's token" in caplog.text
    deadline = time.monotonic() + 5
    while len(server_threads()) > 1 + len(joined) + cap and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(server_threads()) == 1 + len(joined) + cap  # the accept loop, the rest
    assert_honest_client_works(server)
    for worker_id, client in enumerate(joined):
        client.commit(layers(1.0, 1.0))
        assert client.pull()["num_updates"] == server.num_updates
        client.quit()
    for client in flood[extra:]:
        client.close()
    assert server.transport.errors == []


def test_the_progress_server_of_many_workers_leaves_room_for_their_handshakes(monkeypatch):
    """The HistoryServer that EnsembleTrainer's members and AveragingTrainer's replicas
    report to (and tell of their failures) kept the cap of 64 however many connected at
    once, where the parameter servers take twice their workers (`expect_workers`)."""
    from types import SimpleNamespace

    from distkeras.executor.task_spec import TaskSpec
    from distkeras.transport.parameter_servers import HistoryServer
    from distkeras.trainers import AveragingTrainer
    from distkeras.training.plans import Plan
    from distkeras.training.run import Run

    caps = []
    start = HistoryServer.start
    monkeypatch.setattr(HistoryServer, "start", lambda self: (
        caps.append(self.transport.max_pending_handshakes), start(self))[1])
    conf = SimpleNamespace(get=lambda key, default=None: default)
    spark = SimpleNamespace(conf=conf, sparkContext=SimpleNamespace(getConf=lambda: conf,
                                                                master="local[2]"))
    trainer = AveragingTrainer(make_model(), "sgd", "mse")
    run = Run(trainer.settings(), "test", verbose=0)
    worker = SimpleNamespace(spec=TaskSpec())  # the driver sets its spec's address
    with Plan(run).progress(spark, worker, None, "test", "group", num_tasks=200):
        pass
    assert caps == [400]


def test_running_out_of_descriptors_does_not_stop_the_server_accepting(servers, caplog):
    """A process out of file descriptors (many connections, a low `ulimit -n`) fails
    accept() with EMFILE: the server warns and accepts again once some close, where it
    stopped accepting for good and every later worker waited forever on an open port."""
    import os
    import resource

    server = servers(handshake_timeout=30.0)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    flood = []
    # Client and server ends live in this process: a few dozen descriptors fill it.
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 40, hard))
    try:
        with caplog.at_level("WARNING", logger="distkeras"):
            while True:
                try:
                    flood.append(socket.create_connection(("127.0.0.1", server.port), 5))
                except OSError:
                    break
            deadline = time.monotonic() + 5  # the server meets the limit as it accepts
            while "cannot accept connections" not in caplog.text and \
                    time.monotonic() < deadline:
                time.sleep(0.05)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for sock in flood:
            sock.close()
    assert_honest_client_works(server)
    assert "Too many open files" in caplog.text and "ulimit -n" in caplog.text


# -- commits that would overflow the center --------------------------------------------------

# float32's largest is 3.4e38: a center near it plus a commit near it is inf.
LARGE = np.float32(3e38)
LARGE_KERNEL = np.where(KERNEL > 0, LARGE, KERNEL)  # large where KERNEL is positive

# Every server whose rule adds a commit into the center, with what its commit carries
# besides the update: DynSGD's last update seen, Experimental's stale center (the center
# itself: no disagreement, so the residual is added whole).
ADDING_SERVERS = [
    (DeltaParameterServer, {}),
    (ADAGParameterServer, {}),
    (DynSGDParameterServer, {"last_update": 0}),
    (ExperimentalParameterServer, {"center": [LARGE_KERNEL, BIAS]}),
]


@pytest.mark.parametrize("server_cls, extra", ADDING_SERVERS,
                         ids=[cls.__name__ for cls, _ in ADDING_SERVERS])
def test_a_finite_commit_that_would_overflow_the_center_is_refused(servers, server_cls,
                                                                   extra):
    server = servers(server_cls, model=make_model(kernel=LARGE_KERNEL))
    client = Client(server, 4)
    # Finite, so it passes the NaN check; the bias alone would add fine.
    client.commit([np.full((3, 2), LARGE), np.full(2, 1.0, np.float32)], **extra)
    reply = client.pull()  # the connection stays open, as after a NaN commit
    assert reply["num_updates"] == 0
    assert_weights_equal(reply["center"], [LARGE_KERNEL, BIAS])
    assert server.center.refused == 1 and server.center.refused_by_worker == {4: 1}
    assert server.center.staleness == [] and server.transport.errors == []
    client.commit(layers(0.0, 1.0), **extra)  # an update that fits is applied
    reply = client.pull()
    client.quit()
    assert reply["num_updates"] == 1
    assert_weights_equal(reply["center"], [LARGE_KERNEL, BIAS + 1])
    assert all(np.isfinite(layer).all() for layer in center_copy(server))


@pytest.mark.filterwarnings("ignore:overflow encountered in add:RuntimeWarning")
def test_allow_nonfinite_applies_a_commit_that_overflows(servers):
    server = servers(model=make_model(kernel=LARGE_KERNEL))
    server.center.allow_nonfinite = True
    client = Client(server, 0)
    client.commit([np.full((3, 2), LARGE), np.zeros(2, np.float32)])
    reply = client.pull()
    client.quit()
    assert server.center.refused == 0 and reply["num_updates"] == 1
    assert_weights_equal(reply["center"], [np.where(KERNEL > 0, np.inf, KERNEL + LARGE), BIAS])


def test_an_experimental_damping_that_overflows_is_no_refusal(servers):
    """A disagreement too large to square in float32 damps its residual to nothing: the
    overflow is the rule's, not the center's, and the commit is applied."""
    server = servers(ExperimentalParameterServer, learning_rate=1.0)
    client = Client(server, 0)
    stale = [KERNEL + np.float32(2e19), BIAS]  # (C - C_stale)**2 = 4e38: inf
    client.commit(layers(1.0, 1.0), center=stale)
    reply = client.pull()
    client.quit()
    assert server.center.refused == 0 and reply["num_updates"] == 1
    assert_weights_equal(reply["center"], [KERNEL, BIAS + 1])


# -- life cycle ------------------------------------------------------------------------------


def server_threads():
    return [thread for thread in threading.enumerate()
            if thread.name.startswith("distkeras-ps") and thread.is_alive()]


def test_stop_releases_port_and_threads(model):
    server = DeltaParameterServer(model, 0)
    server.start()
    port = server.port
    idle = Client(server, 0)  # a connection still open when the server stops
    busy = Client(server, 1)
    busy.commit(layers(1.0, 1.0))
    busy.pull()
    silent = Client(server, 2, authenticate=False)  # one still in its handshake
    deadline = time.monotonic() + 5
    while len(server_threads()) < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(server_threads()) == 4  # the accept loop and one per connection

    server.stop()
    assert server_threads() == []
    for client in (idle, busy, silent):
        expect_closed_by_server(client.sock, within=2.0)

    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind(("127.0.0.1", port))  # fails while anything still listens on the port
        probe.listen(1)
    finally:
        probe.close()
    with pytest.raises(ConnectionError):
        networking.connect("127.0.0.1", port, timeout=0.3, retry_interval=0.1)


def test_restart_on_same_port(model):
    first = DeltaParameterServer(model, 0)
    first.start()
    port = first.port
    Client(first, 0).quit()
    first.stop()
    second = DeltaParameterServer(model, port)
    second.start()
    try:
        assert second.port == port
        assert_honest_client_works(second)
    finally:
        second.stop()
    assert server_threads() == []


def test_stop_while_clients_keep_connecting(model):
    """A connection accepted while stop() runs is closed too; no serving thread survives."""
    for _ in range(10):  # each stop() waits its 1 s of grace for the open connections
        server = DeltaParameterServer(model, 0)
        server.start()
        done = threading.Event()
        opened = []

        def hammer():
            while not done.is_set():
                try:
                    sock = socket.create_connection(("127.0.0.1", server.port), timeout=1)
                    networking.authenticate(sock, server.token, 0)
                    opened.append(sock)
                except OSError:
                    pass

        hammers = [threading.Thread(target=hammer) for _ in range(4)]
        for thread in hammers:
            thread.start()
        time.sleep(0.02)
        server.stop()
        leaked = server_threads()
        done.set()
        for thread in hammers:
            thread.join()
        for sock in opened:
            sock.close()
        assert leaked == [], "a connection accepted during stop() was left open"


def spy_on_closed_descriptors(monkeypatch):
    """Records each read or write of a connection whose socket was closed under it (EBADF):
    by then the OS may have given its number to a file or socket opened since."""
    bad = []

    def spied(name):
        original = getattr(networking.Connection, name)

        def call(self, *args):
            try:
                return original(self, *args)
            except OSError as error:
                if error.errno == errno.EBADF:
                    bad.append(name)
                raise
        monkeypatch.setattr(networking.Connection, name, call)

    spied("recv_into")
    spied("sendall")
    return bad


def busy_clients(server, frame):
    """Nine clients caught mid-exchange: three mid-frame in a commit, three streaming
    commits (the server reads the ones buffered), three that pull and do not read (the
    server is blocked sending weights larger than the socket buffers)."""
    clients, streaming = [], threading.Event()

    def stream(sock):
        while not streaming.is_set():
            try:
                networking.send_action(sock, networking.ACTION_COMMIT)
                sock.sendall(frame)
            except OSError:
                return

    for worker_id in range(9):
        client = Client(server, worker_id)
        kind = worker_id % 3
        if kind == 0:
            networking.send_action(client.sock, networking.ACTION_COMMIT)
            client.sock.sendall(frame[:len(frame) // 2])
        elif kind == 1:
            threading.Thread(target=stream, args=(client.sock,), daemon=True).start()
        else:
            for _ in range(3):
                networking.send_action(client.sock, networking.ACTION_PULL)
        clients.append(client)
    return clients, streaming


def test_stop_with_clients_mid_frame_closes_no_socket_under_its_reader(monkeypatch, caplog):
    """stop() used to close every socket while its handler could still be reading or
    writing it: a handler between two reads of a frame, or reading the commits already
    buffered, then used a closed descriptor, one the OS may have reused meanwhile."""
    bad = spy_on_closed_descriptors(monkeypatch)
    model = keras.Sequential([keras.Input((500,)), keras.layers.Dense(1000)])  # 2 MB
    server = DeltaParameterServer(model, 0)
    server.start()
    delta = weights_array(np.zeros(w.shape, w.dtype) for w in server.center_variable)
    frame = networking.encode_message({"delta": delta})
    clients, streaming = busy_clients(server, frame)
    time.sleep(0.3)  # every handler in its read or its send
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="distkeras"):
        server.stop()
    took = time.monotonic() - started
    streaming.set()
    for client in clients:
        expect_closed_by_server(client.sock, within=2.0)
    assert bad == []
    assert server_threads() == [] and server.transport.errors == []
    # Warnings only: an earlier test in this process (the CLI's, in-process) may have set
    # distkeras's loggers to INFO, and the server's start logs at INFO.
    assert [record for record in caplog.records if record.levelno >= logging.WARNING] == []
    assert took < 5  # the grace second, then every handler wakes at once


# -- pulls that skip the weights when only the asker's commits changed the center --------


@pytest.mark.parametrize("server_cls", [DeltaParameterServer, ADAGParameterServer])
def test_pull_unless_own_sends_no_weights_after_only_own_commits(servers, server_cls):
    server = servers(server_cls)
    client = Client(server, 0)
    client.pull()
    client.commit(layers(0.5, 0.25))
    client.commit(layers(0.25, 0.25))
    reply = client.pull_unless_own()
    assert reply == {"unchanged": True, "num_updates": 2}
    # Nothing committed since that answer: still unchanged, same count.
    assert client.pull_unless_own() == {"unchanged": True, "num_updates": 2}
    client.quit()
    assert_weights_equal(center_copy(server), [KERNEL + 0.75, BIAS + 0.5])


def test_pull_unless_own_sends_the_center_when_another_worker_committed(servers):
    server = servers(ADAGParameterServer)
    a, b = Client(server, 0), Client(server, 1)
    a.pull()
    b.pull()
    a.commit(layers(1.0, 1.0))
    b.commit(layers(0.5, 0.5))
    # Commits on two connections are applied in whatever order their threads run: wait
    # for both before A asks.
    deadline = time.monotonic() + 10
    while server.num_updates < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    reply = a.pull_unless_own()
    assert "unchanged" not in reply and reply["num_updates"] == 2
    assert_weights_equal(reply["center"], [KERNEL + 1.5, BIAS + 1.5])
    # B's own commit plus A's: not only B's, so B gets the weights too.
    assert_weights_equal(b.pull_unless_own()["center"], [KERNEL + 1.5, BIAS + 1.5])
    # From here on each sees only its own commits.
    a.commit(layers(1.0, 1.0))
    assert a.pull_unless_own() == {"unchanged": True, "num_updates": 3}
    a.quit()
    b.quit()


def test_pull_unless_own_sends_the_center_after_a_refused_commit(servers):
    server = servers(ADAGParameterServer)
    client = Client(server, 0)
    client.pull()
    client.commit(layers(np.nan, 1.0))  # refused: the worker must not add it itself
    reply = client.pull_unless_own()
    assert reply["num_updates"] == 0
    assert_weights_equal(reply["center"], [KERNEL, BIAS])
    client.quit()
    assert server.center.refused == 1
    assert_weights_equal(center_copy(server), [KERNEL, BIAS])


def test_pull_unless_own_always_sends_weights_for_rules_that_rescale(servers):
    class HalvingServer(ADAGParameterServer):  # inherits the flag, not the rule
        def handle_commit(self, conn, addr):
            data = recv_data(conn)
            with self.mutex:
                self.center_variable = self.center_variable + 0.5 * data["delta"]
                self.next_update(conn)

    for server_cls in (DynSGDParameterServer, HalvingServer):
        server = servers(server_cls)
        client = Client(server, 0)
        client.pull()
        client.commit(layers(1.0, 1.0), last_update=0)
        reply = client.pull_unless_own()
        client.quit()
        assert "center" in reply and reply["num_updates"] == 1, server_cls


def test_history_server_takes_progress_reports_and_refuses_weights(model):
    from distkeras.transport.parameter_servers import HistoryServer

    server = HistoryServer(model)
    server.start()
    try:
        before = center_copy(server)
        from distkeras.executor.step_history import HistoryLog, ProgressReporter

        reporter = ProgressReporter("127.0.0.1", server.port, server.token)
        reporter.open(worker_id=0)
        history = HistoryLog()
        history.append({"batch_size": 32, "loss": 0.5})
        reporter.report(history)
        history.append({"batch_size": 32, "loss": 0.25})
        reporter.report(history)  # not due yet: kept for the last report
        assert history.size == 1
        reporter.close(history)
        # close() returns once the server has read everything.
        assert [record["loss"] for record in server.history] == [0.5, 0.25]
        for exchange in ("commit", "pull", "pull_unless_own"):
            client = Client(server, worker_id=1)
            try:
                if exchange == "commit":
                    client.commit(layers(1.0, 1.0))
                else:
                    networking.send_action(client.sock, getattr(
                        networking, "ACTION_" + exchange.upper()))
            except (BrokenPipeError, ConnectionResetError):
                pass  # the server closed the connection before the whole commit was sent
            with pytest.raises(ConnectionError):
                recv_data(client.sock)  # the server closed this connection
            client.close()
        assert server.num_updates == 0
        assert_weights_equal(server.center_variable, before)
    finally:
        server.stop()


def test_a_sequential_worker_trains_without_progress_when_the_driver_is_unreachable(caplog):
    import socket as socket_module

    from distkeras.utils import serialize_model
    from distkeras.workers import SequentialWorker
    from worker_support import record_batches, small_model

    probe = socket_module.socket()
    probe.bind(("127.0.0.1", 0))
    closed_port = probe.getsockname()[1]
    probe.close()  # nothing listens there now
    worker = SequentialWorker(serialize_model(small_model()), optimizer="adam",
                              loss="categorical_crossentropy", metrics=[],
                              features_col="features", label_col="label", batch_size=16,
                              num_epoch=1)
    worker.backend = keras.backend.backend()
    worker.PROGRESS_CONNECT_SECONDS = 0.5
    worker.progress_address = ("127.0.0.1", closed_port)
    worker.token = "0" * 64
    message = worker.run(0, record_batches(rows=100), [(3,)])

    assert message["samples"] == 100 and len(message["weights"]) == 4
    assert len(message["history_columns"][0]) == 7  # every step, kept for the result
    assert "training without progress reports" in caplog.text


def _history_columns(worker_id, epochs, batch_size=10):
    return {"worker_id": [worker_id] * len(epochs), "iteration": list(range(1, len(epochs) + 1)),
            "batch_size": [batch_size] * len(epochs), "epoch": list(epochs),
            "loss": [1.0] * len(epochs)}


def _wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_retried_task_supersedes_the_failed_attempts_steps(servers):
    """Spark retried worker 1's task: the failed attempt's steps left the progress at
    2 epochs of 3 done, counted twice, and its goodbye (sent as its task failed) made the
    monitor take worker 1 for finished."""
    from distkeras.training.monitor import TrainingMonitor

    server = servers()
    monitor = TrainingMonitor(server, None, "group", total_samples=60, verbose=0,
                              num_epoch=3, num_tasks=2)
    first = Client(server, worker_id=0)
    first.send_history(_history_columns(0, [0]))
    failed = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    networking.authenticate(failed, server.token, 1, task_attempt_id=5)
    networking.send_action(failed, networking.ACTION_HISTORY)
    send_data(failed, {"history": _history_columns(1, [0, 1])})
    networking.send_action(failed, networking.ACTION_QUIT)
    networking.close_socket(failed)
    _wait_for(lambda: len(server.history) == 3 and 1 in server.sink.finished())
    monitor._read_new_records()
    assert monitor._samples == 30

    retry = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    networking.authenticate(retry, server.token, 1, task_attempt_id=9)
    networking.send_action(retry, networking.ACTION_HISTORY)
    send_data(retry, {"history": _history_columns(1, [0])})
    _wait_for(lambda: len(server.history) == 4)
    monitor._read_new_records()

    assert 1 not in server.sink.finished()  # it trains its partition again
    assert monitor._samples == 20  # worker 0's step and the retry's, not the lost two
    assert monitor._finished_epochs() == 0
    lost = [record for record in server.history if record.get("superseded")]
    assert [(record["worker_id"], record["attempt"]) for record in lost] == [(1, 0), (1, 0)]
    assert server.history[-1]["attempt"] == 1 and "superseded" not in server.history[-1]
    networking.close_socket(retry)
    first.close()


def test_the_same_attempt_reconnecting_supersedes_nothing(servers):
    server = servers()
    for _ in range(2):
        client = Client(server, worker_id=3)
        client.send_history(_history_columns(3, [0]))
        client.quit()
    _wait_for(lambda: len(server.history) == 2)
    assert server.sink.history_generation == 0
    assert not any("superseded" in record or "attempt" in record for record in server.history)


def test_a_commit_after_a_long_compile_is_not_idle_while_its_payload_arrives(servers):
    # A worker that compiled for longer than worker_timeout then commits: from the commit's
    # action on it is a worker that steps, but its silence ended with that action, not
    # when the handler has read the (large) payload: the monitor named it a stalled worker.
    server = servers()
    client = Client(server, 1)
    networking.send_action(client.sock, networking.ACTION_COMPILING)
    time.sleep(1.0)  # compiling: within the start-up allowance
    networking.send_action(client.sock, networking.ACTION_COMMIT)
    time.sleep(0.3)  # the payload is still on its way
    assert server.transport.idle_workers(0.8, startup_limit=60.0) == []
    send_data(client.sock, {"delta": weights_array(layers(0.5, -0.25))})
    assert client.pull()["num_updates"] == 1
    client.quit()
