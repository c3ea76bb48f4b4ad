"""The tiny Dense(3 -> 2) model that the parameter-server tests compute golden values on,
and a fake worker (`Client`) speaking the wire protocol to a server on 127.0.0.1."""

import socket
import time

import distkeras  # noqa: F401  (selects the JAX backend before Keras is imported)

import keras
import numpy as np
import pytest

from distkeras.transport import networking
from distkeras.networking import recv_data, send_data
from distkeras.transport.networking import weights_array

KERNEL = np.array([[0.5, -1.0], [0.25, 2.0], [-0.75, 0.0]], dtype=np.float32)
BIAS = np.array([0.125, -0.5], dtype=np.float32)


def make_model(kernel=KERNEL, bias=BIAS):
    """A Dense(3 -> 2) model holding ``kernel`` and ``bias``."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.set_weights([kernel, bias])
    return model


def copy_weights(weights):
    return [np.array(layer, copy=True) for layer in weights]


def assert_weights_equal(got, want):
    assert len(got) == len(want)
    for got_layer, want_layer in zip(got, want):
        np.testing.assert_array_equal(np.asarray(got_layer), np.asarray(want_layer))


class Client:
    """A fake worker speaking the wire protocol."""

    def __init__(self, server, worker_id=0, token=None, authenticate=True):
        self.sock = networking.connect("127.0.0.1", server.port, timeout=5)
        self.sock.settimeout(10)
        if authenticate:
            networking.authenticate(self.sock, server.token if token is None else token,
                                    worker_id)

    def commit(self, delta, key="delta", **extra):
        networking.send_action(self.sock, networking.ACTION_COMMIT)
        send_data(self.sock, {key: weights_array(delta), **extra})

    def pull(self):
        networking.send_action(self.sock, networking.ACTION_PULL)
        return recv_data(self.sock)

    def pull_unless_own(self):
        networking.send_action(self.sock, networking.ACTION_PULL_UNLESS_OWN)
        return recv_data(self.sock)

    def send_history(self, columns):
        networking.send_action(self.sock, networking.ACTION_HISTORY)
        send_data(self.sock, {"history": columns})

    def quit(self):
        networking.send_action(self.sock, networking.ACTION_QUIT)
        networking.close_socket(self.sock)

    def close(self):
        self.sock.close()


def layers(kernel_value, bias_value):
    return [np.full((3, 2), kernel_value, np.float32), np.full(2, bias_value, np.float32)]


def center_copy(server):
    with server.mutex:
        return copy_weights(server.center_variable)


def expect_closed_by_server(sock, within=5.0):
    """The server closes the connection: recv sees EOF or a reset, never a timeout."""
    sock.settimeout(within)
    start = time.monotonic()
    try:
        while True:
            if sock.recv(65536) == b"":
                break
    except (ConnectionResetError, BrokenPipeError):
        pass
    except socket.timeout:
        pytest.fail("the server kept the connection open")
    finally:
        sock.close()
    return time.monotonic() - start
