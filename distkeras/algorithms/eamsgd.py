"""EAMSGD: AEASGD's elastic exchange plus local Nesterov momentum (the EASGD paper)."""

from distkeras.algorithms import update_rules
from distkeras.algorithms.aeasgd import AEASGD
from distkeras.algorithms.base import Hyperparameter
from distkeras.algorithms.arguments import check_fraction


def _check_momentum(name, value):
    if value is not None:
        check_fraction(name, value)


class EAMSGD(AEASGD):
    """AEASGD with local momentum: each step is taken by the Keras optimizer at the
    look-ahead point ``W + momentum * v``; ``v`` becomes where it ended minus ``W``.

    ``momentum`` None is the paper's 0.9 here; `trainers.EAMSGD` chooses it from the
    worker optimizer (0 for Adam and its kin). At 0 the steps are AEASGD's, on the JAX
    window path.
    """

    hyperparameters = AEASGD.hyperparameters + (Hyperparameter(
        "momentum", None, _check_momentum,
        "the local Nesterov momentum, in [0, 1); None: chosen from the worker optimizer"),)

    def __init__(self, **values):
        super().__init__(**values)
        if self.momentum == 0:
            self.local_step = None  # AEASGD's own steps

    def local_step(self, model, batch, state):
        momentum = 0.9 if self.momentum is None else self.momentum
        weights = model.get_weights()
        velocity = state.get("velocity")
        if velocity is None:
            velocity = weights * 0.0
        model.set_weights(update_rules.lookahead(weights, velocity, momentum))
        model.train_on_batch(*batch)
        state["velocity"] = update_rules.momentum_velocity(velocity, weights,
                                                           model.get_weights())
