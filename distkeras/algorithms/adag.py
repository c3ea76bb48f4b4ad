"""ADAG (Hermans 2017): commit the window's change averaged per step; the center adds it."""

from distkeras.algorithms import update_rules
from distkeras.algorithms.base import Algorithm, register, window_up_to_workers


@register
class ADAG(Algorithm):
    """Workers commit ``(W - W_pull) / window``; the server adds it.

    The window is the number of workers, at most 12, by default. From a window of 2 on,
    a worker optimizer given by name (``"adam"``) runs at twice Keras's default rate for
    it, unless the trainer is given a ``learning_rate`` (`worker_learning_rate_factor`);
    an optimizer instance or config keeps the rate it was given.

    Notes:
        Each commit moves the center by about one step's worth, however long the window:
        the original's window of 12 suits 12 or more workers, a short one fits few. At a
        window of 2 the center still misses half of each window's progress, which the
        doubled rate makes up for. Non-trainable weights (BatchNormalization's statistics)
        are committed whole. See docs/algorithms/adag.md for the measurements.
    """

    default_window = 12
    sets_worker_learning_rate = True

    @classmethod
    def default_window_for(cls, num_workers):
        return window_up_to_workers(num_workers, cls.default_window)

    @classmethod
    def worker_learning_rate_factor(cls, window, num_workers):
        return 2.0 if window >= 2 else 1.0

    def commit(self, weights, pulled, context):
        return update_rules.adag_residual(weights, pulled, context.window, context.trainable)
