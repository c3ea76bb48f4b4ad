"""Compressed commits and pulls: bfloat16 on the wire, or a sparse top-k of each commit.

A run's ``compression`` (`parse`) is None (float32 both ways), ``"bfloat16"`` or
``"topk"`` (``"topk:F"``: a fraction F of each layer's entries, 0.01 by default):

- ``"bfloat16"``: commits travel as bfloat16 (field ``"bfloat16"``, rounded to the
  nearest even), and so do pulls (cut: `truncated_bfloat16`); the center stays float32
  and the server adds the bfloat16 arrays to it directly.
- ``"topk"``: a commit is the largest ``F`` of each layer's entries by magnitude, as
  ``"indices"`` (uint32, strictly increasing, into the weights flattened and put end to
  end) and ``"values"`` (float32). Pulls are float32, or only the other workers' top-k
  commits since this worker's last pull (`Encoder.take_pull`).

The worker's `Encoder` keeps what rounding or top-k left out of a commit (its residual)
and adds it to the next one (error feedback), so nothing a rule meant to send is lost:
the sum of what was sent plus the residual is the sum of what was meant. A worker that
goes on from its own weights rather than the center (elastic averaging) keeps no
residual: what was not sent stays in its weights, and both sides move by what was sent.
"""

import math
from typing import NamedTuple

import numpy as np

from distkeras.transport.networking import ProtocolError, weights_array

BFLOAT16 = "bfloat16"
TOPK = "topk"
DEFAULT_TOPK_FRACTION = 0.01
# Top-k indices are uint32: a model of more entries cannot use top-k.
_MAX_TOPK_ENTRIES = 1 << 32


class Compression(NamedTuple):
    """A run's compression: ``kind`` (`BFLOAT16` or `TOPK`) and top-k's ``fraction``."""

    kind: str
    fraction: float = 1.0

    def __str__(self):
        return self.kind if self.kind == BFLOAT16 else f"{TOPK}:{self.fraction:g}"


def _bfloat16():
    import ml_dtypes  # installed with Keras and JAX; loaded where compression is used

    return np.dtype(ml_dtypes.bfloat16)


def parse(value):
    """The `Compression` that ``value`` names, or None for none.

    Args:
        value: None, ``"bfloat16"``, ``"topk"`` or ``"topk:F"`` (0 < F <= 1), or a
            `Compression`.

    Raises:
        ValueError: Naming the accepted values.
    """
    if value is None or isinstance(value, Compression):
        return value
    if isinstance(value, str):
        kind, _, fraction = value.partition(":")
        if kind == BFLOAT16 and not fraction:
            return Compression(BFLOAT16)
        if kind == TOPK:
            try:
                share = float(fraction) if fraction else DEFAULT_TOPK_FRACTION
            except ValueError:
                share = float("nan")
            if 0.0 < share <= 1.0:
                return Compression(TOPK, share)
    raise ValueError(
        "`compression` must be None, \"bfloat16\", \"topk\" (1% of each layer's entries) "
        f"or \"topk:F\" with 0 < F <= 1 (\"topk:0.05\"). Received: compression={value!r}")


def check_weights(compression, weight_spec):
    """Raises a ValueError when ``compression`` cannot carry weights of ``weight_spec``
    (``[(shape, dtype)]``): every weight must be float32, and top-k's flat indices must
    fit in uint32."""
    if compression is None:
        return
    for shape, dtype in weight_spec:
        if np.dtype(dtype) != np.float32:
            raise ValueError(
                f"compression={str(compression)!r} needs float32 weights; the model has a "
                f"{np.dtype(dtype)}{list(shape)} weight. Use compression=None.")
    if compression.kind == TOPK and total_entries(weight_spec) >= _MAX_TOPK_ENTRIES:
        raise ValueError("compression=\"topk\" takes models of fewer than 2**32 entries; "
                         "use \"bfloat16\".")


def check_server(compression, algorithm, weight_spec, own_handle_commit, name):
    """Raises a ValueError when a server cannot serve ``compression``.

    Args:
        compression: The run's `Compression`, or None.
        algorithm: The server's `Algorithm`.
        weight_spec: The model's ``[(shape, dtype)]``.
        own_handle_commit: Whether the server's class has a ``handle_commit`` of its own
            (the escape hatch), which reads float32 commits.
        name: The server's class name, for the error.
    """
    if compression is None:
        return
    if own_handle_commit:
        raise ValueError(
            f"{name} defines its own handle_commit, which reads float32 commits: "
            f"compression={str(compression)!r} needs the algorithm's server. Use "
            "compression=None.")
    if algorithm.sends_pulled:
        raise ValueError(
            f"{type(algorithm).__name__}'s commits carry the center the worker pulled, "
            "which compression would change: use compression=None.")
    check_weights(compression, weight_spec)


def total_entries(weight_spec):
    """The number of entries of weights of ``weight_spec``."""
    return sum(math.prod(shape) for shape, _ in weight_spec)


def offsets(weight_spec):
    """Where each weight starts among the weights flattened end to end, and the end."""
    return np.cumsum([0] + [math.prod(shape) for shape, _ in weight_spec])


def topk_counts(compression, weight_spec):
    """The entries a top-k commit sends of each weight: ``ceil(F * size)``, at least one
    of a non-empty weight."""
    return [min(size, max(1, math.ceil(compression.fraction * size))) if size else 0
            for size in (math.prod(shape) for shape, _ in weight_spec)]


def field_specs(compression, weight_spec):
    """The server's ``field_specs`` for compressed commits (bfloat16 arrays shaped like
    the weights), or None."""
    if compression is None or compression.kind != BFLOAT16:
        return None
    bfloat16 = _bfloat16()
    return {BFLOAT16: [(tuple(shape), bfloat16) for shape, _ in weight_spec]}


def to_bfloat16(weights):
    """``weights`` (float32 arrays) rounded to bfloat16, to the nearest even."""
    bfloat16 = _bfloat16()
    return weights_array(np.asarray(layer).astype(bfloat16) for layer in weights)


def truncated_bfloat16(weights):
    """``weights`` (float32 arrays) cut to bfloat16: each value's upper 16 bits.

    Notes:
        A pull's conversion, on the server: a strided copy, about a third of rounding's
        CPU. Cut towards zero, a value is off by under one bfloat16 step (2**-8 of it)
        rather than half of one; the worker's next update is measured from the center
        it pulled, so the cut never reaches the center.
    """
    if not np.little_endian:  # the upper half is not the odd uint16
        return to_bfloat16(weights)
    bfloat16 = _bfloat16()
    return weights_array(
        np.ascontiguousarray(np.asarray(layer).reshape(-1).view(np.uint16)[1::2])
        .view(bfloat16).reshape(np.shape(layer)) for layer in weights)


def widened(layer):
    """A bfloat16 array as float32, exactly: each value's 16 bits, shifted up."""
    return np.left_shift(np.asarray(layer).view(np.uint16), 16,
                         dtype=np.uint32).view(np.float32)


def read_commit(data, compression, weight_spec, counts, at_most=False):
    """The compressed update a commit carries, checked against the model.

    Args:
        data: The commit message.
        compression: The run's `Compression`.
        weight_spec: The model's ``[(shape, dtype)]``.
        counts: `topk_counts` of the model (top-k).
        at_most: The commit carries at most ``sum(counts)`` entries (a shard's part of
            one), not exactly.

    Returns:
        bfloat16: the object array of bfloat16 layers (their shapes were checked as the
        frame arrived). Top-k: ``(indices, values)``, 1-D uint32 and float32.

    Raises:
        ProtocolError: If the commit lacks its fields, or its indices or count lie.
    """
    if compression.kind == BFLOAT16:
        layers = data.get(BFLOAT16)
        if not (isinstance(layers, np.ndarray) and layers.dtype == object
                and len(layers) == len(weight_spec)):
            raise ProtocolError("A bfloat16 commit must carry its layers in \"bfloat16\".")
        return layers
    indices, values = data.get("indices"), data.get("values")
    if not (isinstance(indices, np.ndarray) and indices.dtype == np.uint32
            and indices.ndim == 1):
        raise ProtocolError("A top-k commit must carry 1-D uint32 \"indices\".")
    if not (isinstance(values, np.ndarray) and values.dtype == np.float32
            and values.shape == indices.shape):
        raise ProtocolError("A top-k commit must carry float32 \"values\", one per index.")
    if len(indices) > sum(counts) or (len(indices) != sum(counts) and not at_most):
        raise ProtocolError(f"A top-k commit carries {len(indices)} entries; this model's "
                            f"take {'at most ' if at_most else ''}{sum(counts)}.")
    if len(indices) and (int(indices[-1]) >= total_entries(weight_spec)
                         or np.any(indices[1:] <= indices[:-1])):
        raise ProtocolError("A top-k commit's indices must rise strictly and stay below "
                            "the model's number of entries.")
    return indices, values


def dense(compression, payload, weight_spec):
    """The float32 update a compressed commit (`read_commit`'s payload) stands for."""
    if compression.kind == BFLOAT16:
        return weights_array(widened(layer) for layer in payload)
    flat = np.zeros(total_entries(weight_spec), np.float32)
    flat[payload[0]] = payload[1]
    return _layers(flat, weight_spec)


def _layers(flat, weight_spec):
    """``flat`` cut into arrays shaped as ``weight_spec`` (views of it)."""
    starts = offsets(weight_spec)
    return weights_array(flat[begin:end].reshape(shape) for (shape, _), begin, end
                         in zip(weight_spec, starts[:-1], starts[1:]))


class Encoder:
    """A worker's side of compression: encodes its commits, with error feedback, and
    reads the server's pull replies.

    Args:
        compression: The run's `Compression`.
        weight_spec: The model's ``[(shape, dtype)]`` (float32).
        error_feedback: Keep what a commit left out and add it to the next.
    """

    def __init__(self, compression, weight_spec, error_feedback=True):
        check_weights(compression, weight_spec)
        self.compression = compression
        self.weight_spec = [(tuple(shape), np.dtype(dtype)) for shape, dtype in weight_spec]
        self.error_feedback = error_feedback
        self.residual = None  # what the commits so far left out (float32 layers)
        self.counts = topk_counts(compression, self.weight_spec)
        self.starts = offsets(self.weight_spec)
        self.own_sent = []  # this worker's updates (as applied) sent since its last pull

    def encode(self, update):
        """The fields of a commit of ``update`` and the update as the server will apply
        it (float32 layers).

        Args:
            update: Float32 layers, shaped like the weights.

        Returns:
            ``(fields, sent)``.
        """
        target = weights_array(np.asarray(layer, np.float32) for layer in update)
        if self.error_feedback and self.residual is not None:
            target = target + self.residual
        if self.compression.kind == BFLOAT16:
            wire = to_bfloat16(target)
            sent = weights_array(layer.astype(np.float32) for layer in wire)
            fields = {BFLOAT16: wire}
        else:
            indices, values = self._top(target)
            fields = {"indices": indices, "values": values}
            sent = dense(self.compression, (indices, values), self.weight_spec)
        if self.error_feedback:
            self.residual = target - sent
        return fields, sent

    def _top(self, target):
        """The largest entries of each layer of ``target`` by magnitude: global uint32
        indices (rising) and their float32 values."""
        indices, values = [], []
        for layer, count, start in zip(target, self.counts, self.starts):
            flat = layer.reshape(-1)
            if count == 0:
                continue
            if count < flat.size:
                chosen = np.argpartition(np.abs(flat), flat.size - count)[flat.size - count:]
                chosen.sort()
            else:
                chosen = np.arange(flat.size)
            indices.append((chosen + start).astype(np.uint32))
            values.append(flat[chosen])
        if not indices:
            return np.zeros(0, np.uint32), np.zeros(0, np.float32)
        return np.concatenate(indices), np.concatenate(values).astype(np.float32)

    def sent(self, update):
        """Notes an update sent (as applied) since the last pull (`take_pull`)."""
        self.own_sent.append(update)

    def take_pull(self, data, center):
        """The center a pull reply stands for, as float32 layers.

        Args:
            data: The reply: a ``"center"`` (float32 or bfloat16 layers), or a top-k
                run's ``"indices"`` and ``"values"`` of the other workers' commits since
                this worker's last pull and ``"own"``, how many of its own were applied.
            center: The center this worker pulled last (float32), for a sparse reply.

        Returns:
            The center, or None when the reply carries none (``{"unchanged": True}``).

        Raises:
            ProtocolError: If a sparse reply does not fit the model or this worker's
                commits.
        """
        own_sent, self.own_sent = self.own_sent, []
        if "center" in data:
            return weights_array(np.asarray(layer).astype(np.float32, copy=False)
                                 for layer in data["center"])
        if "indices" not in data:
            return None
        indices, values, own = data["indices"], data.get("values"), data.get("own")
        if not (center is not None and isinstance(indices, np.ndarray)
                and indices.dtype == np.uint32 and isinstance(values, np.ndarray)
                and values.dtype == np.float32 and values.shape == indices.shape == (
                    indices.size,) and own == len(own_sent)):
            raise ProtocolError("The server's sparse pull reply does not fit this worker.")
        flat = np.concatenate([np.asarray(layer, np.float32).reshape(-1)
                               for layer in center])
        if indices.size and int(indices.max()) >= flat.size:
            raise ProtocolError("The server's sparse pull reply indexes past the model.")
        np.add.at(flat, indices, values)
        new_center = _layers(flat, self.weight_spec)
        for update in own_sent:
            new_center = new_center + update
        return new_center
