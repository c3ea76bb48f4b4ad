"""The research scaffold: ADAG's commit, damped on the server by the disagreement."""

from distkeras.algorithms import update_rules
from distkeras.algorithms.base import Algorithm, Hyperparameter, register, \
    window_up_to_workers
from distkeras.algorithms.arguments import check_number


@register
class Experimental(Algorithm):
    """Workers commit ADAG's residual and the center they pulled; the server damps each
    weight's update by how far the center moved since:
    ``C += residual / ((1/lr) * (C - C_stale)**2 + 1)``.

    Notes:
        The window is the number of workers, at most 5: the residual is divided by it, as
        ADAG's, so a long window with few workers moves the center too little. As ADAG's,
        its workers run an optimizer given by name at twice Keras's default rate from a
        window of 2 on (`worker_learning_rate_factor`). See docs/algorithms/experimental.md.
    """

    hyperparameters = (
        Hyperparameter("learning_rate", 1.0, check_number, "the damping's learning rate"),)
    sends_pulled = True

    @classmethod
    def default_window_for(cls, num_workers):
        return window_up_to_workers(num_workers, cls.default_window)

    @classmethod
    def worker_learning_rate_factor(cls, window, num_workers):
        # ADAG's rule, for ADAG's residual (docs/algorithms/experimental.md).
        return 2.0 if window >= 2 else 1.0

    def commit(self, weights, pulled, context):
        return update_rules.adag_residual(weights, pulled, context.window, context.trainable)

    def apply(self, center, update, context):
        return update_rules.experimental_update(center, update, context.pulled,
                                                self.learning_rate, context.trainable)
