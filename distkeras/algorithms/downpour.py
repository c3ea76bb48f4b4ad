"""DOWNPOUR (Dean et al. 2012): commit the window's change; the center adds it."""

from distkeras.algorithms import update_rules
from distkeras.algorithms.base import Algorithm, register


@register
class DOWNPOUR(Algorithm):
    """Workers commit ``W - W_pull``; the server adds it, ``C += delta``.

    Notes:
        Works best with small windows, under 5. Each commit adds a whole window's change,
        computed from weights that others moved meanwhile, so large windows overshoot.
        ``learning_rate``, when given, is the workers' Keras optimizer's learning rate.
    """

    sets_worker_learning_rate = True

    def commit(self, weights, pulled, context):
        return update_rules.downpour_delta(weights, pulled)
