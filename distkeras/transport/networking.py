"""Wire format and transport between workers and the parameter server.

A message is a dict whose values are strings, numbers, booleans, None, lists of those, numpy
arrays, or lists of numpy arrays (the per-layer weights). It travels as one frame::

    b"DK" | version (1 byte) | flags (1 byte) | header length (uint32 LE) | body length (uint64 LE)
    header: UTF-8 JSON describing the fields and, for each array, its dtype and shape
    body:   the arrays' raw little-endian bytes, back to back

Nothing is ever unpickled: the header is JSON and the body is read into typed numpy buffers
after the header has been checked against the limits and (on the server) the model's shapes.
"""

import hmac
import json
import logging
import socket
import struct
import time

import numpy as np

from distkeras.errors import DistkerasError

logger = logging.getLogger(__name__)

MAGIC = b"DK"
VERSION = 1
_PREFIX = struct.Struct("<2sBBIQ")
MAX_HEADER_BYTES = 1 << 20
DEFAULT_MAX_FRAME_BYTES = 1 << 31
# The first frame of a connection, before its token is checked: a token and two numbers.
HANDSHAKE_MAX_FRAME_BYTES = 1 << 16
_ALLOWED_DTYPES = {
    "<f2", "<f4", "<f8", "|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "|b1",
    "bfloat16",
}
# Dtypes that travel by name: bfloat16 (ml_dtypes', the numpy type of Keras's bfloat16
# weights) has no type code of its own, its `dtype.str` is "<V2", raw bytes of any kind.
_NAMED_DTYPES = ("bfloat16",)

ACTION_PULL = b"p"
ACTION_COMMIT = b"c"
ACTION_HISTORY = b"h"
ACTION_QUIT = b"q"
# Pull, but answer {"unchanged": True} when every update since this connection's last pull
# was its own commit applied as sent: the worker then knows the center already.
ACTION_PULL_UNLESS_OWN = b"u"
# Pull the center itself, never a top-k run's sparse reply (a sharded center's worker asks
# so when its shards' sparse replies do not join).
ACTION_PULL_CENTER = b"z"
# A worker reports the error that stops it (one a restart would repeat), then closes.
ACTION_FAILURE = b"f"
# A worker is about to compile a training step (its first, or one for a new batch size or
# window length: a short last batch), silent for seconds: no reply, no payload.
ACTION_COMPILING = b"k"


class ProtocolError(DistkerasError):
    """A frame broke the wire format, a limit, or the expected shapes."""


class PeerClosedError(DistkerasError, ConnectionError):
    """The peer closed the connection, possibly in the middle of a frame."""


def weights_array(arrays):
    """Packs per-layer arrays into a 1-D numpy object array.

    numpy 2 refuses ``np.asarray`` on a list of arrays of different shapes; an object array
    of those arrays supports ``+``, ``-``, ``*`` and ``/`` layer by layer, which is what
    update rules written as ``W1 - W2`` or ``C + 0.5 * delta`` need.

    Args:
        arrays: An iterable of numpy arrays (one per layer).

    Returns:
        A numpy array with ``dtype=object`` holding the given arrays.
    """
    arrays = list(arrays)
    packed = np.empty(len(arrays), dtype=object)
    for index, array in enumerate(arrays):
        packed[index] = np.asarray(array)
    return packed


class Connection:
    """A socket with the limits that apply to frames read from it.

    Args:
        sock: A connected socket.
        max_frame_bytes: Frames announcing a larger header plus body are refused.
        weight_spec: Optional list of ``(shape, dtype)``; every list of arrays received on
            this connection must match it exactly.
        field_specs: Optional ``{field: list of (shape, dtype)}``: the lists of arrays of
            these fields must match their own spec instead (an optimizer's state).
    """

    def __init__(self, sock, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES, weight_spec=None,
                 field_specs=None):
        self.sock = sock
        self.max_frame_bytes = max_frame_bytes
        self.weight_spec = weight_spec
        self.field_specs = field_specs
        self.deadline = None  # time.monotonic() by which every read must be done
        self._body_buffer = None  # see `reusable_buffer`

    def reusable_buffer(self, nbytes):
        """A buffer of ``nbytes`` that this connection keeps for its next frames.

        Notes:
            A fresh buffer for every frame of a large model costs its pages again each time
            (the kernel maps and zeroes them), more CPU than the copy itself; see
            docs/scaling.md. What is read into this buffer is overwritten by the next frame
            read into it (see `recv_data`'s ``reuse_body``).
        """
        if self._body_buffer is None or self._body_buffer.nbytes < nbytes:
            self._body_buffer = np.empty(nbytes, dtype=np.uint8)
        return self._body_buffer[:nbytes]

    def sendall(self, data):
        self.sock.sendall(data)

    def recv_into(self, buffer, nbytes):
        if self.deadline is not None:
            # A socket timeout bounds each read alone: a peer sending a byte now and then
            # would never meet it. What is left of the deadline bounds them all.
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("timed out")
            self.sock.settimeout(remaining)
        return self.sock.recv_into(buffer, nbytes)

    def settimeout(self, seconds):
        self.sock.settimeout(seconds)

    def set_deadline(self, seconds):
        """Bounds the time all reads from now on may take together (None: no bound)."""
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.sock.settimeout(seconds)

    def shutdown(self, how=socket.SHUT_RDWR):
        """Ends the connection (both ways unless ``how`` says otherwise), waking a thread
        blocked reading it; a peer already gone is no error."""
        try:
            self.sock.shutdown(how)
        except OSError:
            pass

    def close(self):
        close_socket(self.sock)


def shutdown_socket(sock):
    """Shuts a socket down both ways, ignoring a peer that is already gone."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass


def close_socket(sock):
    """Shuts down and closes a socket, ignoring a peer that is already gone."""
    shutdown_socket(sock)
    sock.close()


def _as_wire_array(array):
    array = np.asarray(array)
    if array.dtype == object:
        raise TypeError("Cannot send an object array; send a list of numeric arrays instead.")
    if array.dtype.byteorder == ">" or (array.dtype.byteorder == "=" and not np.little_endian):
        array = array.astype(array.dtype.newbyteorder("<"))
    if not array.flags.c_contiguous:
        # Not np.ascontiguousarray: it turns a 0-d array (a scalar weight) into shape (1,).
        array = array.copy(order="C")
    if _dtype_code(array.dtype) not in _ALLOWED_DTYPES:
        raise TypeError(f"Unsupported array dtype {array.dtype}; use a numeric or bool dtype.")
    return array


def _dtype_code(dtype):
    """How a frame's header names ``dtype``: its type code, or its name where it has no
    code of its own (see `_NAMED_DTYPES`)."""
    return dtype.name if dtype.name in _NAMED_DTYPES else dtype.str


def _dtype_of_code(code):
    """The numpy dtype a header's allowed dtype code names."""
    if code in _NAMED_DTYPES:
        import ml_dtypes  # installed with Keras and JAX

        return np.dtype(getattr(ml_dtypes, code))
    return np.dtype(code)


def _is_array_list(value):
    if isinstance(value, np.ndarray):
        return value.dtype == object
    return (
        isinstance(value, (list, tuple))
        and len(value) > 0
        and all(isinstance(item, np.ndarray) for item in value)
    )


def encode_frame(obj):
    """Encodes a message dict into a list of buffers that form one frame.

    Args:
        obj: A dict with string keys (see the module docstring for the value types).

    Returns:
        A list of bytes-like objects; sending them in order sends the frame.

    Raises:
        TypeError: If a value cannot travel on the wire.
    """
    if not isinstance(obj, dict):
        raise TypeError(f"send_data expects a dict. Received: {type(obj).__name__}")
    fields = {}
    specs = []
    buffers = []

    def add_array(array):
        array = _as_wire_array(array)
        specs.append([_dtype_code(array.dtype), list(array.shape)])
        # A flat byte view: memoryview.cast refuses shapes with a zero, e.g. (0, 3).
        buffers.append(memoryview(array.reshape(-1).view(np.uint8)))
        return len(specs) - 1

    for key, value in obj.items():
        if not isinstance(key, str):
            raise TypeError(f"Message keys must be strings. Received key: {key!r}")
        if _is_array_list(value):
            fields[key] = {"t": "arrays", "i": [add_array(item) for item in value]}
        elif isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) > 0:
            fields[key] = {"t": "array", "i": add_array(value)}
        else:
            fields[key] = {"t": "json", "v": _json_value(key, value)}
    header = json.dumps({"f": fields, "a": specs}, separators=(",", ":")).encode("utf-8")
    body_len = sum(buffer.nbytes for buffer in buffers)
    prefix = _PREFIX.pack(MAGIC, VERSION, 0, len(header), body_len)
    return [prefix + header, *buffers]


def _json_value(key, value):
    if isinstance(value, np.generic) or (isinstance(value, np.ndarray) and value.ndim == 0):
        return _json_value(key, value.item())
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [_json_value(key, item) for item in value]
    if isinstance(value, dict):
        return {str(k): _json_value(key, v) for k, v in value.items()}
    raise TypeError(
        f"Field {key!r} holds a {type(value).__name__}, which cannot travel on the wire. "
        "Use strings, numbers, booleans, None, lists, numpy arrays or lists of arrays."
    )


def send_data(conn, obj):
    """Sends one message dict as a frame.

    Args:
        conn: A socket or `Connection`.
        obj: The message dict.
    """
    for buffer in encode_frame(obj):
        conn.sendall(buffer)


def recv_exact(conn, nbytes, buffer=None):
    """Reads exactly ``nbytes`` bytes.

    Args:
        conn: A socket or `Connection`.
        nbytes: How many bytes to read.
        buffer: Optional writable ``uint8`` array of ``nbytes`` to read into.

    Returns:
        A writable numpy ``uint8`` array of ``nbytes`` (``buffer`` when given).

    Raises:
        PeerClosedError: If the peer closes before ``nbytes`` arrived.
    """
    if buffer is None:
        # Uninitialized memory: a bytearray would first zero every byte of a 2.6 MB frame.
        buffer = np.empty(nbytes, dtype=np.uint8)
    view = memoryview(buffer)
    received = 0
    while received < nbytes:
        count = conn.recv_into(view[received:], nbytes - received)
        if count == 0:
            raise PeerClosedError(
                f"Connection closed after {received} of {nbytes} expected bytes."
            )
        received += count
    return buffer


def _parse_prefix(prefix, max_frame_bytes):
    magic, version, _flags, header_len, body_len = _PREFIX.unpack(bytes(prefix))
    if magic != MAGIC or version != VERSION:
        raise ProtocolError("Not a distkeras frame (bad magic or version).")
    if header_len == 0 or header_len > MAX_HEADER_BYTES:
        raise ProtocolError(f"Frame header of {header_len} bytes is outside 1..{MAX_HEADER_BYTES}.")
    if header_len + body_len > max_frame_bytes:
        raise ProtocolError(
            f"Frame of {header_len + body_len} bytes exceeds the limit of {max_frame_bytes}."
        )
    return header_len, body_len


def _parse_header(raw_header):
    try:
        header = json.loads(bytes(raw_header).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise ProtocolError(f"Frame header is not valid JSON: {error}") from error
    if not isinstance(header, dict):
        raise ProtocolError("Frame header must be a JSON object.")
    fields, specs = header.get("f"), header.get("a")
    if not isinstance(fields, dict) or not isinstance(specs, list):
        raise ProtocolError("Frame header lacks its field table or array table.")
    return fields, [_parse_spec(spec) for spec in specs]


def _parse_spec(spec):
    if not (isinstance(spec, list) and len(spec) == 2):
        raise ProtocolError(f"Bad array description: {spec!r}")
    dtype_str, shape = spec
    if not isinstance(dtype_str, str) or dtype_str not in _ALLOWED_DTYPES:
        raise ProtocolError(f"Array dtype {dtype_str!r} is not allowed.")
    if not (isinstance(shape, list) and len(shape) <= 32):
        raise ProtocolError(f"Bad array shape: {shape!r}")
    if not all(isinstance(dim, int) and not isinstance(dim, bool) and 0 <= dim < 2**40
               for dim in shape):
        raise ProtocolError(f"Bad array shape: {shape!r}")
    dtype = _dtype_of_code(dtype_str)
    count = int(np.prod(shape, dtype=object)) if shape else 1
    return dtype, tuple(shape), count, count * dtype.itemsize


def _check_weight_spec(key, indices, specs, weight_spec):
    if len(indices) != len(weight_spec):
        raise ProtocolError(
            f"Field {key!r} holds {len(indices)} arrays; the model has {len(weight_spec)}."
        )
    for layer, (index, (shape, dtype)) in enumerate(zip(indices, weight_spec)):
        got_dtype, got_shape = specs[index][0], specs[index][1]
        if got_shape != tuple(shape) or got_dtype != np.dtype(dtype):
            raise ProtocolError(
                f"Field {key!r} array {layer} is {got_dtype}{list(got_shape)}; "
                f"the model expects {np.dtype(dtype)}{list(shape)}."
            )


def decode_frame(raw_header, body, weight_spec=None, field_specs=None):
    """Decodes a frame's header and body into a message dict.

    Args:
        raw_header: The header bytes.
        body: The body bytes (a writable buffer keeps the arrays writable).
        weight_spec: Optional list of ``(shape, dtype)`` that lists of arrays must match.
        field_specs: Optional ``{field: spec}`` for fields whose lists of arrays have
            their own spec (see `Connection`).

    Returns:
        The message dict; lists of arrays come back as numpy object arrays.

    Raises:
        ProtocolError: If anything in the frame is inconsistent.
    """
    return _decode_parsed(_parse_header(raw_header), body, weight_spec, field_specs)


def _decode_parsed(parsed_header, body, weight_spec, field_specs=None):
    fields, specs = parsed_header
    if sum(spec[3] for spec in specs) != len(body):
        raise ProtocolError("Frame body length does not match the arrays it describes.")
    arrays, offset = [], 0
    for dtype, shape, count, nbytes in specs:
        try:
            array = np.frombuffer(body, dtype=dtype, count=count, offset=offset).reshape(shape)
        except ValueError as error:  # e.g. an empty array whose other dimensions overflow
            raise ProtocolError(f"Bad array shape {list(shape)}: {error}") from error
        arrays.append(array)
        offset += nbytes
    used = set()
    message = {}
    for key, field in fields.items():
        if not isinstance(field, dict):
            raise ProtocolError(f"Bad field description for {key!r}.")
        kind = field.get("t")
        if kind == "json":
            message[key] = field.get("v")
            continue
        indices = field.get("i")
        if kind == "array":
            indices = [indices]
        elif kind != "arrays" or not isinstance(indices, list):
            raise ProtocolError(f"Bad field description for {key!r}.")
        if not (all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < len(arrays)
                    and i not in used for i in indices)
                and len(set(indices)) == len(indices)):
            raise ProtocolError(f"Field {key!r} refers to missing or reused arrays.")
        used.update(indices)
        if kind == "array":
            message[key] = arrays[indices[0]]
            continue
        spec = (field_specs or {}).get(key, weight_spec)
        if spec is not None:
            _check_weight_spec(key, indices, specs, spec)
        message[key] = weights_array(arrays[i] for i in indices)
    if len(used) != len(arrays):
        raise ProtocolError("Frame carries arrays that no field refers to.")
    return message


def recv_data(conn, reuse_body=False):
    """Receives one message dict.

    The limits come from ``conn`` when it is a `Connection` (frame size, expected weight
    shapes); a plain socket gets the defaults.

    Args:
        conn: A socket or `Connection`.
        reuse_body: Read the body into the connection's `Connection.reusable_buffer`: the
            message's arrays are then views that the next such read overwrites, for a
            caller that is done with them by then.

    Raises:
        ProtocolError: If the frame is malformed, oversized or of the wrong shapes.
        PeerClosedError: If the peer closes mid-frame.
    """
    max_frame_bytes = getattr(conn, "max_frame_bytes", DEFAULT_MAX_FRAME_BYTES)
    header_len, body_len = _parse_prefix(recv_exact(conn, _PREFIX.size), max_frame_bytes)
    # The header is checked before the body is read, so a lying header costs no allocation.
    parsed_header = _parse_header(recv_exact(conn, header_len))
    if sum(spec[3] for spec in parsed_header[1]) != body_len:
        raise ProtocolError("Frame body length does not match the arrays it describes.")
    buffer = conn.reusable_buffer(body_len) if reuse_body else None
    body = recv_exact(conn, body_len, buffer)
    return _decode_parsed(parsed_header, body, getattr(conn, "weight_spec", None),
                          getattr(conn, "field_specs", None))


def encode_message(obj):
    """Encodes a message dict into the bytes of one frame."""
    return b"".join(bytes(part) for part in encode_frame(obj))


def decode_message(data, max_frame_bytes=DEFAULT_MAX_FRAME_BYTES, weight_spec=None):
    """Decodes the bytes of one frame (as made by `encode_message`) into a message dict.

    Raises:
        ProtocolError: If the bytes are not exactly one valid frame.
    """
    data = memoryview(data)
    if len(data) < _PREFIX.size:
        raise ProtocolError("Truncated frame: shorter than its fixed prefix.")
    header_len, body_len = _parse_prefix(data[:_PREFIX.size], max_frame_bytes)
    if len(data) != _PREFIX.size + header_len + body_len:
        raise ProtocolError("Frame length does not match its prefix.")
    raw_header = data[_PREFIX.size:_PREFIX.size + header_len]
    body = bytearray(data[_PREFIX.size + header_len:])
    return decode_frame(raw_header, body, weight_spec)


def send_action(conn, action):
    """Sends a one-byte action code (pull, commit, history, quit)."""
    conn.sendall(action)


def recv_action(conn):
    """Receives a one-byte action code; returns ``b""`` when the peer closed cleanly."""
    buffer = bytearray(1)
    count = conn.recv_into(buffer, 1)
    return bytes(buffer[:count])


def authenticate(conn, token, worker_id, task_attempt_id=0):
    """Sends the run's token; the first frame of every connection.

    Args:
        conn: The connected socket.
        token: The run's token.
        worker_id: The worker's id (its partition's index).
        task_attempt_id: Spark's id of the task attempt that connects (see
            `task_attempt_id`): the server tells a retried task from the failed one.
    """
    send_data(conn, {"token": token, "worker_id": int(worker_id),
                     "task_attempt_id": int(task_attempt_id)})


def task_attempt_id():
    """Spark's ``taskAttemptId`` of the task running this code: unique in the application
    and larger for a task started later (a retry, a resubmitted stage's); 0 outside a
    Spark task."""
    try:
        from pyspark import TaskContext
    except ImportError:
        return 0
    context = TaskContext.get()
    return 0 if context is None else int(context.taskAttemptId())


def hello_attempt(message):
    """The task attempt id a handshake message announces; 0 when it names none (a client
    that predates them) or names it wrongly."""
    attempt = message.get("task_attempt_id", 0)
    if isinstance(attempt, bool) or not isinstance(attempt, int) or attempt < 0:
        return 0
    return attempt


def check_token(message, token):
    """Checks a handshake message against the run's token in constant time.

    Returns:
        The worker id the client announced.

    Raises:
        ProtocolError: If the token is missing or wrong.
    """
    offered = message.get("token")
    # "surrogatepass": JSON may carry a lone surrogate ("\ud800"), which plain UTF-8 cannot
    # encode; its UnicodeEncodeError read as a bug of the server, which stopped the run.
    if not isinstance(offered, str) or not hmac.compare_digest(
        offered.encode("utf-8", "surrogatepass"), token.encode("utf-8")
    ):
        raise ProtocolError("Wrong or missing token.")
    worker_id = message.get("worker_id")
    return worker_id if isinstance(worker_id, int) else -1


def connect(host, port, timeout=60.0, retry_interval=0.2):
    """Connects to ``host:port``, retrying until ``timeout`` seconds have passed.

    Raises:
        ConnectionError: Naming the address, when no connection could be made in time.
    """
    deadline = time.monotonic() + timeout
    last_error = None
    while True:
        try:
            sock = socket.create_connection((host, port), timeout=max(1.0, timeout))
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
        except OSError as error:
            last_error = error
        if time.monotonic() >= deadline:
            raise ConnectionError(
                f"Could not connect to the parameter server at {host}:{port} within "
                f"{timeout:.0f} s: {last_error}. Check that executors can reach the driver "
                "at that address (spark.driver.host) and that no firewall blocks the port."
            ) from last_error
        time.sleep(retry_interval)
