"""DiLoCo, asynchronous: workers take H local steps; the center takes a Nesterov step."""

from distkeras.algorithms import update_rules
from distkeras.algorithms.base import (Algorithm, Hyperparameter, register,
                                       staleness_discount_factor)
from distkeras.algorithms.arguments import check_fraction, check_number


@register
class DiLoCo(Algorithm):
    """DiLoCo (Douillard et al. 2023), asynchronous: a window of H local steps, then
    ``delta = W - W_pull``; the server takes ``g = -delta / (staleness + 1)`` as the
    pseudo-gradient of an outer SGD with Nesterov momentum.

    Notes:
        Each commit is applied as it comes, divided by its staleness + 1: a round of k
        commits in step adds up to their mean, DiLoCo's pseudo-gradient. The paper's outer
        momentum overshoots at short windows, and the discount leaves the center about 1/k
        of the summed progress: hence a lower momentum and outer rate, and from 2 workers an
        optimizer given by name at twice its default rate. See docs/algorithms/diloco.md.
    """

    hyperparameters = (
        Hyperparameter("outer_learning_rate", 0.5, check_number, "the outer SGD's rate"),
        Hyperparameter("outer_momentum", 0.5, check_fraction,
                       "the outer SGD's Nesterov momentum, in [0, 1)"),
    )
    default_window = 20
    uses_staleness = True
    sets_worker_learning_rate = True
    averages_weights = True  # the center is an outer step from the replicas' weights

    @classmethod
    def worker_learning_rate_factor(cls, window, num_workers):
        return staleness_discount_factor(num_workers)

    def commit(self, weights, pulled, context):
        return update_rules.downpour_delta(weights, pulled)

    def apply(self, center, update, context):
        center, velocity = update_rules.nesterov_outer_step(
            center, update, context.state.get("velocity"), self.outer_learning_rate,
            self.outer_momentum, 1.0 / (context.staleness + 1), context.trainable)
        context.state["velocity"] = velocity
        return center
