"""DynSGD (Jiang et al. 2017): each commit divided by its staleness."""

from distkeras.algorithms import update_rules
from distkeras.algorithms.base import Algorithm


class DynSGD(Algorithm):
    """Workers commit ``W - W_pull``; the server adds ``delta / (staleness + 1)``.

    Notes:
        Workers send the update count they saw at their last pull. The server applies
        ``C += delta / (num_updates - last_update + 1)``, so a commit that others overtook
        counts less; non-trainable weights (BatchNormalization's statistics) count whole.
        ``learning_rate``, when given, is the workers' Keras optimizer's learning rate.
    """

    uses_staleness = True
    sets_worker_learning_rate = True

    def commit(self, weights, pulled, context):
        return update_rules.downpour_delta(weights, pulled)

    def apply(self, center, update, context):
        return update_rules.dynsgd_update(center, update, context.staleness, 0,
                                          context.trainable)
