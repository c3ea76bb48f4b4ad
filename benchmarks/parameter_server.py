"""Parameter server cost: commit + pull of the 784-500-500-10 weights against a raw loopback
round trip of the same bytes (and with the pull a lone worker makes, which gets no weights
back when only its own commit moved the center); commits per second that one server
sustains from 1, 2, 4 and 8 concurrent clients.

    python benchmarks/parameter_server.py [--rounds 300]
"""

import argparse
import os
import socket
import statistics
import sys
import threading
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, os.path.dirname(__file__))

import numpy as np  # noqa: E402

from distkeras.transport import networking  # noqa: E402
from distkeras.transport.networking import weights_array  # noqa: E402
from distkeras.parameter_servers import ADAGParameterServer  # noqa: E402


def build_mlp():
    import keras

    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(500, activation="relu"),
                             keras.layers.Dense(500, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])


def raw_round_trip(nbytes, rounds):
    """Median seconds to send nbytes and receive nbytes back over loopback TCP."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)

    def echo():
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = bytearray(nbytes)
        for _ in range(rounds):
            networking.recv_exact(conn, nbytes)
            conn.sendall(buffer)
        conn.close()

    thread = threading.Thread(target=echo)
    thread.start()
    client = networking.connect("127.0.0.1", server.getsockname()[1])
    payload = bytearray(nbytes)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        client.sendall(payload)
        networking.recv_exact(client, nbytes)
        times.append(time.perf_counter() - start)
    thread.join()
    client.close()
    server.close()
    return statistics.median(times)


class Client:
    def __init__(self, server, worker_id):
        self.sock = networking.connect("127.0.0.1", server.port)
        networking.authenticate(self.sock, server.token, worker_id)

    def commit_and_pull(self, delta, unless_own=False):
        networking.send_action(self.sock, networking.ACTION_COMMIT)
        networking.send_data(self.sock, {"delta": delta})
        networking.send_action(self.sock, networking.ACTION_PULL_UNLESS_OWN if unless_own
                               else networking.ACTION_PULL)
        return networking.recv_data(self.sock)

    def close(self):
        networking.send_action(self.sock, networking.ACTION_QUIT)
        self.sock.close()


def commit_pull_time(model, rounds, unless_own=False):
    server = ADAGParameterServer(model, 0)
    server.start()
    delta = weights_array(np.zeros_like(w) for w in model.get_weights())
    client = Client(server, 0)
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        client.commit_and_pull(delta, unless_own)
        times.append(time.perf_counter() - start)
    client.close()
    server.stop()
    return statistics.median(times)


def throughput(model, clients, seconds=3.0):
    server = ADAGParameterServer(model, 0)
    server.start()
    delta = weights_array(np.zeros_like(w) for w in model.get_weights())
    stop = time.monotonic() + seconds
    counts = [0] * clients

    def run(index):
        client = Client(server, index)
        while time.monotonic() < stop:
            client.commit_and_pull(delta)
            counts[index] += 1
        client.close()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    start = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - start
    server.stop()
    return sum(counts) / elapsed


def main():
    import report

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    model = build_mlp()
    nbytes = sum(w.nbytes for w in model.get_weights())
    raw = raw_round_trip(nbytes, args.rounds)
    ours = commit_pull_time(model, args.rounds)
    lone = commit_pull_time(model, args.rounds, unless_own=True)
    rows = [["raw loopback round trip (send + receive the same bytes)", f"{raw * 1e3:.2f}", "1.00"],
            ["distkeras commit + pull (ADAG server)", f"{ours * 1e3:.2f}", f"{ours / raw:.2f}"],
            ["distkeras commit + pull of a lone worker (only its own commit since its last "
             "pull: no weights back)", f"{lone * 1e3:.2f}", f"{lone / raw:.2f}"]]
    body = (f"Weights of the 784-500-500-10 MLP: {nbytes / 1e6:.2f} MB. Median of "
            f"{args.rounds} rounds, client and server in one process (server threads).\n\n"
            + report.table(["operation", "ms", "ratio to raw"], rows))
    rates = [[n, f"{throughput(model, n):.0f}"] for n in (1, 2, 4, 8)]
    body += ("\n\nCommit + pull pairs per second that one ADAG server sustains, clients as "
             "threads in the same process (3 s each):\n\n"
             + report.table(["concurrent clients", "commit+pull per s"], rates))
    report.write_section("Parameter server: commit + pull against a raw round trip", body)


if __name__ == "__main__":
    main()
