"""How a sharded center splits the weights: contiguous key ranges balanced by bytes.

The weights, flattened layer after layer, are one range of keys; shard ``k`` of ``S``
serves the keys whose bytes start in the ``k``-th ``S``-th of the model's bytes. A range
may end inside a layer, so one large layer is split across shards like the rest. A
shard's weights are its pieces, each a flat slice ``(layer, start, stop)`` of one layer:
a parameter server serves them as it would a model of 1-D layers, and every built-in
rule works key by key, so each shard runs the same rule on its slice.
"""

import math

import numpy as np

from distkeras.transport.networking import weights_array


def shard_layout(weight_spec, num_shards):
    """The pieces of each shard: ``[[(layer, start, stop), ...] for each shard]``.

    Args:
        weight_spec: ``[(shape, dtype)]`` of the model's weights.
        num_shards: The number of shards, at least 1.

    Returns:
        One list per shard of the flat slices it serves, in key order.

    Raises:
        ValueError: If ``num_shards`` is not a positive int, or some shard would serve
            no weights (more shards than the model has entries).
    """
    if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
        raise ValueError("`num_server_shards` must be a positive int. Received: "
                         f"num_server_shards={num_shards!r}")
    sizes = [(math.prod(shape), np.dtype(dtype).itemsize) for shape, dtype in weight_spec]
    total = sum(count * item for count, item in sizes)
    layout = [[] for _ in range(num_shards)]
    base = 0  # the byte where this layer starts
    for layer, (count, item) in enumerate(sizes):
        # The first entry of shard k: the first whose byte offset reaches k * total / S.
        cuts = [min(count, max(0, -(-(shard * total - base * num_shards)
                                    // (item * num_shards))))
                for shard in range(num_shards)] + [count]
        for shard in range(num_shards):
            if cuts[shard + 1] > cuts[shard]:
                layout[shard].append((layer, cuts[shard], cuts[shard + 1]))
        base += count * item
    if not all(layout):
        raise ValueError(f"num_server_shards={num_shards} leaves a shard with no weights: "
                         "use fewer shards than the model has entries.")
    return layout


def split(arrays, pieces):
    """The pieces of ``arrays`` (one per layer) that one shard serves, as flat views."""
    return weights_array(np.asarray(arrays[layer]).reshape(-1)[start:stop]
                         for layer, start, stop in pieces)


def join(parts, layout, weight_spec):
    """The whole weights from each shard's pieces (``parts[k]``: what `split` gave
    shard ``k``), as new arrays shaped as ``weight_spec`` says."""
    out = [np.empty(shape, dtype) for shape, dtype in weight_spec]
    for pieces, arrays in zip(layout, parts):
        for (layer, start, stop), values in zip(pieces, arrays):
            out[layer].reshape(-1)[start:stop] = values
    return weights_array(out)


def is_layers(value, num_layers):
    """Whether a message field holds one array per layer (a field that `split` cuts)."""
    return (isinstance(value, np.ndarray) and value.dtype == object
            and len(value) == num_layers)


class SliceModel:
    """One shard's weights, standing in for the model its parameter server is built on:
    what `center.CenterVariable` and `update_rules.trainable_flags` read.

    Args:
        weights: The shard's flat pieces (`split`).
        trainable: One flag per piece: whether its layer is trainable.
    """

    def __init__(self, weights, trainable):
        self._weights = list(weights)
        self.weights = [object() for _ in self._weights]
        self.trainable_weights = [tag for tag, flag in zip(self.weights, trainable) if flag]

    def get_weights(self):
        """The pieces' values."""
        return [np.array(piece) for piece in self._weights]
