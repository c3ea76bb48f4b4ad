"""Asynchronous elastic averaging SGD (Zhang, Choromanska & LeCun 2015)."""

from distkeras.algorithms import update_rules
from distkeras.algorithms.base import Algorithm, Hyperparameter
from distkeras.training.checks import check_number


class AEASGD(Algorithm):
    """Every window: pull C, ``E = rho * lr * (W - C)``, ``W -= E``, commit ``E``; the
    server adds it, ``C += E``.

    The worker keeps its own weights (it does not jump to the center): the elastic force
    only pulls the two closer. Workers explore on their own between exchanges, so large
    windows, over 25, suit it (32 by default).
    """

    hyperparameters = (
        Hyperparameter("rho", 5.0, check_number, "the elastic force's strength"),
        Hyperparameter("learning_rate", 0.1, check_number,
                       "multiplies the elastic force (rho * learning_rate <= 1)"),
    )
    default_window = 32
    adds_commits_as_sent = True
    pull_first = True
    averages_weights = True  # the center is an elastic average of the replicas

    def check(self):
        if self.rho * self.learning_rate > 1.0:
            raise ValueError(
                "`rho * learning_rate` must be at most 1 (the elastic step would overshoot "
                f"the center). Received: rho={self.rho}, learning_rate={self.learning_rate}")

    def commit(self, weights, pulled, context):
        return update_rules.elastic_difference(weights, pulled, self.rho, self.learning_rate)

    def continue_from(self, weights, update, center):
        return weights - update
