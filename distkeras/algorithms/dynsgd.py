"""DynSGD (Jiang et al. 2017): each commit divided by its staleness."""

from distkeras.algorithms import update_rules
from distkeras.algorithms.base import Algorithm, register, staleness_discount_factor


@register
class DynSGD(Algorithm):
    """Workers commit ``W - W_pull``; the server adds ``delta / (staleness + 1)``.

    Notes:
        A commit that others overtook since its pull counts less; non-trainable weights
        (BatchNormalization's statistics) count whole. ``learning_rate``, when given, is
        the workers' Keras optimizer's learning rate; given none, from 2 workers on, an
        optimizer given by name (``"adam"``) runs at twice Keras's default rate for it
        (`worker_learning_rate_factor`). See docs/algorithms/dynsgd.md.
    """

    uses_staleness = True
    sets_worker_learning_rate = True

    @classmethod
    def worker_learning_rate_factor(cls, window, num_workers):
        # With k workers in step, a commit is overtaken by about k - 1 others: the center
        # keeps 1/k of the summed progress, so the workers run faster. Twice, not k times:
        # only 2 workers could be measured (docs/algorithms/dynsgd.md).
        return staleness_discount_factor(num_workers)

    def commit(self, weights, pulled, context):
        return update_rules.downpour_delta(weights, pulled)

    def apply(self, center, update, context):
        return update_rules.dynsgd_update(center, update, context.staleness, 0,
                                          context.trainable)
