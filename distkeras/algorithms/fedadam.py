"""FedAdam (Reddi et al. 2021), asynchronous: the server runs Adam on workers' changes."""

from distkeras.algorithms import update_rules
from distkeras.algorithms.base import Algorithm, Hyperparameter
from distkeras.training.checks import check_fraction, check_number


class FedAdam(Algorithm):
    """Workers commit ``delta = W - W_pull`` after each window; the server moves the
    center by Adam along it: ``C += lr * m / (sqrt(v) + epsilon)``, the moments of the
    changes kept on the server (no bias correction, as the paper).

    Notes:
        Each commit is one Adam step, as it arrives (FedOpt averages a round of clients'
        changes first). Adam divides by the changes' running size, so a staleness
        discount would mostly cancel: stale commits count whole.
        The defaults are not the paper's (``beta_1`` 0.9; here a rate of 0.003 and an
        epsilon of 0.001 before): with a first moment, each commit is spread over the
        next ten or so, from workers that have since moved on, and the center lagged
        them: 6 to 17 points below `fit` on the model zoo (docs/algorithms/fedadam.md).
        With ``beta_1`` 0 and the rate equal to epsilon, a weight whose change is small
        against epsilon takes it about whole (as DOWNPOUR) and a large change is capped
        near the rate: within 1.5 points of `fit` on the five zoo models (3 seeds).
    """

    hyperparameters = (
        Hyperparameter("server_learning_rate", 0.01, check_number, "server Adam's rate"),
        Hyperparameter("beta_1", 0.0, check_fraction, "its first moment's decay"),
        Hyperparameter("beta_2", 0.99, check_fraction, "its second moment's decay"),
        Hyperparameter("epsilon", 0.01, check_number, "added to sqrt(v) (the paper's tau)"),
    )
    default_window = 10
    sets_worker_learning_rate = True
    averages_weights = True  # the center is the server's Adam step, no worker's weights

    def commit(self, weights, pulled, context):
        return update_rules.downpour_delta(weights, pulled)

    def apply(self, center, update, context):
        center, moments = update_rules.adam_outer_step(
            center, update, context.state.get("moments"), self.server_learning_rate,
            self.beta_1, self.beta_2, self.epsilon, context.trainable)
        context.state["moments"] = moments
        return center
