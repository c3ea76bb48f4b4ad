"""ADAG (Hermans 2017): commit the window's change averaged per step; the center adds it."""

from distkeras import update_rules
from distkeras.algorithms.base import Algorithm


class ADAG(Algorithm):
    """Workers commit ``(W - W_pull) / window``; the server adds it.

    The window is the number of workers, at most 12, by default.

    Notes:
        Each commit moves the center by about one step's worth of progress, however long
        the window, so at equal epochs the center advances about ``num_workers / window``
        times as far as one worker would. The original's window of 12 suits 12 or more
        workers (Hermans ran 20 to 40); with 2 workers it left models of the zoo 4-27
        points below `fit`'s (docs/benchmarks.md, "Model zoo"). Non-trainable weights,
        such as BatchNormalization's statistics, are committed whole.
        ``learning_rate``, when given, is the workers' Keras optimizer's learning rate.
    """

    default_window = 12
    window_up_to_workers = True
    adds_commits_as_sent = True
    sets_worker_learning_rate = True

    def commit(self, weights, pulled, context):
        return update_rules.adag_residual(weights, pulled, context.window, context.trainable)
