"""FedAdam (Reddi et al. 2021), asynchronous: the server runs Adam on workers' changes."""

from distkeras.algorithms import update_rules
from distkeras.algorithms.base import (Algorithm, Hyperparameter, register,
                                       staleness_discount_factor)
from distkeras.algorithms.arguments import check_fraction, check_number


@register
class FedAdam(Algorithm):
    """Workers commit ``delta = W - W_pull`` after each window; the server takes
    ``d = delta / (staleness + 1)`` and moves the center by Adam along it:
    ``C += lr * m / (sqrt(v) + epsilon)``, the moments of ``d`` kept on the server (no
    bias correction, as the paper).

    Notes:
        Each commit is one Adam step, as it arrives; the staleness discount (as DiLoCo's)
        makes a round of k commits add up to about their mean. Asynchronous, the paper's
        first moment spreads each commit over later ones made from moved weights: hence no
        first moment and a rate equal to epsilon. As DynSGD's, given no ``learning_rate``
        an optimizer given by name runs at twice its rate. See docs/algorithms/fedadam.md.
    """

    hyperparameters = (
        Hyperparameter("server_learning_rate", 0.01, check_number, "server Adam's rate"),
        Hyperparameter("beta_1", 0.0, check_fraction, "its first moment's decay"),
        Hyperparameter("beta_2", 0.99, check_fraction, "its second moment's decay"),
        Hyperparameter("epsilon", 0.01, check_number, "added to sqrt(v) (the paper's tau)"),
    )
    default_window = 10
    uses_staleness = True
    sets_worker_learning_rate = True
    averages_weights = True  # the center is the server's Adam step, no worker's weights

    @classmethod
    def worker_learning_rate_factor(cls, window, num_workers):
        # The staleness discount slows the center; faster workers make up for it
        # (docs/algorithms/fedadam.md).
        return staleness_discount_factor(num_workers)

    def commit(self, weights, pulled, context):
        return update_rules.downpour_delta(weights, pulled)

    def apply(self, center, update, context):
        center, moments = update_rules.adam_outer_step(
            center, update, context.state.get("moments"), self.server_learning_rate,
            self.beta_1, self.beta_2, self.epsilon, 1.0 / (context.staleness + 1),
            context.trainable)
        context.state["moments"] = moments
        return center
