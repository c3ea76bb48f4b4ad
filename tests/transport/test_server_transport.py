"""The socket transport of the servers (`socket_transport.SocketTransport`) on its own,
without a model: a real socket on 127.0.0.1, the token, actions it does not take, many
connections, eviction of silent handshakes and random bytes."""

import random
import socket
import threading
import time

import pytest

from distkeras.transport import networking
from distkeras.networking import recv_data, send_data
from distkeras.transport.socket_transport import SocketTransport

ECHO = b"e"  # not one of the protocol's actions: this test server's own


class EchoServer(SocketTransport):
    """Answers each echo frame with the frame it read; says who joined."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.joined_workers = []

    def action_handlers(self):
        return {ECHO: (self.handle_echo, False),
                networking.ACTION_QUIT: (self.handle_quit, True)}

    def joined(self, conn):
        with self.lock:
            self.joined_workers.append(conn.worker_id)

    def handle_echo(self, conn, addr):
        send_data(conn, recv_data(conn))

    def handle_quit(self, conn, addr):
        """Nothing to keep: the connection ends."""


@pytest.fixture
def server():
    server = EchoServer(handshake_timeout=2.0)
    server.start()
    yield server
    server.stop(grace_seconds=0)


def connect(server, token=None, worker_id=0):
    sock = networking.connect("127.0.0.1", server.port, timeout=5)
    sock.settimeout(10)
    if token is not False:
        networking.authenticate(sock, server.token if token is None else token, worker_id)
    return sock


def echo(sock, payload):
    networking.send_action(sock, ECHO)
    send_data(sock, payload)
    return recv_data(sock)


def assert_closed_by_server(sock):
    """The server closed ``sock``: a read ends (EOF or reset) instead of waiting."""
    sock.settimeout(5)
    try:
        assert sock.recv(1) == b""
    except ConnectionResetError:
        pass
    finally:
        sock.close()


def connection_threads():
    return [thread for thread in threading.enumerate()
            if thread.name.startswith("distkeras-ps-conn-")]


def wait_for(condition, within=10.0):
    deadline = time.monotonic() + within
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_an_honest_client_is_served_on_a_real_socket(server):
    assert server.host == "127.0.0.1" and server.port > 0
    sock = connect(server, worker_id=7)
    assert echo(sock, {"n": 1, "text": "hello"}) == {"n": 1, "text": "hello"}
    networking.send_action(sock, networking.ACTION_QUIT)
    assert_closed_by_server(sock)
    assert server.joined_workers == [7]
    assert server.wait_for_goodbyes(5) and server.errors == []


def test_a_wrong_token_is_refused(server):
    for token in ("0" * 64, server.token[:-1], ""):
        sock = connect(server, token=token)
        assert_closed_by_server(sock)
    sock = connect(server, token=False)
    send_data(sock, {"worker_id": 1})  # no token at all
    assert_closed_by_server(sock)
    assert server.joined_workers == [] and server.errors == []


def test_an_action_it_does_not_take_is_refused_and_others_go_on(server):
    honest = connect(server, worker_id=1)
    for action in (networking.ACTION_COMMIT, networking.ACTION_PULL, b"\x00", b"z"):
        sock = connect(server, worker_id=2)
        networking.send_action(sock, action)
        assert_closed_by_server(sock)
    assert echo(honest, {"xs": [1, 2, 3]}) == {"xs": [1, 2, 3]}
    honest.close()
    assert server.errors == []  # refused, not a bug of the server's


def test_many_connections_are_served_at_once(server):
    clients = [connect(server, worker_id=index) for index in range(60)]
    results = [None] * len(clients)

    def run(index):
        results[index] = [echo(clients[index], {"i": index, "k": k})["k"] for k in range(5)]

    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(clients))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [list(range(5))] * len(clients)
    assert sorted(server.joined_workers) == list(range(len(clients)))
    for sock in clients:
        networking.send_action(sock, networking.ACTION_QUIT)
        assert_closed_by_server(sock)
    assert server.wait_for_goodbyes(10) and server.errors == []


def test_silent_handshakes_are_evicted_oldest_first(server):
    server.max_pending_handshakes = 4
    silent = [connect(server, token=False) for _ in range(10)]
    assert wait_for(lambda: server.handshakes_closed >= 6)
    for sock in silent[:6]:
        assert_closed_by_server(sock)
    honest = connect(server, worker_id=3)
    assert echo(honest, {"text": "served"}) == {"text": "served"}
    for sock in [honest, *silent[6:]]:
        sock.close()
    assert server.errors == []


def test_random_bytes_do_not_kill_the_server_for_an_honest_client(server):
    server.handshake_timeout = 0.5
    rng = random.Random(33)
    honest = connect(server, worker_id=0)
    for round_ in range(120):
        authenticated = round_ % 2 == 0
        sock = connect(server, token=None if authenticated else False, worker_id=round_)
        noise = bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 300)))
        if authenticated and rng.random() < 0.5:
            noise = ECHO + noise  # an echo frame of garbage
        try:
            sock.sendall(noise)
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused before all of it arrived
        sock.close()
        if round_ % 20 == 0:
            assert echo(honest, {"round": round_}) == {"round": round_}
    assert echo(honest, {"round": "last"}) == {"round": "last"}
    # Every noisy connection ends (EOF, or the handshake's deadline): no thread is left.
    assert wait_for(lambda: len(connection_threads()) == 1)
    assert server.errors == []
    networking.send_action(honest, networking.ACTION_QUIT)
    assert_closed_by_server(honest)


def test_a_port_in_use_gives_a_clear_error(server):
    taken = EchoServer(master_port=server.port)
    with pytest.raises(OSError, match="master_port=0"):
        taken.start()


def test_stop_ends_every_connection_and_its_thread():
    server = EchoServer()
    server.start()
    clients = [connect(server, worker_id=index) for index in range(5)]
    assert echo(clients[0], {"n": 1}) == {"n": 1}
    assert wait_for(lambda: len(connection_threads()) >= 5)
    server.stop(grace_seconds=0)
    for sock in clients:
        assert_closed_by_server(sock)
    assert wait_for(lambda: connection_threads() == [])
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).recv(1)


def test_the_servers_hold_their_parts_instead_of_inheriting_them():
    """A server holds a transport, a center and a history sink and hands each its work:
    the progress server has no pull or commit to refuse, and SingleTrainer's epoch
    server holds an epoch barrier, not model averaging of one worker."""
    import keras

    from distkeras.parameter_servers import DeltaParameterServer, SocketParameterServer
    from distkeras.transport.center import CenterExchange, CenterVariable
    from distkeras.transport.epoch_barrier import EpochBarrier
    from distkeras.transport.history_sink import HistorySink
    from distkeras.transport.epoch_servers import AveragingServer, EpochServer
    from distkeras.transport.parameter_servers import HistoryServer

    for part in (SocketTransport, CenterVariable, HistorySink, EpochBarrier):
        for server_class in (SocketParameterServer, HistoryServer, AveragingServer,
                             EpochServer):
            assert not issubclass(server_class, part), (server_class, part)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    servers = [DeltaParameterServer(model), HistoryServer(model),
               AveragingServer(model, 2), EpochServer(model, [])]
    for server in servers:
        assert isinstance(server.transport, SocketTransport)
        assert server.transport.server is server  # the actions are served by the server
        assert isinstance(server.sink, HistorySink) and server.sink.center is server.center
    delta, history, averaging, epochs = servers
    assert isinstance(delta.center, CenterExchange)
    # The progress server holds the weights only: no exchange, no pull or commit.
    assert type(history.center) is CenterVariable
    assert not any(hasattr(history, name) for name in
                   ("handle_pull", "handle_pull_unless_own", "handle_commit"))
    assert not (set(history.action_handlers()) & {networking.ACTION_PULL,
                                                   networking.ACTION_COMMIT})
    for server in (averaging, epochs):
        assert isinstance(server.barrier, EpochBarrier) and server.barrier.center is \
            server.center
    assert not issubclass(EpochServer, AveragingServer)
    # What seed 000 reads and writes on a server is its center's.
    delta.center_variable = delta.center_variable * 2
    assert delta.center.center_variable is delta.center_variable
    assert delta.mutex is delta.center.mutex


def test_a_subclass_rule_is_served_through_the_parts():
    """Seed 000's escape hatch, without Spark: a subclass's `handle_commit` reads the
    commit with `recv_data` and changes ``center_variable`` under ``mutex``."""
    import keras
    import numpy as np

    from distkeras.transport.networking import weights_array
    from distkeras.parameter_servers import SocketParameterServer

    class HalfStep(SocketParameterServer):
        def handle_commit(self, conn, addr):
            data = recv_data(conn)
            with self.mutex:
                self.center_variable = self.center_variable + 0.5 * data["delta"]

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    server = HalfStep(model)
    server.start()
    try:
        sock = connect(server)
        first = [np.array(layer) for layer in server.center_variable]
        networking.send_action(sock, networking.ACTION_COMMIT)
        send_data(sock, {"delta": weights_array(np.ones_like(layer) for layer in first)})
        networking.send_action(sock, networking.ACTION_PULL)
        pulled = recv_data(sock)
        assert pulled["num_updates"] == 1 == server.num_updates
        for before, after in zip(first, pulled["center"]):
            np.testing.assert_allclose(after, before + 0.5)
        sock.close()
    finally:
        server.stop(grace_seconds=0)
    assert server.transport.errors == []
