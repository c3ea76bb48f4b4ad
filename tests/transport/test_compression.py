"""Compressed commits and pulls (`transport.compression`): the codecs' golden values and
error feedback, and real servers on 127.0.0.1 taking compressed commits, answering
compressed pulls and closing connections whose compressed commits lie."""

import time
import weakref

import ml_dtypes
import numpy as np
import pytest

from distkeras import algorithms
from distkeras.algorithms import update_rules
from distkeras.transport import center_writes
from distkeras.transport import compression as codecs
from distkeras.transport import networking
from distkeras.transport.center import RefusedUpdate
from distkeras.transport.networking import weights_array
from distkeras.transport.parameter_servers import (AlgorithmServer, DeltaParameterServer,
                                                   DynSGDParameterServer)
from ps_support import BIAS, KERNEL, Client, center_copy, make_model

SPEC = [((3, 2), np.dtype(np.float32)), ((2,), np.dtype(np.float32))]
BF16 = np.dtype(ml_dtypes.bfloat16)


def layers(kernel, bias):
    return weights_array([np.array(kernel, np.float32).reshape(3, 2),
                          np.array(bias, np.float32)])


def as_lists(weights):
    return [np.asarray(layer).tolist() for layer in weights]


@pytest.fixture
def started():
    servers = []

    def start(cls=DeltaParameterServer, model=None, **options):
        server = cls(model if model is not None else make_model(), 0, **options)
        server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop(grace_seconds=0)


def send_commit(client, fields, worker_id=0, last_update=0):
    networking.send_action(client.sock, networking.ACTION_COMMIT)
    networking.send_data(client.sock, {**fields, "worker_id": worker_id,
                                       "last_update": last_update})


def wait_for_updates(server, count, timeout=10.0):
    """Waits until ``server`` applied ``count`` commits (another connection's thread
    applies them)."""
    deadline = time.monotonic() + timeout
    while server.num_updates < count:
        assert time.monotonic() < deadline, f"{server.num_updates} of {count} commits"
        time.sleep(0.005)


def wait_until_unheld(server, timeout=10.0):
    """Waits until no server thread still holds the center (a pull's handler drops its
    reference after the reply is sent, a moment after the client has it)."""
    from distkeras.transport.center import unshared

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with server.center.mutex:
            unheld = weights_array([np.empty(0)])
            holders = [unheld]  # held as the server's commit holds it
            weights = server.center.center_variable
            if unshared(weights, holders[0]):
                return
        del weights
        time.sleep(0.01)
    raise AssertionError("a server thread still holds the center")


def closed(client):
    """Whether the server closed ``client``'s connection (a pull gets no reply)."""
    try:
        client.pull()
    except (networking.PeerClosedError, ConnectionError, OSError):
        return True
    return False


# -- parse -----------------------------------------------------------------------------

def test_parse_names_the_accepted_values():
    assert codecs.parse(None) is None
    assert codecs.parse("bfloat16") == codecs.Compression("bfloat16")
    assert codecs.parse("topk") == codecs.Compression("topk", 0.01)
    assert codecs.parse("topk:0.05") == codecs.Compression("topk", 0.05)
    assert str(codecs.parse("topk:0.05")) == "topk:0.05"
    for bad in ("float16", "topk:0", "topk:1.5", "topk:x", "bfloat16:2", 16):
        with pytest.raises(ValueError, match="topk:F"):
            codecs.parse(bad)


# -- the codecs: golden values and error feedback -------------------------------------

def test_bfloat16_commit_rounds_to_nearest_even_and_feeds_the_error_back():
    encoder = codecs.Encoder(codecs.parse("bfloat16"), SPEC)
    # 1 + 2**-8 lies halfway between bfloat16's 1 and 1 + 2**-7: it rounds to the even 1.
    # float32(1/3) = 0x3EAAAAAB rounds up to 0x3EAB = 0.333984375.
    fields, sent = encoder.encode(layers([1 + 2**-8, 1 / 3, -2.0, 0, 0, 0], [0.5, 3.0]))
    assert fields["bfloat16"][0].dtype == BF16
    assert as_lists(sent) == [[[1.0, 0.333984375], [-2.0, 0.0], [0.0, 0.0]], [0.5, 3.0]]
    third = float(np.float32(1 / 3)) - 0.333984375
    assert as_lists(encoder.residual) == [[[2**-8, np.float32(third)], [0, 0], [0, 0]],
                                          [0, 0]]
    # A zero update then sends what was left out: 2**-8 is exact in bfloat16.
    _, sent = encoder.encode(layers([0] * 6, [0, 0]))
    assert sent[0][0, 0] == 2**-8 and encoder.residual[0][0, 0] == 0


def test_a_pull_cuts_the_center_to_its_upper_16_bits():
    # float32(1/3) is 0x3EAAAAAB: cut, 0x3EAA = 0.33203125; rounded, 0x3EAB = 0.333984375.
    pulled = codecs.truncated_bfloat16(layers([1 / 3, -1 / 3, 2.0, 0, 0, 0], [-0.0, 2.5]))
    assert pulled[0].dtype == BF16 and pulled[0].shape == (3, 2)
    assert as_lists(pulled) == [[[0.33203125, -0.33203125], [2.0, 0], [0, 0]], [-0.0, 2.5]]
    assert np.signbit(np.float32(pulled[1][0]))
    assert as_lists(codecs.to_bfloat16(layers([1 / 3] * 6, [0, 0])))[0][0][0] == 0.333984375


# Every bfloat16 bit pattern whose exponent is not all ones: the finite values, the
# negative ones, zeros of both signs and the subnormals among them.
FINITE_BITS = np.array([bits for bits in range(1 << 16) if bits & 0x7F80 != 0x7F80],
                       np.uint16)


def test_widening_a_bfloat16_gives_the_float32_of_the_same_value_for_every_pattern():
    every = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    widened = codecs.widened(every.view(BF16))
    assert widened.dtype == np.float32
    # Bit for bit, NaNs and infinities included: what ml_dtypes' cast gives.
    np.testing.assert_array_equal(widened.view(np.uint32),
                                  every.view(BF16).astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("size", [1, 7, center_writes.CHUNK, 2 * center_writes.CHUNK + 5])
def test_the_bfloat16_add_is_the_float32_add_of_the_widened_values(size):
    rng = np.random.default_rng(size)
    bits = FINITE_BITS[rng.integers(0, FINITE_BITS.size, size)]
    bits[:min(size, 4)] = [0x8000, 0x0001, 0x8001, 0xFF7F][:min(size, 4)]  # -0, subnormals
    center = (rng.standard_normal(size) * 10.0 ** rng.integers(-40, 30, size)).astype(
        np.float32)
    center[:min(size, 2)] = [-0.0, 1e-45][:min(size, 2)]
    out = np.full(size, np.nan, np.float32)
    center_writes.add_bfloat16(center, bits, out)
    want = center + bits.view(BF16).astype(np.float32)  # numpy's float32 add
    np.testing.assert_array_equal(out.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("pattern", [0x7F80, 0xFF80, 0x7FC0, 0xFFC1],
                         ids=["inf", "-inf", "nan", "-nan"])
def test_the_bfloat16_add_refuses_non_finite_values_in_any_chunk(pattern):
    size = 2 * center_writes.CHUNK + 5
    bits = np.zeros(size, np.uint16)
    bits[center_writes.CHUNK + 3] = pattern
    center = np.ones(size, np.float32)
    with pytest.raises(RefusedUpdate, match="NaN or infinite"):
        center_writes.add_bfloat16(center, bits, np.empty_like(center))
    out = np.empty_like(center)
    center_writes.add_bfloat16(center, bits, out, allow_nonfinite=True)
    assert not np.isfinite(out[center_writes.CHUNK + 3])
    assert (center == 1).all()


def test_the_bfloat16_add_refuses_a_sum_that_overflows():
    bits = np.array([0x3F80, 0x7F7F], np.uint16)  # 1.0 and bfloat16's largest, 3.39e38
    with pytest.raises(RefusedUpdate, match="non-finite"):
        center_writes.add_bfloat16(np.float32([1, 3e38]), bits, np.empty(2, np.float32))


def test_a_bfloat16_commit_is_added_without_a_float32_copy_of_it():
    """Past the first commit, which makes the spare center, an add allocates only the
    chunk's buffers: no float32 copy of the commit, no new center."""
    import tracemalloc

    import keras

    from distkeras.transport.center import CenterExchange

    model = keras.Sequential([keras.Input((500,)), keras.layers.Dense(1000)])  # 2 MB
    center = CenterExchange(model)
    writes = center_writes.CenterWrites(center)
    bits = weights_array(codecs.to_bfloat16(
        [np.full(layer.shape, 0.5, np.float32) for layer in center.center_variable]))
    before = [np.array(layer) for layer in center.center_variable]
    for _ in range(2):
        writes.add_bfloat16(bits)
    tracemalloc.start()
    try:
        writes.add_bfloat16(bits)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * center_writes.CHUNK  # the chunk's buffers; the model is 2 MB
    half = np.float32(0.5)
    for layer, start in zip(center.center_variable, before):
        np.testing.assert_array_equal(layer, start + half + half + half)


def test_topk_commit_sends_the_largest_entries_of_each_layer_and_keeps_the_rest():
    encoder = codecs.Encoder(codecs.parse("topk:0.5"), SPEC)  # 3 of 6, 1 of 2
    fields, sent = encoder.encode(layers([0.1, -0.5, 0.3, 0.05, -0.2, 0.4], [0.01, -0.02]))
    assert fields["indices"].dtype == np.uint32
    assert fields["indices"].tolist() == [1, 2, 5, 7]
    assert fields["values"].tolist() == np.float32([-0.5, 0.3, 0.4, -0.02]).tolist()
    assert as_lists(sent) == as_lists(layers([0, -0.5, 0.3, 0, 0, 0.4], [0, -0.02]))
    assert as_lists(encoder.residual) == as_lists(layers([0.1, 0, 0, 0.05, -0.2, 0],
                                                         [0.01, 0]))
    fields, _ = encoder.encode(layers([0] * 6, [0, 0]))
    assert fields["indices"].tolist() == [0, 3, 4, 6]
    assert fields["values"].tolist() == np.float32([0.1, 0.05, -0.2, 0.01]).tolist()


@pytest.mark.parametrize("kind", ["bfloat16", "topk:0.25"])
def test_error_feedback_conserves_the_sum_of_what_was_meant(kind):
    encoder = codecs.Encoder(codecs.parse(kind), SPEC)
    rng = np.random.default_rng(3)
    meant = layers([0] * 6, [0, 0])
    sent_total = layers([0] * 6, [0, 0])
    for _ in range(20):
        update = layers(rng.standard_normal(6), rng.standard_normal(2))
        meant = meant + update
        _, sent = encoder.encode(update)
        sent_total = sent_total + sent
    for have, want in zip(sent_total + encoder.residual, meant):
        np.testing.assert_allclose(have, want, rtol=0, atol=1e-5)


def test_without_error_feedback_nothing_is_kept():
    encoder = codecs.Encoder(codecs.parse("topk:0.5"), SPEC, error_feedback=False)
    encoder.encode(layers([0.1, -0.5, 0.3, 0.05, -0.2, 0.4], [0.01, -0.02]))
    assert encoder.residual is None
    _, sent = encoder.encode(layers([0] * 6, [0, 0]))
    assert all(not layer.any() for layer in sent)


def test_the_elastic_workers_keep_no_residual():
    from distkeras.executor.windowed import WindowedWorker

    def feedback(algorithm):
        worker = WindowedWorker(make_model(), algorithm=algorithm)
        return worker.error_feedback()

    assert feedback(algorithms.ADAG()) and feedback(algorithms.DiLoCo())
    assert not feedback(algorithms.AEASGD()) and not feedback(algorithms.EAMSGD())


# -- a real server: compressed commits and pulls -----------------------------------------

def test_bfloat16_commits_are_added_to_the_float32_center_and_pulls_are_bfloat16(started):
    server = started(compression="bfloat16")
    client = Client(server)
    encoder = codecs.Encoder(server.compression, SPEC)
    fields, _ = encoder.encode(layers([1 + 2**-8, 1 / 3, -2, 0, 0, 0], [0.5, 3]))
    send_commit(client, fields)
    reply = client.pull()
    kernel = KERNEL + np.float32([[1.0, 0.333984375], [-2, 0], [0, 0]])
    bias = BIAS + np.float32([0.5, 3.0])
    assert server.num_updates == 1
    assert as_lists(center_copy(server)) == [kernel.tolist(), bias.tolist()]
    assert [layer.dtype for layer in reply["center"]] == [BF16, BF16]
    # The pull cuts each value to its upper 16 bits (`truncated_bfloat16`).
    assert reply["center"][0][0, 1] == -0.6640625  # -0.666015625 cut
    cut = [(layer.view(np.uint32) & 0xFFFF0000).view(np.float32) for layer in (kernel, bias)]
    assert as_lists(reply["center"]) == as_lists(cut)
    assert server.center_variable[0].dtype == np.float32


def test_topk_commits_are_added_in_place_and_pulls_carry_only_the_others(started):
    server = started(compression="topk:0.125")  # 1 of 6, 1 of 2
    first, second = Client(server, 0), Client(server, 1)
    encoders = [codecs.Encoder(server.compression, SPEC) for _ in range(2)]
    pulled = [encoder.take_pull(client.pull(), None)
              for client, encoder in zip((first, second), encoders)]
    fields, sent = encoders[0].encode(layers([0.1, -0.5, 0.3, 0, 0, 0], [0.01, -0.02]))
    assert fields["indices"].tolist() == [1, 7]
    wait_until_unheld(server)
    center_before = weakref.ref(server.center_variable)  # held, it would be copied
    send_commit(first, fields)
    encoders[0].sent(sent)
    wait_for_updates(server, 1)
    reply = second.pull_unless_own()
    assert reply["indices"].tolist() == [1, 7] and reply["own"] == 0
    assert "center" not in reply
    want = [(KERNEL + np.float32([[0, -0.5], [0, 0], [0, 0]])).tolist(),
            (BIAS + np.float32([0, -0.02])).tolist()]
    assert as_lists(center_copy(server)) == want
    assert server.center_variable is center_before()  # in place: nothing held it
    assert as_lists(encoders[1].take_pull(reply, pulled[1])) == want
    # The first worker's own commit comes back as "own", not as entries.
    fields, sent = encoders[1].encode(layers([0, 0, 0, 0, 0, 2.0], [0.5, 0]))
    send_commit(second, fields, worker_id=1)
    wait_for_updates(server, 2)
    reply = first.pull_unless_own()
    assert reply["indices"].tolist() == [5, 6] and reply["own"] == 1
    center = encoders[0].take_pull(reply, pulled[0])
    assert as_lists(center) == as_lists(center_copy(server))


def test_a_topk_commit_copies_a_center_that_a_pull_still_holds(started):
    server = started(compression="topk:0.125")
    client = Client(server)
    held = server.center_variable  # as a pull sending it holds it
    fields, _ = codecs.Encoder(server.compression, SPEC).encode(
        layers([0, 0, 0, 0, 0, 4.0], [0, 0]))
    send_commit(client, fields)
    client.pull()
    assert server.num_updates == 1
    assert as_lists(held) == [KERNEL.tolist(), BIAS.tolist()]
    assert server.center_variable[0][2, 1] == np.float32(4.0)


def test_a_worker_far_behind_gets_a_full_float32_pull(started):
    server = started(compression="topk:0.125")
    late, busy = Client(server, 0), Client(server, 1)
    late.pull()
    busy.pull()
    encoder = codecs.Encoder(server.compression, SPEC)
    for _ in range(4):  # 4 commits of 16 bytes: more than the 32 bytes of the model
        fields, _ = encoder.encode(layers([1.0] * 6, [1, 1]))
        send_commit(busy, fields, worker_id=1)
        busy.pull_unless_own()
    wait_for_updates(server, 4)
    reply = late.pull()
    assert reply["center"][0].dtype == np.float32
    assert as_lists(reply["center"]) == as_lists(center_copy(server))


def test_dynsgd_divides_a_bfloat16_commit_by_its_staleness(started):
    server = started(DynSGDParameterServer, compression="bfloat16")
    first, second = Client(server, 0), Client(server, 1)
    encoder = codecs.Encoder(server.compression, SPEC)
    fields, _ = encoder.encode(layers([1 / 3, 0, 0, 0, 0, 0], [0, 0]))
    send_commit(first, fields, last_update=0)
    wait_for_updates(server, 1)
    fields, _ = codecs.Encoder(server.compression, SPEC).encode(
        layers([3.0, 0, 0, 0, 0, 0], [0, 1.0]))
    send_commit(second, fields, worker_id=1, last_update=0)  # one update since: / 2
    second.pull()
    kernel = KERNEL.copy()
    kernel[0, 0] += np.float32(0.333984375)
    kernel[0, 0] += np.float32(1.5)
    bias = BIAS + np.float32([0, 0.5])
    assert as_lists(center_copy(server)) == [kernel.tolist(), bias.tolist()]


def test_diloco_takes_its_outer_step_on_the_topk_commit(started):
    algorithm = algorithms.DiLoCo(outer_learning_rate=0.5, outer_momentum=0.5)
    server = started(AlgorithmServer, algorithm=algorithm, compression="topk:0.5")
    client = Client(server)
    fields, sent = codecs.Encoder(server.compression, SPEC).encode(
        layers([0.1, -0.5, 0.3, 0.05, -0.2, 0.4], [0.01, -0.02]))
    send_commit(client, fields, last_update=0)
    client.pull()
    # g = -delta (staleness 0); v = g; C - 0.5 * (0.5 * v + g) = C + 0.75 * delta.
    delta = np.float32([[0, -0.5], [0.3, 0], [0, 0.4]]), np.float32([0, -0.02])
    want = [KERNEL - np.float32(0.5) * (np.float32(0.5) * -delta[0] + -delta[0]),
            BIAS - np.float32(0.5) * (np.float32(0.5) * -delta[1] + -delta[1])]
    assert as_lists(center_copy(server)) == as_lists(want)
    assert as_lists(update_rules.nesterov_outer_step(
        weights_array([KERNEL, BIAS]), sent, None, 0.5, 0.5)[0]) == as_lists(want)


# -- lying commits ----------------------------------------------------------------------

def _topk_fields(indices, values, index_dtype=np.uint32, value_dtype=np.float32):
    return {"indices": np.array(indices, index_dtype), "values": np.array(values, value_dtype)}


@pytest.mark.parametrize("fields", [
    _topk_fields([1, 8], [1.0, 1.0]),  # past the model's 8 entries
    _topk_fields([7, 1], [1.0, 1.0]),  # not rising
    _topk_fields([1, 1], [1.0, 1.0]),  # repeated
    _topk_fields([1, 2, 7], [1.0, 1.0, 1.0]),  # 3 entries; the model's commit has 2
    _topk_fields([1], [1.0]),
    _topk_fields([1, 7], [1.0]),  # fewer values than indices
    _topk_fields([1, 7], [1.0, 1.0], index_dtype=np.int64),
    _topk_fields([1, 7], [1.0, 1.0], value_dtype=np.float64),
    {"delta": layers([1] * 6, [1, 1])},  # an uncompressed commit
], ids=["past-end", "falling", "repeated", "too-many", "too-few", "short-values",
        "int64", "float64", "float32-delta"])
def test_a_lying_topk_commit_closes_the_connection_and_changes_nothing(started, fields):
    server = started(compression="topk:0.125")
    client = Client(server)
    client.pull()
    send_commit(client, fields)
    assert closed(client)
    assert server.num_updates == 0
    assert as_lists(center_copy(server)) == [KERNEL.tolist(), BIAS.tolist()]
    assert not server.transport.errors


@pytest.mark.parametrize("fields", [
    {"bfloat16": [np.zeros((3, 2), BF16)]},  # one layer of two
    {"bfloat16": [np.zeros((2, 3), BF16), np.zeros(2, BF16)]},  # shaped wrong
    {"bfloat16": [np.zeros((3, 2), np.float32), np.zeros(2, np.float32)]},  # float32
    {"delta": layers([1] * 6, [1, 1])},
], ids=["one-layer", "shape", "float32", "float32-delta"])
def test_a_lying_bfloat16_commit_closes_the_connection_and_changes_nothing(started, fields):
    server = started(compression="bfloat16")
    client = Client(server)
    send_commit(client, fields)
    assert closed(client)
    assert server.num_updates == 0
    assert as_lists(center_copy(server)) == [KERNEL.tolist(), BIAS.tolist()]


@pytest.mark.parametrize("kind,fields", [
    ("topk:0.125", _topk_fields([1, 7], [np.nan, 1.0])),
    ("topk:0.125", _topk_fields([1, 7], [1.0, np.inf])),
    ("bfloat16", {"bfloat16": [np.full((3, 2), np.inf, BF16), np.zeros(2, BF16)]}),
    ("bfloat16", {"bfloat16": [np.zeros((3, 2), BF16), np.full(2, np.nan, BF16)]}),
])
def test_a_nonfinite_compressed_commit_is_refused_and_changes_nothing(started, kind, fields):
    server = started(compression=kind)
    client = Client(server)
    send_commit(client, fields)
    reply = client.pull()  # the connection stays open, as for a float32 commit
    assert server.num_updates == 0 and server.center.refused == 1
    assert as_lists(center_copy(server)) == [KERNEL.tolist(), BIAS.tolist()]
    assert np.isfinite(np.asarray(reply["center"][0], np.float32)).all()


def test_a_topk_commit_that_would_overflow_is_refused_and_changes_nothing(started):
    big = KERNEL.copy()
    big[0, 1] = 3e38
    server = started(model=make_model(kernel=big), compression="topk:0.125")
    client = Client(server)
    send_commit(client, _topk_fields([1, 7], [3e38, 1.0]))
    client.pull()
    assert server.num_updates == 0 and server.center.refused == 1
    assert as_lists(center_copy(server)) == [big.tolist(), BIAS.tolist()]


# -- what cannot be compressed -----------------------------------------------------------

def test_an_own_handle_commit_refuses_compression_saying_so():
    class Mine(DeltaParameterServer):
        def handle_commit(self, conn, addr):
            networking.recv_data(conn)

    with pytest.raises(ValueError, match="own handle_commit.*compression=None"):
        Mine(make_model(), 0, compression="bfloat16")
    with pytest.raises(ValueError, match="carry the center the worker pulled"):
        AlgorithmServer(make_model(), 0, algorithm=algorithms.Experimental(),
                        compression="topk")
    with pytest.raises(ValueError, match="topk:F"):
        DeltaParameterServer(make_model(), 0, compression="int8")


def test_compression_needs_float32_weights():
    with pytest.raises(ValueError, match="float32 weights.*float16"):
        codecs.check_weights(codecs.parse("bfloat16"), [((2,), np.float16)])


# -- a real worker ------------------------------------------------------------------------

def test_an_elastic_worker_and_the_center_move_by_the_same_topk_commit(started):
    """AEASGD, rho * lr = 0.5, top-k 1 of 6 and 1 of 2: the worker loses what the center
    gains, so their sum stays as it was, and it keeps no residual."""
    from distkeras.executor.replica import ModelReplica
    from distkeras.workers import AEASGDWorker

    server = started(AlgorithmServer, algorithm=algorithms.AEASGD(),
                     compression="topk:0.125")
    model = make_model()
    model.compile(optimizer="sgd", loss="mse")
    worker = AEASGDWorker(model, rho=5.0, learning_rate=0.1)
    worker.model = ModelReplica(model, worker._record_step)
    worker.master_host, worker.master_port, worker.token = "127.0.0.1", server.port, \
        server.token
    worker.worker_id, worker.connect_timeout = 0, 5.0
    worker.compression = str(server.compression)
    worker.weight_spec = SPEC  # as `Worker.prepare_model` sets it
    worker.setup()
    try:
        # W - C: the kernel's largest gap is 4 at [2, 0], the bias's -2 at [1].
        gap = [np.float32([[1, 2], [0.5, -1], [4, 0]]), np.float32([0.5, -2])]
        weights = [KERNEL + gap[0], BIAS + gap[1]]
        worker.model.set_weights(weights)
        worker.communicate()
        wait_for_updates(server, 1)
        sent = [np.float32([[0, 0], [0, 0], [2, 0]]), np.float32([0, -1])]  # 0.5 * gap
        assert as_lists(server.center_variable) == as_lists(
            [KERNEL + sent[0], BIAS + sent[1]])
        assert as_lists(worker.model.get_weights()) == as_lists(
            [weights[0] - sent[0], weights[1] - sent[1]])
        assert worker.encoder.residual is None
    finally:
        worker.teardown()
    assert server.transport.errors == []
