"""Asynchronous elastic averaging SGD (Zhang, Choromanska & LeCun 2015)."""

from distkeras.algorithms import update_rules
from distkeras.algorithms.base import Algorithm, Hyperparameter, register
from distkeras.algorithms.arguments import check_number


@register
class AEASGD(Algorithm):
    """Every window: pull C, ``E = rho * lr * (W - C)``, ``W -= E``, commit ``E``; the
    server adds it, ``C += E``.

    The worker keeps its own weights (it does not jump to the center): the elastic force
    only pulls the two closer. Workers explore on their own between exchanges, so long
    windows suit it (16 by default).

    Notes:
        With ``k`` workers each replica takes ``1/k`` of `fit`'s steps at equal epochs, and
        the elastic force brakes each worker by what it moves the center. Hence a window
        shorter than the paper's and, from 2 workers on, a worker optimizer given by name
        (``"adam"``) at twice Keras's default rate (`worker_learning_rate_factor`; an
        instance or config keeps its rate). See docs/algorithms/aeasgd.md.
    """

    hyperparameters = (
        Hyperparameter("rho", 5.0, check_number, "the elastic force's strength"),
        Hyperparameter("learning_rate", 0.1, check_number,
                       "multiplies the elastic force (rho * learning_rate <= 1)"),
    )
    default_window = 16
    pull_first = True
    averages_weights = True  # the center is an elastic average of the replicas

    @classmethod
    def worker_learning_rate_factor(cls, window, num_workers):
        return 2.0 if isinstance(num_workers, int) and num_workers >= 2 else 1.0

    def check(self):
        if self.rho * self.learning_rate > 1.0:
            raise ValueError(
                "`rho * learning_rate` must be at most 1 (the elastic step would overshoot "
                f"the center). Received: rho={self.rho}, learning_rate={self.learning_rate}")

    def commit(self, weights, pulled, context):
        return update_rules.elastic_difference(weights, pulled, self.rho, self.learning_rate)

    def continue_from(self, weights, update, center):
        return weights - update
