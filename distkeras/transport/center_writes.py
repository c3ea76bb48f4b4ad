"""How a commit that the rule adds as sent is written into the center: into the spare
center (the center before last), or, for a top-k commit, in place.

A server's `CenterWrites` holds the spare center. The float32 add of ``reuse_buffers``
and every bfloat16 add write ``center + update`` into it when nothing else holds it (a
pull still sending it, an epoch end): no new memory per commit. A bfloat16 commit is
widened to float32 in small chunks (`add_bfloat16`): a bfloat16 value is the upper half
of the float32 of the same value, so a shift by 16 bits widens it exactly, with no full
float32 copy of the commit. A top-k commit is added in place, or to a copy of a center
that something else holds.
"""

import numpy as np

from distkeras.transport import compression as codecs
from distkeras.transport.center import RefusedUpdate, refusing_nonfinite, unshared
from distkeras.transport.networking import weights_array

# Entries widened at a time: the chunk's buffers stay in the core's cache.
CHUNK = 1 << 16
# The bits of a bfloat16 exponent: all ones for an infinity or a NaN.
_EXPONENT = 0x7F80


def add_bfloat16(center, bits, out, allow_nonfinite=False):
    """``out = center + bits`` widened to float32, chunk by chunk.

    Args:
        center: A float32 array.
        bits: The bfloat16 update shaped as ``center``, as uint16 (its bit patterns).
        out: A float32 array shaped as ``center`` (not ``center`` itself), written whole.
        allow_nonfinite: Add non-finite values rather than refuse them.

    Raises:
        RefusedUpdate: If ``bits`` holds an infinity or a NaN (unless
            ``allow_nonfinite``), or a sum overflows; ``out`` is then partly written.

    Notes:
        Each sum is the float32 sum of ``center`` and the update's exact float32 value,
        as ``np.add`` with the bfloat16 operand gives, without ml_dtypes' cast element
        by element.
    """
    flat_center, flat_bits = center.reshape(-1), bits.reshape(-1)
    flat_out = out.reshape(-1)
    size = flat_center.size
    widened = np.empty(min(size, CHUNK), np.uint32)
    exponents = np.empty(min(size, CHUNK), np.uint16)
    with refusing_nonfinite(allow_nonfinite):
        for start in range(0, size, CHUNK):
            stop = min(size, start + CHUNK)
            chunk = flat_bits[start:stop]
            if not allow_nonfinite:
                exponent = np.bitwise_and(chunk, _EXPONENT, out=exponents[:stop - start])
                if exponent.max() == _EXPONENT:
                    raise RefusedUpdate("it holds NaN or infinite values")
            wide = widened[:stop - start]
            np.left_shift(chunk, 16, out=wide, dtype=np.uint32)
            np.add(flat_center[start:stop], wide.view(np.float32),
                   out=flat_out[start:stop])


class CenterWrites:
    """Writes commits that the rule adds as sent into a server's center.

    Args:
        center: The server's `center.CenterExchange`.
    """

    def __init__(self, center):
        self.center = center
        self.spare = None  # the center before the current one, to write into

    def add_into_spare(self, center, update):
        """``center + update`` (float32) written into the spare center: a rule for
        `SocketParameterServer.apply_rule`; call under the center's ``mutex``.

        The rule leaves ``center`` and ``update`` as they are (`apply_rule`'s contract):
        ``center`` becomes the spare once replaced, written into only at a later commit
        that finds nothing else holding it.
        """
        out = self._take_spare(center)
        for into, layer, change in zip(out, center, update):
            np.add(layer, change, out=into)
        self.spare = center
        return out

    def add_bfloat16(self, layers):
        """Adds a bfloat16 commit (`compression.read_commit`'s layers) to the center,
        written into the spare center (`add_bfloat16`); call under the center's
        ``mutex``.

        Raises:
            RefusedUpdate: If the commit holds non-finite values or the sum overflows;
                the center stays as it was.
        """
        center = self.center
        weights = center.center_variable
        out = self._take_spare(weights)
        for into, layer, change in zip(out, weights, layers):
            add_bfloat16(layer, change.view(np.uint16), into, center.allow_nonfinite)
        center.center_variable = out
        self.spare = weights

    def _take_spare(self, center):
        """The spare center to write ``center + update`` into, or new memory where it is
        missing or something else holds it."""
        spare, self.spare = self.spare, None
        unheld = weights_array([np.empty(0)])
        if spare is None or spare is center or not unshared(spare, unheld):
            spare = weights_array(np.empty_like(layer) for layer in center)
        return spare

    def add_sparse(self, indices, values):
        """Adds a checked top-k commit to the center in place, or to a copy where anything
        else holds it (a pull sending it); call under the center's ``mutex``.

        Raises:
            RefusedUpdate: If a sum overflows; the center stays as it was.
        """
        center = self.center
        unheld = weights_array([np.empty(0)])
        holders = [unheld]  # held as the center is, by an attribute and a local name
        weights = center.center_variable
        if not unshared(weights, holders[0]):
            weights = weights_array(layer.copy() for layer in weights)
        with refusing_nonfinite(center.allow_nonfinite):
            add_sparse(weights, indices, values, center.starts)
        center.center_variable = weights


def split_sparse(indices, values, starts):
    """Per weight, ``(its index, flat positions in it, values)`` of a sorted top-k, for
    the weights it touches (``starts``: `compression.offsets`)."""
    bounds = np.searchsorted(indices, starts)
    parts = []
    for layer, (begin, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        if end > begin:
            parts.append((layer, indices[begin:end].astype(np.intp) - starts[layer],
                          values[begin:end]))
    return parts


def add_sparse(weights, indices, values, starts):
    """Adds a checked top-k commit to ``weights`` in place, every sum computed before any
    is written (an overflow raised inside ``np.errstate`` leaves them as they were)."""
    parts = split_sparse(indices, values, starts)
    sums = [weights[layer].reshape(-1)[where] + change for layer, where, change in parts]
    for (layer, where, _), total in zip(parts, sums):
        weights[layer].reshape(-1)[where] = total


def read_finite(data, compression, center):
    """The compressed update a commit carries (`compression.read_commit`), with top-k's
    values checked finite; a bfloat16 commit's are checked as they are added.

    Raises:
        ProtocolError: If the commit lies (`compression.read_commit`).
        RefusedUpdate: If top-k's values are not finite (unless the center's
            ``allow_nonfinite``).
    """
    payload = codecs.read_commit(data, compression, center.weight_spec, center.topk_counts,
                                 center.topk_at_most)
    if compression.kind == codecs.TOPK and not center.allow_nonfinite and \
            not np.isfinite(payload[1]).all():
        raise RefusedUpdate("it holds NaN or infinite values")
    return payload
