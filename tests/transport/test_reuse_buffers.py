"""The opt-in ``reuse_buffers`` of the adding servers (DOWNPOUR's, ADAG's) over real
loopback TCP: the same centers bit for bit, memory reused only where nothing holds it."""

import socket
import threading

import numpy as np
import pytest

from distkeras.transport import networking
from distkeras.networking import recv_data, send_data
from distkeras.transport.networking import weights_array
from distkeras.parameter_servers import ADAGParameterServer, DeltaParameterServer
from ps_support import make_model
from ps_support import Client, center_copy


@pytest.fixture
def started():
    servers = []

    def start(cls, **options):
        server = cls(make_model(), 0, **options)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop(grace_seconds=0)


def random_layers(rng):
    return [rng.standard_normal((3, 2)).astype(np.float32),
            rng.standard_normal(2).astype(np.float32)]


@pytest.mark.parametrize("cls,key", [(DeltaParameterServer, "delta"),
                                     (ADAGParameterServer, "residual")])
def test_reused_buffers_give_the_same_centers_and_pulls_bit_for_bit(started, cls, key):
    replies = {}
    for reuse in (False, True):
        server = started(cls, reuse_buffers=reuse)
        rng = np.random.default_rng(7)
        clients = [Client(server, index) for index in range(2)]
        got = []
        for round_ in range(6):
            for client in clients:
                client.commit(random_layers(rng), key=key)
                reply = client.pull_unless_own()
                got.append([np.array(layer) for layer in reply.get("center", [])])
        for client in clients:
            client.quit()
        replies[reuse] = (got, center_copy(server), server.num_updates)
    (plain_pulls, plain_center, plain_count), (pulls, center, count) = \
        replies[False], replies[True]
    assert count == plain_count == 12
    for want, have in zip(plain_center, center):
        np.testing.assert_array_equal(have, want)
    assert len(pulls) == len(plain_pulls)
    for want, have in zip(plain_pulls, pulls):
        assert len(want) == len(have)
        for want_layer, have_layer in zip(want, have):
            np.testing.assert_array_equal(have_layer, want_layer)


def test_a_center_held_elsewhere_is_never_written_into(started):
    server = started(DeltaParameterServer, reuse_buffers=True)
    client = Client(server)
    rng = np.random.default_rng(3)
    client.commit(random_layers(rng))
    client.pull()
    held = server.center_variable  # as a pull in flight or an epoch end holds it
    held_layer = server.center_variable[1]  # as a view being sent holds a layer
    before = [np.array(layer) for layer in held]
    for _ in range(4):
        client.commit(random_layers(rng))
        client.pull()
    client.quit()
    for want, have in zip(before, held):
        np.testing.assert_array_equal(have, want)
    np.testing.assert_array_equal(held_layer, before[1])
    assert server.num_updates == 5


def test_the_center_before_last_is_written_into_when_nothing_holds_it(started):
    server = started(ADAGParameterServer, reuse_buffers=True)
    client = Client(server)
    rng = np.random.default_rng(5)
    for _ in range(2):
        client.commit(random_layers(rng))
        client.pull()
    # The spare (the center before the current one) stays alive, so its id is its own.
    spare = id(server.writes.spare)
    client.commit(random_layers(rng))
    client.pull()
    assert id(server.center_variable) == spare
    client.quit()


def test_a_refused_commit_leaves_the_center_and_the_next_one_is_applied(started):
    server = started(DeltaParameterServer, reuse_buffers=True)
    client = Client(server)
    big = [np.full((3, 2), 3e38, np.float32), np.full(2, 3e38, np.float32)]
    client.commit(big)
    client.pull()
    center = center_copy(server)
    client.commit(big)  # pushes the center past float32: refused, the center stays
    reply = client.pull()
    assert reply["num_updates"] == 1 and server.center.refused == 1
    for want, have in zip(center, reply["center"]):
        np.testing.assert_array_equal(have, want)
    client.commit([-layer for layer in big])
    reply = client.pull()
    client.quit()
    for want, have in zip(center, reply["center"]):
        np.testing.assert_array_equal(have, want - np.float32(3e38))


def test_reuse_buffers_must_be_a_bool():
    with pytest.raises(ValueError, match="reuse_buffers"):
        DeltaParameterServer(make_model(), 0, reuse_buffers="yes")


def test_recv_data_reuses_the_connections_buffer_only_when_asked():
    left, right = socket.socketpair()
    conn = networking.Connection(right)
    try:
        def send(*values):
            for value in values:
                send_data(left, {"delta": weights_array([np.full(4, value, np.float32)])})

        threading.Thread(target=send, args=(1.0, 2.0, 3.0, 4.0)).start()
        first = recv_data(conn, reuse_body=True)["delta"][0]
        np.testing.assert_array_equal(first, np.full(4, 1.0, np.float32))
        second = recv_data(conn, reuse_body=True)["delta"][0]
        # The second frame landed where the first was: a reusing caller is done with it.
        assert np.shares_memory(first, second) and first[0] == 2.0
        third = recv_data(conn)["delta"][0]
        fourth = recv_data(conn)["delta"][0]
        assert not np.shares_memory(third, fourth) and not np.shares_memory(third, second)
        assert (third[0], fourth[0]) == (3.0, 4.0)
    finally:
        left.close()
        right.close()
