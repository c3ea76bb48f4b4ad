"""Wire format and transport (distkeras.networking); no Spark, no Keras model needed."""

import json
import math
import socket
import struct
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from distkeras.transport import networking
from distkeras.networking import recv_data, send_data
from distkeras.transport.networking import (Connection, PeerClosedError, ProtocolError,
                                            decode_message, encode_message, weights_array)

PREFIX = struct.Struct("<2sBBIQ")
WEIGHT_SPEC = [((2, 3), np.float32), ((3,), np.float32)]
FUZZ = settings(max_examples=250, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])


# -- helpers ------------------------------------------------------------------------------


@pytest.fixture
def pair():
    """A connected socketpair (sender, receiver) with a receive timeout, closed afterwards."""
    left, right = socket.socketpair()
    left.settimeout(5)
    right.settimeout(5)
    yield left, right
    left.close()
    right.close()


def roundtrip(pair, message, receiver=None):
    sender, sock = pair
    send_data(sender, message)
    return recv_data(receiver if receiver is not None else sock)


def raw_frame(header, body=b"", header_len=None, body_len=None, magic=b"DK", version=1):
    """A frame built by hand, so its prefix and header can lie."""
    raw_header = header if isinstance(header, bytes) else json.dumps(header).encode("utf-8")
    prefix = PREFIX.pack(magic, version, 0,
                         len(raw_header) if header_len is None else header_len,
                         len(body) if body_len is None else body_len)
    return prefix + raw_header + body


def assert_same_array(got, want):
    """Same values, shape and (little-endian) dtype, compared bit for bit."""
    want = np.asarray(want)
    want_le = want.astype(want.dtype.newbyteorder("<"))
    assert isinstance(got, np.ndarray)
    assert got.dtype == want_le.dtype
    assert got.shape == want.shape
    assert got.tobytes() == np.ascontiguousarray(want_le).tobytes()


def weights_frame(arrays, key="w"):
    """A valid frame carrying a list of arrays under ``key``."""
    return encode_message({key: weights_array(arrays)})


# -- scalar and JSON values ---------------------------------------------------------------


@pytest.mark.parametrize("value", [
    "", "hello", "ünïcødé ✓ \u0000 \n", 0, 1, -7, 2**70, 0.0, -0.0, 1.5, 1e-300, True,
    False, None,
])
def test_json_scalars_roundtrip(pair, value):
    got = roundtrip(pair, {"x": value})
    assert got == {"x": value}
    assert type(got["x"]) is type(value)


@pytest.mark.parametrize("value", [float("inf"), float("-inf")])
def test_infinities_roundtrip(pair, value):
    assert roundtrip(pair, {"x": value}) == {"x": value}


def test_nan_roundtrips(pair):
    got = roundtrip(pair, {"x": float("nan")})
    assert isinstance(got["x"], float) and math.isnan(got["x"])


def test_nested_lists_and_dicts_roundtrip(pair):
    message = {
        "nested": [1, [2.5, [None, True, "s"]], []],
        "tuple": (1, 2),
        "dict": {"a": 1, "b": [0.25, None], "c": {"d": "e"}},
        "empty": [],
    }
    got = roundtrip(pair, message)
    assert got == {
        "nested": [1, [2.5, [None, True, "s"]], []],
        "tuple": [1, 2],
        "dict": {"a": 1, "b": [0.25, None], "c": {"d": "e"}},
        "empty": [],
    }


def test_numpy_scalars_travel_as_json(pair):
    got = roundtrip(pair, {"f": np.float32(2.5), "i": np.int64(-3), "b": np.bool_(True)})
    assert got == {"f": 2.5, "i": -3, "b": True}
    assert type(got["f"]) is float and type(got["i"]) is int and type(got["b"]) is bool


def test_zero_dim_array_travels_as_json_scalar(pair):
    got = roundtrip(pair, {"x": np.array(1.5), "n": np.array(7, dtype=np.int8)})
    assert got == {"x": 1.5, "n": 7}
    assert type(got["x"]) is float and type(got["n"]) is int


def test_unsendable_values_raise_type_error():
    with pytest.raises(TypeError):
        encode_message({"x": b"bytes"})
    with pytest.raises(TypeError):
        encode_message({"x": object()})
    with pytest.raises(TypeError):
        encode_message({1: "non-string key"})
    with pytest.raises(TypeError):
        encode_message(["not", "a", "dict"])
    with pytest.raises(TypeError):
        encode_message({"x": np.array(["a", "b"])})


# -- arrays -------------------------------------------------------------------------------

DTYPES = [np.float16, np.float32, np.float64, np.int8, np.int16, np.int32, np.int64,
          np.uint8, np.bool_]
SHAPES = [(5,), (2, 3), (0, 3)]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_single_array_roundtrip(pair, dtype, shape):
    rng = np.random.default_rng(0)
    array = (rng.standard_normal(shape) * 50).astype(dtype)
    got = roundtrip(pair, {"a": array, "tag": "x"})
    assert set(got) == {"a", "tag"} and got["tag"] == "x"
    assert_same_array(got["a"], array)
    np.testing.assert_array_equal(got["a"], array)


def test_bfloat16_weights_roundtrip(pair):
    """A model built with dtype="bfloat16" holds ml_dtypes' bfloat16, whose type code is
    a raw "<V2": it travels by name, and arrives as bfloat16 (it was refused on the wire)."""
    import ml_dtypes

    array = np.array([[1.5, -2.0, 3.0e38], [np.inf, np.nan, 1e-3]], ml_dtypes.bfloat16)
    got = roundtrip(pair, {"a": array, "w": [array, np.ones(2, np.float32)]})
    assert got["a"].dtype == array.dtype and got["w"][0].dtype == array.dtype
    for received in (got["a"], got["w"][0]):
        np.testing.assert_array_equal(received.view(np.uint16), array.view(np.uint16))
    spec = [((2, 3), np.dtype(ml_dtypes.bfloat16)), ((2,), np.dtype(np.float32))]
    decode_message(encode_message({"w": [array, np.ones(2, np.float32)]}), weight_spec=spec)


def test_float_specials_in_arrays_roundtrip(pair):
    array = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45], dtype=np.float32)
    assert_same_array(roundtrip(pair, {"a": array})["a"], array)


def test_received_arrays_are_writable(pair):
    got = roundtrip(pair, {"a": np.arange(4, dtype=np.float32), "w": weights_array([np.ones(2)])})
    got["a"][0] = 9
    got["w"][0][0] = 9
    assert got["a"][0] == 9 and got["w"][0][0] == 9


def test_list_of_arrays_comes_back_as_object_array(pair):
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([1, 2, 3], np.int64),
              np.zeros((0, 3), np.float64), np.array([[True], [False]])]
    got = roundtrip(pair, {"w": arrays})["w"]
    assert isinstance(got, np.ndarray) and got.dtype == object and got.shape == (4,)
    for got_array, want in zip(got, arrays):
        assert_same_array(got_array, want)


def test_scalar_weights_keep_their_shape_in_a_list_of_arrays(pair):
    # A model's scalar variable (an optimizer's step count, a learned temperature) is 0-d.
    arrays = [np.array(7, np.int64), np.array(0.5, np.float32), np.ones((2,), np.float32)]
    got = roundtrip(pair, {"w": arrays})["w"]
    assert [array.shape for array in got] == [(), (), (2,)]
    for got_array, want in zip(got, arrays):
        assert_same_array(got_array, want)


def test_weights_array_object_array_roundtrip(pair):
    arrays = [np.ones((2, 3), np.float32), np.full(3, 0.5, np.float32)]
    got = roundtrip(pair, {"w": weights_array(arrays)})["w"]
    assert got.dtype == object and len(got) == 2
    for got_array, want in zip(got, arrays):
        assert_same_array(got_array, want)


@pytest.mark.parametrize("dtype", [">f2", ">f4", ">f8", ">i2", ">i4", ">i8", ">u4"])
def test_big_endian_arrays_arrive_correct(pair, dtype):
    array = np.arange(-3, 9).reshape(3, 4).astype(dtype)
    got = roundtrip(pair, {"a": array, "w": [array, array[:1]]})
    assert got["a"].dtype == np.dtype(dtype).newbyteorder("<")
    np.testing.assert_array_equal(got["a"], array)
    np.testing.assert_array_equal(got["a"], array.astype(np.dtype(dtype).newbyteorder("=")))
    np.testing.assert_array_equal(got["w"][0], array)
    np.testing.assert_array_equal(got["w"][1], array[:1])


def test_non_contiguous_arrays_arrive_correct(pair):
    base = np.arange(24, dtype=np.float64).reshape(4, 6)
    strided = base[:, ::2]
    transposed = base.T
    reversed_ = base[::-1, ::-3]
    assert not strided.flags.c_contiguous and not transposed.flags.c_contiguous
    got = roundtrip(pair, {"s": strided, "t": transposed, "w": [reversed_, strided.T]})
    np.testing.assert_array_equal(got["s"], strided)
    np.testing.assert_array_equal(got["t"], transposed)
    np.testing.assert_array_equal(got["w"][0], reversed_)
    np.testing.assert_array_equal(got["w"][1], strided.T)


def test_several_messages_in_a_row(pair):
    sender, receiver = pair
    for index in range(5):
        send_data(sender, {"i": index, "a": np.full(3, index, np.int32)})
    for index in range(5):
        got = recv_data(receiver)
        assert got["i"] == index
        np.testing.assert_array_equal(got["a"], [index] * 3)


def test_actions_and_clean_close(pair):
    sender, receiver = pair
    for action in (networking.ACTION_PULL, networking.ACTION_COMMIT,
                   networking.ACTION_HISTORY, networking.ACTION_QUIT):
        networking.send_action(sender, action)
        assert networking.recv_action(receiver) == action
    sender.shutdown(socket.SHUT_WR)
    assert networking.recv_action(receiver) == b""


def test_encode_decode_message_roundtrip():
    message = {"s": "x", "n": 3, "f": 0.5, "none": None, "l": [1, [2]],
               "a": np.arange(6, dtype=np.int16).reshape(2, 3),
               "w": weights_array([np.ones((2, 3), np.float32), np.zeros(3, np.float32)])}
    data = encode_message(message)
    assert isinstance(data, bytes) and data[:2] == b"DK"
    got = decode_message(data)
    assert set(got) == set(message)
    for key in ("s", "n", "f", "none", "l"):
        assert got[key] == message[key]
    assert_same_array(got["a"], message["a"])
    for got_array, want in zip(got["w"], message["w"]):
        assert_same_array(got_array, want)
    # the same bytes over a socket decode to the same thing
    left, right = socket.socketpair()
    try:
        left.sendall(data)
        again = recv_data(right)
        assert_same_array(again["a"], message["a"])
    finally:
        left.close()
        right.close()


def test_decode_message_respects_weight_spec():
    good = weights_frame([np.ones((2, 3), np.float32), np.ones(3, np.float32)])
    assert len(decode_message(good, weight_spec=WEIGHT_SPEC)["w"]) == 2
    bad = weights_frame([np.ones((3, 2), np.float32), np.ones(3, np.float32)])
    with pytest.raises(ProtocolError):
        decode_message(bad, weight_spec=WEIGHT_SPEC)


# -- rejection ------------------------------------------------------------------------------


def test_truncated_frame_raises_peer_closed():
    data = encode_message({"a": np.arange(100, dtype=np.float64)})
    for cut in (3, PREFIX.size + 5, len(data) - 1):
        left, right = socket.socketpair()
        right.settimeout(5)
        try:
            left.sendall(data[:cut])
            left.close()
            with pytest.raises(PeerClosedError):
                recv_data(right)
        finally:
            right.close()
    assert issubclass(PeerClosedError, ConnectionError)


def test_peer_closed_before_anything(pair):
    sender, receiver = pair
    sender.close()
    with pytest.raises(PeerClosedError):
        recv_data(receiver)


@pytest.mark.parametrize("magic,version", [(b"XX", 1), (b"dk", 1), (b"DK", 2), (b"DK", 0)])
def test_bad_magic_or_version(pair, magic, version):
    sender, receiver = pair
    frame = raw_frame({"f": {}, "a": []}, magic=magic, version=version)
    sender.sendall(frame)
    with pytest.raises(ProtocolError):
        recv_data(receiver)
    with pytest.raises(ProtocolError):
        decode_message(frame)


def test_lying_body_length_is_refused_before_the_body_is_read(pair):
    sender, receiver = pair
    header = {"f": {"a": {"t": "array", "i": 0}}, "a": [["<f4", [3]]]}  # 12 bytes of body
    # only the prefix and header travel; a receiver that waited for the body would time out
    sender.sendall(raw_frame(header, body_len=1000))
    receiver.settimeout(2)
    with pytest.raises(ProtocolError):
        recv_data(receiver)
    with pytest.raises(ProtocolError):
        decode_message(raw_frame(header, body=b"\0" * 1000))
    with pytest.raises(ProtocolError):
        decode_message(raw_frame(header, body=b"\0" * 8))


def test_frame_length_must_match_prefix():
    data = encode_message({"a": np.arange(3, dtype=np.float32)})
    with pytest.raises(ProtocolError):
        decode_message(data + b"\0")
    with pytest.raises(ProtocolError):
        decode_message(data[:-1])
    with pytest.raises(ProtocolError):
        decode_message(data[:PREFIX.size - 1])


def test_ten_gigabyte_claim_is_refused_from_the_prefix(pair):
    sender, receiver = pair
    header = {"f": {"a": {"t": "array", "i": 0}}, "a": [["|u1", [10 * 2**30]]]}
    sender.sendall(raw_frame(header, body_len=10 * 2**30))
    receiver.settimeout(2)
    conn = Connection(receiver)
    assert conn.max_frame_bytes == networking.DEFAULT_MAX_FRAME_BYTES
    start = time.monotonic()
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        recv_data(conn)
    assert time.monotonic() - start < 1.0


def test_smaller_frame_limit_of_a_connection(pair):
    sender, receiver = pair
    send_data(sender, {"a": np.zeros(1000, np.float64)})
    with pytest.raises(ProtocolError):
        recv_data(Connection(receiver, max_frame_bytes=4000))


def test_the_frame_limit_counts_the_header_with_the_body(pair):
    """A frame whose body fits ``max_frame_bytes`` but whose header plus body does not
    is refused; one of exactly the limit is read."""
    sender, receiver = pair
    frame = networking.encode_message({"a": np.zeros(1000, np.float64)})
    header_len, body_len = PREFIX.unpack(frame[:PREFIX.size])[3:]
    assert header_len > 0 and body_len == 8000
    sender.sendall(frame)
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        recv_data(Connection(receiver, max_frame_bytes=header_len + body_len - 1))
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode_message(frame, max_frame_bytes=body_len + 1)
    decoded = decode_message(frame, max_frame_bytes=header_len + body_len)
    assert np.array_equal(decoded["a"], np.zeros(1000))


def test_header_larger_than_limit(pair):
    sender, receiver = pair
    sender.sendall(PREFIX.pack(b"DK", 1, 0, networking.MAX_HEADER_BYTES + 1, 0))
    receiver.settimeout(2)
    with pytest.raises(ProtocolError):
        recv_data(receiver)
    with pytest.raises(ProtocolError):
        decode_message(raw_frame(b" " * (networking.MAX_HEADER_BYTES + 1)))


def test_empty_header_is_refused():
    with pytest.raises(ProtocolError):
        decode_message(raw_frame(b""))


@pytest.mark.parametrize("raw_header", [
    b"not json", b"\xff\xfe\x00", b"[1, 2]", b'"string"', b"{}", b'{"f": {}}',
    b'{"f": [], "a": []}', b'{"f": {}, "a": {}}', b"[" * 100000,
])
def test_non_json_or_malformed_header(pair, raw_header):
    sender, receiver = pair
    sender.sendall(raw_frame(raw_header))
    with pytest.raises(ProtocolError):
        recv_data(receiver)
    with pytest.raises(ProtocolError):
        decode_message(raw_frame(raw_header))


@pytest.mark.parametrize("dtype", ["|O", "<U4", "|S4", "<c8", "<M8[s]", "|V4", "f4", ">f4",
                                   "float32", "", 4, None, ["<f4"], {"d": "<f4"}])
def test_disallowed_dtype(pair, dtype):
    header = {"f": {"a": {"t": "array", "i": 0}}, "a": [[dtype, [1]]]}
    frame = raw_frame(header, body=b"\0" * 16)
    with pytest.raises(ProtocolError):
        decode_message(frame)
    sender, receiver = pair
    sender.sendall(frame)
    with pytest.raises(ProtocolError):
        recv_data(receiver)


@pytest.mark.parametrize("shape", [
    [-1], [2, -3], [1.5], ["2"], [True], [None], 3, "3", None, {"0": 1}, [[2]], [2**40],
    [1] * 33,
    [2**39, 2**39, 0],  # no data, yet no array can have that shape
    [2**31, 2**31, 0],
])
def test_bad_shape(shape):
    header = {"f": {"a": {"t": "array", "i": 0}}, "a": [["<f4", shape]]}
    with pytest.raises(ProtocolError):
        decode_message(raw_frame(header, body=b"\0" * 8))
    with pytest.raises(ProtocolError):
        decode_message(raw_frame(header, body=b""))


@pytest.mark.parametrize("spec", [["<f4"], ["<f4", [1], 0], "x", None, {}])
def test_bad_array_description(spec):
    with pytest.raises(ProtocolError):
        decode_message(raw_frame({"f": {}, "a": [spec]}, body=b"\0" * 4))


def test_arrays_not_referenced():
    header = {"f": {"a": {"t": "array", "i": 0}}, "a": [["<f4", [1]], ["<f4", [1]]]}
    with pytest.raises(ProtocolError, match="no field refers"):
        decode_message(raw_frame(header, body=b"\0" * 8))
    header = {"f": {}, "a": [["|u1", [2]]]}
    with pytest.raises(ProtocolError):
        decode_message(raw_frame(header, body=b"\0" * 2))


@pytest.mark.parametrize("fields", [
    {"a": {"t": "array", "i": 0}, "b": {"t": "array", "i": 0}},
    {"a": {"t": "arrays", "i": [0, 1]}, "b": {"t": "array", "i": 1}},
    {"a": {"t": "arrays", "i": [0, 0]}, "b": {"t": "array", "i": 1}},
    {"a": {"t": "arrays", "i": [0, 1, 0]}},
    {"a": {"t": "arrays", "i": [1, 0, 1]}},
])
def test_reused_array_indices(fields):
    header = {"f": fields, "a": [["<f4", [1]], ["<f4", [1]]]}
    with pytest.raises(ProtocolError, match="reused"):
        decode_message(raw_frame(header, body=b"\0" * 8))


@pytest.mark.parametrize("field", [
    {"t": "array", "i": 5}, {"t": "array", "i": -1}, {"t": "array", "i": "0"},
    {"t": "array", "i": 0.0}, {"t": "array", "i": True}, {"t": "array"},
    {"t": "arrays", "i": 0}, {"t": "arrays", "i": [0, 7]}, {"t": "arrays", "i": [True]},
    {"t": "pickle", "i": 0}, {"i": 0}, "json", None, [0],
])
def test_bad_field_descriptions(field):
    header = {"f": {"a": field}, "a": [["<f4", [1]]]}
    with pytest.raises(ProtocolError):
        decode_message(raw_frame(header, body=b"\0" * 4))


@pytest.mark.parametrize("arrays", [
    [np.ones((2, 3), np.float32)],                                          # too few
    [np.ones((2, 3), np.float32), np.ones(3, np.float32), np.ones(1, np.float32)],  # too many
    [np.ones((3, 2), np.float32), np.ones(3, np.float32)],                  # wrong shape
    [np.ones((2, 3), np.float32), np.ones((3, 1), np.float32)],             # wrong rank
    [np.ones((2, 3), np.float64), np.ones(3, np.float32)],                  # wrong dtype
    [np.ones((2, 3), np.float32), np.ones(3, np.int32)],                    # wrong dtype
], ids=["too-few", "too-many", "wrong-shape", "wrong-rank", "float64", "int32"])
def test_weight_spec_mismatch(pair, arrays):
    sender, receiver = pair
    conn = Connection(receiver, weight_spec=WEIGHT_SPEC)
    send_data(sender, {"delta": weights_array(arrays)})
    with pytest.raises(ProtocolError):
        recv_data(conn)


def test_weight_spec_match_is_accepted(pair):
    sender, receiver = pair
    conn = Connection(receiver, weight_spec=WEIGHT_SPEC)
    arrays = [np.full((2, 3), 0.5, np.float32), np.arange(3, dtype=np.float32)]
    send_data(sender, {"delta": weights_array(arrays), "worker_id": 3})
    got = recv_data(conn)
    assert got["worker_id"] == 3
    for got_array, want in zip(got["delta"], arrays):
        assert_same_array(got_array, want)


# -- handshake -----------------------------------------------------------------------------


def test_check_token_accepts_right_token():
    assert networking.check_token({"token": "secret", "worker_id": 7}, "secret") == 7
    assert networking.check_token({"token": "secret"}, "secret") == -1


def test_authenticate_then_check_token(pair):
    sender, receiver = pair
    networking.authenticate(sender, "tok" * 10, 4)
    assert networking.check_token(recv_data(receiver), "tok" * 10) == 4


@pytest.mark.parametrize("message", [
    {"token": "wrong", "worker_id": 1}, {"token": "secre", "worker_id": 1},
    {"token": "secret ", "worker_id": 1}, {"token": "", "worker_id": 1},
    {"worker_id": 1}, {}, {"token": None}, {"token": 123}, {"token": ["secret"]},
    {"token": b"secret"}, {"token": {"secret": 1}}, {"token": "\ud800"},
])
def test_check_token_rejects(message):
    with pytest.raises(ProtocolError):
        networking.check_token(message, "secret")


# -- connect ---------------------------------------------------------------------------------


def test_connect_to_closed_port_fails_with_address():
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()  # nothing listens on that port any more
    start = time.monotonic()
    with pytest.raises(ConnectionError) as info:
        networking.connect("127.0.0.1", port, timeout=0.5, retry_interval=0.1)
    assert time.monotonic() - start < 5.0
    assert f"127.0.0.1:{port}" in str(info.value)


def test_connect_to_listening_port():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        sock = networking.connect("127.0.0.1", server.getsockname()[1], timeout=2)
        peer, _ = server.accept()
        try:
            assert sock.gettimeout() is None
            assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
            send_data(sock, {"x": 1})
            assert recv_data(peer) == {"x": 1}
        finally:
            sock.close()
            peer.close()
    finally:
        server.close()


# -- weights_array ---------------------------------------------------------------------------


def test_weights_array_arithmetic():
    w1 = weights_array([np.ones((2, 3)), np.ones(3)])
    w2 = weights_array([np.full((2, 3), 0.25), np.arange(3.0)])
    assert w1.dtype == object and w1.shape == (2,)
    assert np.asarray(w1).shape == (2,)
    assert list(map(np.shape, np.asarray(w1))) == [(2, 3), (3,)]

    diff = w1 - w2
    np.testing.assert_array_equal(diff[0], np.full((2, 3), 0.75))
    np.testing.assert_array_equal(diff[1], [1.0, 0.0, -1.0])

    half = 0.5 * w2
    np.testing.assert_array_equal(half[0], np.full((2, 3), 0.125))
    np.testing.assert_array_equal(half[1], [0.0, 0.5, 1.0])

    center = w1 + 0.5 * diff
    np.testing.assert_array_equal(center[0], np.full((2, 3), 1.375))
    np.testing.assert_array_equal(center[1], [1.5, 1.0, 0.5])
    np.testing.assert_array_equal((w2 / 2)[1], [0.0, 0.5, 1.0])
    # inputs untouched
    np.testing.assert_array_equal(w1[0], np.ones((2, 3)))
    np.testing.assert_array_equal(w2[1], np.arange(3.0))


def test_weights_array_of_equal_shapes_stays_per_layer():
    packed = weights_array([np.zeros(2), np.ones(2)])
    assert packed.shape == (2,) and packed.dtype == object
    assert packed[1].shape == (2,)
    assert len(weights_array([])) == 0


# -- properties ------------------------------------------------------------------------------


def check_only_protocol_errors(data, **kwargs):
    try:
        result = decode_message(data, **kwargs)
    except ProtocolError:
        return None
    assert isinstance(result, dict)
    return result


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_arbitrary_bytes(data):
    check_only_protocol_errors(data)


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_bytes_behind_a_valid_prefix(data):
    # a prefix that matches the data, so the header parser gets the bytes
    header_len = len(data)
    check_only_protocol_errors(PREFIX.pack(b"DK", 1, 0, header_len, 0) + data)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 2**41) | st.floats(allow_nan=True)
    | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=3), children, max_size=4),
    max_leaves=12,
)
SPEC = st.tuples(
    st.sampled_from(["<f4", "<f8", "|u1", "|b1", "<i8", "|O", "<U1", "f4"]) | JSON,
    st.lists(st.integers(-2, 4) | st.sampled_from([0, 2**31, 2**39]) | JSON, max_size=4)
    | JSON,
).map(list) | JSON
FIELD = st.fixed_dictionaries({
    "t": st.sampled_from(["json", "array", "arrays", "x"]) | JSON,
    "i": st.integers(-1, 4) | st.lists(st.integers(-1, 4) | JSON, max_size=5) | JSON,
    "v": JSON,
}) | JSON
HEADER = st.fixed_dictionaries({
    "f": st.dictionaries(st.text(max_size=3), FIELD, max_size=4) | JSON,
    "a": st.lists(SPEC, max_size=4) | JSON,
}) | JSON


@FUZZ
@given(HEADER, st.integers(0, 64))
def test_fuzz_structured_headers(header, body_len):
    weight_spec = [((1,), np.float32), ((2,), np.float32)]
    for body in (b"\0" * body_len, b"\x01" * 8):
        frame = raw_frame(json.dumps(header).encode("utf-8"), body=body)
        check_only_protocol_errors(frame)
        check_only_protocol_errors(frame, weight_spec=weight_spec)


VALID_FRAME = encode_message({
    "s": "text", "n": 3, "l": [1.5, None],
    "a": np.arange(6, dtype=np.int16).reshape(2, 3),
    "w": weights_array([np.ones((2, 3), np.float32), np.zeros(3, np.float32)]),
})


@FUZZ
@given(st.lists(st.tuples(st.integers(0, len(VALID_FRAME) - 1), st.integers(0, 255)),
                min_size=1, max_size=6),
       st.integers(0, len(VALID_FRAME)), st.binary(max_size=8))
def test_fuzz_mutated_valid_frame(mutations, cut, tail):
    data = bytearray(VALID_FRAME)
    for position, byte in mutations:
        data[position] = byte
    for candidate in (bytes(data), bytes(data[:cut]), bytes(data) + tail,
                      VALID_FRAME[:cut], VALID_FRAME[:cut] + tail):
        check_only_protocol_errors(candidate)
        check_only_protocol_errors(candidate, max_frame_bytes=100, weight_spec=WEIGHT_SPEC)


def test_valid_frame_still_decodes():
    # the fuzz base frame itself is valid, so mutations start from something real
    got = decode_message(VALID_FRAME, weight_spec=WEIGHT_SPEC)
    assert got["s"] == "text" and got["n"] == 3 and got["l"] == [1.5, None]


ARRAY_DTYPES = st.sampled_from(
    ["<f2", "<f4", "<f8", ">f4", ">f8", "|i1", "<i2", ">i4", "<i8", "|u1", "<u2", "<u8", "|b1"]
)
ARRAYS = ARRAY_DTYPES.flatmap(lambda dtype: hnp.arrays(
    np.dtype(dtype), hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4)))
VALUES = (
    st.integers(-2**63, 2**63) | st.floats(allow_nan=False) | st.text(max_size=10)
    | st.booleans() | st.none() | st.lists(st.floats(allow_nan=False), max_size=5)
    | ARRAYS | st.lists(ARRAYS, min_size=1, max_size=4)
)


@FUZZ
@given(st.dictionaries(st.text(max_size=10), VALUES, max_size=6))
def test_property_roundtrip(message):
    got = decode_message(encode_message(message))
    assert set(got) == set(message)
    for key, want in message.items():
        value = got[key]
        if isinstance(want, np.ndarray):
            assert_same_array(value, want)
        elif isinstance(want, list) and want and isinstance(want[0], np.ndarray):
            assert value.dtype == object and len(value) == len(want)
            for got_array, want_array in zip(value, want):
                assert_same_array(got_array, want_array)
        else:
            assert value == want
            assert type(value) is type(want)
