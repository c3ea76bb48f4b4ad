"""A sharded center (`server_shards`, `shard_layout`, the worker's `ShardLinks`): over
real sockets, S shard processes give the centers one server gives."""

import os
import queue
import signal
import time

import numpy as np
import pytest

from distkeras.algorithms import DOWNPOUR, DynSGD
from distkeras.executor.shard_links import ShardLinks
from distkeras.transport.parameter_servers import AlgorithmServer, DeltaParameterServer
from distkeras.transport import compression as codecs
from distkeras.transport import networking
from distkeras.transport.networking import weights_array
from distkeras.transport.server_shards import sharded_server
from distkeras.transport.shard_layout import join, shard_layout, split
from ps_support import assert_weights_equal, make_model


def _connect(server, port, worker_id):
    sock = networking.Connection(networking.connect("127.0.0.1", port, timeout=5))
    sock.settimeout(30)
    networking.authenticate(sock, server.token, worker_id)
    return sock


class _Plain:
    """One worker's exchanges with one server, as `ShardLinks` makes them with shards."""

    def __init__(self, server, worker_id):
        self.sock = _connect(server, server.port, worker_id)

    def commit(self, message):
        networking.send_action(self.sock, networking.ACTION_COMMIT)
        networking.send_data(self.sock, message)

    def pull(self, action):
        networking.send_action(self.sock, action)
        return networking.recv_data(self.sock)

    def close(self):
        networking.close_socket(self.sock)


def _links(server, worker_id):
    if server.shards is None:
        return _Plain(server, worker_id)
    ports = (server.port,) + server.shards.ports
    return ShardLinks([_connect(server, port, worker_id) for port in ports],
                      server.shards.weight_spec)


def _wait_until_applied(server, count):
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with server.mutex:
            counts = [server.num_updates] + (server.shards.counts() if server.shards else [])
        if all(each == count for each in counts):
            return
        time.sleep(0.005)
    raise AssertionError(f"the commits were not applied: {counts} != {count}")


def _batch_norm_model():
    """Dense, BatchNormalization (two non-trainable weights), Dense: 42 entries."""
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4),
                              keras.layers.BatchNormalization(), keras.layers.Dense(2)])
    rng = np.random.default_rng(3)
    model.set_weights([rng.random(weight.shape).astype(np.float32) + 0.5
                       for weight in model.get_weights()])
    return model


def _play(server, compression=None, make=make_model):
    """A fixed sequence of two workers' pulls and commits (stale ones among them);
    returns what the pulls brought (as float32) and the final center."""
    rng = np.random.default_rng(7)
    spec = [(layer.shape, layer.dtype) for layer in make().get_weights()]
    encoder = None if compression is None else codecs.Encoder(codecs.parse(compression),
                                                              spec, False)
    workers = [_links(server, 0), _links(server, 1)]
    counts = [0, 0]
    pulled = []
    applied = 0
    script = [(0, "pull"), (1, "pull"), (0, "commit"), (1, "commit"), (0, "pull"),
              (0, "commit"), (1, "commit"), (1, "unless"), (0, "commit"), (0, "unless"),
              (1, "commit"), (1, "pull")]
    try:
        for worker, step in script:
            links = workers[worker]
            if step == "commit":
                delta = [rng.standard_normal(shape).astype(np.float32) for shape, _ in spec]
                fields = ({"delta": weights_array(delta)} if encoder is None
                          else encoder.encode(weights_array(delta))[0])
                links.commit({"worker_id": worker, "last_update": counts[worker], **fields})
                applied += 1
                _wait_until_applied(server, applied)  # the script's order, not a race
                continue
            action = (networking.ACTION_PULL if step == "pull"
                      else networking.ACTION_PULL_UNLESS_OWN)
            reply = links.pull(action)
            counts[worker] = reply["num_updates"]
            pulled.append((reply["num_updates"], reply.get("unchanged"),
                           [np.asarray(layer).astype(np.float32)
                            for layer in reply.get("center", [])]))
        with server.mutex:
            return pulled, [np.array(layer) for layer in server.center_variable], \
                server.num_updates
    finally:
        for links in workers:
            links.close()


@pytest.mark.parametrize("algorithm,compression,make,shards", [
    (DOWNPOUR, None, make_model, 2), (DynSGD, None, make_model, 2),
    (DOWNPOUR, "bfloat16", make_model, 2), (DynSGD, "bfloat16", make_model, 2),
    # Non-trainable weights count whole in DynSGD: each shard knows which of its are.
    (DynSGD, None, _batch_norm_model, 3)])
def test_shards_give_the_centers_of_one_server(algorithm, compression, make, shards):
    results = []
    for count in (1, shards):
        if count == 1:
            server = AlgorithmServer(make(), algorithm=algorithm(), compression=compression)
        else:
            server = sharded_server(AlgorithmServer, make(), count,
                                    algorithm=algorithm(), compression=compression)
        server.start()
        try:
            results.append(_play(server, compression, make))
        finally:
            server.stop()
    (one_pulls, one_center, one_count), (two_pulls, two_center, two_count) = results
    assert two_count == one_count == 6
    assert_weights_equal(two_center, one_center)
    assert len(two_pulls) == len(one_pulls)
    for (count, unchanged, center), (want_count, want_unchanged, want) in \
            zip(two_pulls, one_pulls):
        assert (count, unchanged) == (want_count, want_unchanged)
        assert_weights_equal(center, want)
    assert not np.allclose(one_center[0], make().get_weights()[0])


def _dense_model():
    """Dense(20 -> 10): 210 entries, the kernel split between two or three shards."""
    import keras

    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(10)])
    rng = np.random.default_rng(4)
    model.set_weights([rng.standard_normal(weight.shape).astype(np.float32)
                       for weight in model.get_weights()])
    return model


def _play_topk(server):
    """Two workers' top-k commits and pulls, each worker keeping its center as
    `NetworkWorker` does (`Encoder.take_pull`, its own commit after an "unchanged");
    returns each pull's kind and center, the final center and the update count."""
    spec = [(layer.shape, layer.dtype) for layer in _dense_model().get_weights()]
    compression = codecs.parse("topk:0.1")
    rng = np.random.default_rng(9)
    workers = [_links(server, 0), _links(server, 1)]
    encoders = [codecs.Encoder(compression, spec) for _ in range(2)]
    centers = [None, None]
    seen = []
    applied = 0
    # Worker 1 sits out six commits of worker 0: its next pull finds the logs full.
    script = ([(0, "pull"), (1, "pull"), (0, "commit"), (1, "commit"), (0, "unless"),
               (1, "pull"), (0, "commit"), (0, "unless"), (1, "commit"), (0, "pull"),
               (1, "unless")] + [(0, "commit"), (0, "unless")] * 6 + [(1, "pull")])
    try:
        for worker, step in script:
            links, encoder = workers[worker], encoders[worker]
            if step == "commit":
                delta = weights_array([rng.standard_normal(shape).astype(np.float32)
                                       for shape, _ in spec])
                fields, sent = encoder.encode(delta)
                links.commit({"worker_id": worker, "last_update": 0, **fields})
                encoder.sent(sent)
                applied += 1
                _wait_until_applied(server, applied)
                continue
            reply = links.pull(networking.ACTION_PULL if step == "pull"
                               else networking.ACTION_PULL_UNLESS_OWN)
            if reply.get("unchanged") is True:
                kind = "unchanged"
                for update in encoder.own_sent:
                    centers[worker] = centers[worker] + update
                encoder.own_sent = []
            else:
                kind = "sparse" if "indices" in reply else "center"
                centers[worker] = encoder.take_pull(reply, centers[worker])
            seen.append((worker, kind, [np.array(layer) for layer in centers[worker]]))
        with server.mutex:
            return seen, [np.array(layer) for layer in server.center_variable], \
                server.num_updates
    finally:
        for links in workers:
            links.close()


@pytest.mark.parametrize("shards", [2, 3])
def test_topk_commits_split_by_key_range_give_the_centers_of_one_server(shards):
    results = []
    for count in (1, shards):
        if count == 1:
            server = AlgorithmServer(_dense_model(), algorithm=DOWNPOUR(),
                                     compression="topk:0.1")
        else:
            server = sharded_server(AlgorithmServer, _dense_model(), count,
                                    algorithm=DOWNPOUR(), compression="topk:0.1")
        server.start()
        try:
            results.append(_play_topk(server))
        finally:
            server.stop()
    (one_seen, one_center, one_count), (seen, center, count) = results
    assert count == one_count == 10
    assert_weights_equal(center, one_center)  # the shards add each entry as one server
    assert [kind for _, kind, _ in seen] == [kind for _, kind, _ in one_seen]
    assert {kind for _, kind, _ in seen} == {"center", "sparse", "unchanged"}
    for (_, _, got), (_, _, want) in zip(seen, one_seen):
        for got_layer, want_layer in zip(got, want):
            np.testing.assert_allclose(got_layer, want_layer, rtol=0, atol=1e-5)
    # Each worker's center is the server's, to float32 rounding of the order of adds.
    for got_layer, want_layer in zip(seen[-1][2], center):
        np.testing.assert_allclose(got_layer, want_layer, rtol=0, atol=1e-5)


def test_a_topk_commit_that_one_shard_refuses_leaves_the_worker_the_whole_center():
    """A shard that refused its part (NaN) answers the worker's next pull with its center,
    the other with a sparse reply; the worker pulls that one's center too, so the center
    it goes on from is the shards' own, whatever each applied."""
    server = sharded_server(AlgorithmServer, _dense_model(), 2, algorithm=DOWNPOUR(),
                            compression="topk:0.1")
    server.start()
    links = _links(server, 0)
    try:
        spec = server.shards.weight_spec
        encoder = codecs.Encoder(codecs.parse("topk:0.1"), spec)
        center = encoder.take_pull(links.pull(networking.ACTION_PULL), None)
        delta = weights_array([np.ones(shape, np.float32) for shape, _ in spec])
        delta[0][0, 0] = 8.0  # among the entries sent
        fields, sent = encoder.encode(delta)
        links.commit({"worker_id": 0, "last_update": 0, **fields})
        encoder.sent(sent)
        # Entry 0 is shard 0's, entry 209 (the last bias) shard 1's: shard 1 refuses.
        links.commit({"worker_id": 0, "last_update": 0,
                      "indices": np.array([0, 209], np.uint32),
                      "values": np.array([0.5, np.nan], np.float32)})
        encoder.sent(weights_array([np.zeros(shape, np.float32) for shape, _ in spec]))
        deadline = time.monotonic() + 30
        while (server.num_updates, server.shards.counts()) != (2, [1]):
            assert time.monotonic() < deadline, "the commits were not served"
            time.sleep(0.005)
        reply = links.pull(networking.ACTION_PULL)
        assert "center" in reply and "indices" not in reply
        center = encoder.take_pull(reply, center)
        assert_weights_equal(center, server.center_variable)
        first = _dense_model().get_weights()[0][0, 0]
        assert center[0][0, 0] == first + np.float32(8.0) + np.float32(0.5)
    finally:
        links.close()
        server.stop()


def test_a_topk_commit_that_reached_one_shard_first_still_joins_into_a_sparse_pull():
    """Another worker's commit reaches the shards one after the other: a pull in between
    finds one shard moved by it (a sparse reply) and one moved only by this worker's own
    commit ("unchanged"); the two join into one sparse reply, with no center sent."""
    server = sharded_server(AlgorithmServer, _dense_model(), 2, algorithm=DOWNPOUR(),
                            compression="topk:0.1")
    server.start()
    mine, other = _links(server, 0), _links(server, 1)
    try:
        spec = server.shards.weight_spec
        rng = np.random.default_rng(2)
        encoders = [codecs.Encoder(codecs.parse("topk:0.1"), spec) for _ in range(2)]
        center = encoders[0].take_pull(mine.pull(networking.ACTION_PULL), None)
        encoders[1].take_pull(other.pull(networking.ACTION_PULL), None)

        def update():
            return weights_array([rng.standard_normal(shape).astype(np.float32)
                                  for shape, _ in spec])

        fields, sent = encoders[0].encode(update())
        mine.commit({"worker_id": 0, "last_update": 0, **fields})
        encoders[0].sent(sent)
        _wait_until_applied(server, 1)
        fields, _ = encoders[1].encode(update())
        indices, values = fields["indices"], fields["values"]
        boundary = other.key_starts[1]
        for shard, chosen in ((0, indices < boundary), (1, indices >= boundary)):
            # The other worker's commit, one shard at a time, with a pull in between.
            networking.send_action(other.sockets[shard], networking.ACTION_COMMIT)
            networking.send_data(other.sockets[shard], {
                "worker_id": 1, "last_update": 0, "values": values[chosen],
                "indices": (indices[chosen] - other.key_starts[shard]).astype(np.uint32)})
            wanted = [2, 1] if shard == 0 else [2, 2]  # shard 0's count, shard 1's
            deadline = time.monotonic() + 30
            while [server.num_updates] + server.shards.counts() != wanted:
                assert time.monotonic() < deadline, "the part was not applied"
                time.sleep(0.005)
            reply = mine.pull(networking.ACTION_PULL_UNLESS_OWN if shard == 0
                              else networking.ACTION_PULL)
            assert "center" not in reply and "unchanged" not in reply
            assert reply["own"] == (1 if shard == 0 else 0)
            center = encoders[0].take_pull(reply, center)
        for got, want in zip(center, server.center_variable):
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    finally:
        mine.close()
        other.close()
        server.stop()


def test_a_shard_closes_a_topk_part_of_more_entries_than_its_layers_send():
    server = sharded_server(AlgorithmServer, _dense_model(), 2, algorithm=DOWNPOUR(),
                            compression="topk:0.1")
    server.start()
    try:
        pieces = server.shards.layout[1]  # kernel entries (20 sent of 200), the bias (1)
        size = sum(stop - start for _, start, stop in pieces)
        allowed = sum(min(stop - start, 20 if layer == 0 else 1)
                      for layer, start, stop in pieces)
        sock = _connect(server, server.shards.ports[0], 0)
        for count in (allowed, allowed + 1):  # at most its share: then closed
            networking.send_action(sock, networking.ACTION_COMMIT)
            networking.send_data(sock, {"worker_id": 0, "last_update": 0,
                                        "indices": np.arange(count, dtype=np.uint32),
                                        "values": np.ones(count, np.float32)})
        assert count < size
        with pytest.raises((networking.PeerClosedError, ConnectionError, OSError)):
            networking.send_action(sock, networking.ACTION_PULL)
            networking.recv_data(sock)
        assert server.shards.counts() == [1]
        networking.close_socket(sock)
    finally:
        server.stop()
    assert not server.transport.errors


def test_the_center_is_read_and_written_across_shards_before_during_and_after():
    server = sharded_server(DeltaParameterServer, make_model(), 2)
    restored = [np.full((3, 2), 2.0, np.float32), np.full(2, 3.0, np.float32)]
    server.center_variable = weights_array(restored)  # a checkpoint, before the start
    server.num_updates = 4
    server.start()
    try:
        assert server.shards.counts() == [4]
        assert_weights_equal(server.center_variable, restored)
        new = [np.full((3, 2), 4.0, np.float32), np.full(2, -1.0, np.float32)]
        server.center_variable = weights_array(new)
        assert_weights_equal(server.center_variable, new)
        # The kernel is split between the two shards: each holds its part.
        assert [len(pieces) for pieces in server.shards.layout] == [1, 2]
    finally:
        server.stop()
    # The final model is read once the shards have stopped.
    assert_weights_equal(server.get_model().get_weights(), new)
    assert server.shards.counts() == [4]


@pytest.mark.parametrize("num_shards", [1, 2, 3, 5])
def test_a_commit_split_by_key_range_joins_back_whole(num_shards):
    spec = [((100, 7), np.float32), ((7,), np.float32), ((0,), np.float32),
            ((7, 3), np.float64), ((3,), np.int32)]
    rng = np.random.default_rng(num_shards)
    arrays = [rng.standard_normal(shape).astype(dtype) for shape, dtype in spec]
    layout = shard_layout(spec, num_shards)
    loads = [sum((stop - start) * np.dtype(spec[layer][1]).itemsize
                 for layer, start, stop in pieces) for pieces in layout]
    assert max(loads) - min(loads) <= 8  # balanced to one entry, though one layer dominates
    joined = join([split(arrays, pieces) for pieces in layout], layout, spec)
    for got, want in zip(joined, arrays):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)


def test_more_shards_than_entries_are_refused():
    with pytest.raises(ValueError, match="no weights"):
        shard_layout([((3,), np.float32)], 4)
    with pytest.raises(ValueError, match="positive int"):
        shard_layout([((3,), np.float32)], 0)


def test_the_escape_hatch_cannot_be_sharded():
    class OwnRule(DeltaParameterServer):
        def handle_commit(self, conn, addr):
            raise AssertionError("never called")

    with pytest.raises(ValueError, match="escape hatch.*num_server_shards=1"):
        sharded_server(OwnRule, make_model(), 2)


def test_a_shard_process_that_died_is_named_and_the_server_still_stops():
    server = sharded_server(DeltaParameterServer, make_model(), 2)
    told = queue.Queue()
    server.transport.on_error = told.put  # the trainer's: cancel the workers' Spark job
    server.start()
    try:
        (pid,) = server.shards.pids()
        os.kill(pid, signal.SIGKILL)
        # Told as it happens, not when the training would next read the shard.
        error = told.get(timeout=30)
        assert error == (f"parameter server shard 1 of 2 (pid {pid}): the process has "
                         "exited (killed by signal 9)")
        with pytest.raises(RuntimeError, match="shard has exited"):
            server.center_variable
    finally:
        server.stop(0.0)
    assert server.transport.errors[0] == error
    assert server.shards.pids() == []


def test_a_shard_whose_rule_raises_fails_the_run_at_once_naming_the_shard_and_cause():
    from shard_failure_support import BreaksInAShard

    server = sharded_server(AlgorithmServer, make_model(), 3,
                            algorithm=BreaksInAShard(fail_at=1))
    told = queue.Queue()
    server.transport.on_error = told.put
    server.start()
    links = _links(server, 0)
    try:
        pids = server.shards.pids()
        spec = server.shards.weight_spec
        for _ in range(2):  # the second commit breaks the rule in shards 1 and 2
            links.commit({"worker_id": 0, "delta": weights_array(
                [np.ones(shape, np.float32) for shape, _ in spec])})
        errors = sorted([told.get(timeout=30), told.get(timeout=30)])
        # Shard 0, on the driver, applies both commits and goes on serving.
        deadline = time.monotonic() + 30
        while server.num_updates < 2 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert server.num_updates == 2
    finally:
        links.close()
        server.stop(0.0)
    assert errors == [f"parameter server shard {shard} of 3 (pid {pid}): ArithmeticError: "
                      "the rule broke at update 1" for shard, pid in zip((1, 2), pids)]
    # Each told once: the stop adds no copy of them.
    assert sorted(server.transport.errors) == errors
    assert server.shards.counts() == [1, 1]  # what each had applied before it broke
