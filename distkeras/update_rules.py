"""The update rules of every optimizer, as small pure functions.

Weights are numpy object arrays of per-layer arrays (see `networking.weights_array`), so
arithmetic applies layer by layer. No function here modifies its arguments.
"""


def downpour_delta(weights, pulled):
    """DOWNPOUR worker: the change since the last pull, ``W - W_pull``."""
    return weights - pulled


def adag_residual(weights, pulled, communication_window):
    """ADAG worker: the change since the last pull averaged per step, ``(W - W_pull) / window``."""
    return (weights - pulled) / communication_window


def add_update(center, update):
    """DOWNPOUR and ADAG server: ``C + delta`` (``C + residual``)."""
    return center + update
