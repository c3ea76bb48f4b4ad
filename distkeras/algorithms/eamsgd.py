"""EAMSGD: AEASGD's elastic exchange plus local Nesterov momentum (the EASGD paper)."""

from distkeras import update_rules
from distkeras.algorithms.aeasgd import AEASGD
from distkeras.algorithms.base import Hyperparameter
from distkeras.training_checks import _check_fraction


class EAMSGD(AEASGD):
    """AEASGD with local momentum: each step is taken by the Keras optimizer at the
    look-ahead point ``W + momentum * v``; ``v`` becomes where it ended minus ``W``.

    The momentum is the paper's setting for plain SGD: with Adam it compounds with Adam's
    own (0 gives AEASGD).
    """

    hyperparameters = AEASGD.hyperparameters + (
        Hyperparameter("momentum", 0.9, _check_fraction, "the local Nesterov momentum, in [0, 1)"),)

    def local_step(self, model, batch, state):
        weights = model.get_weights()
        velocity = state.get("velocity")
        if velocity is None:
            velocity = weights * 0.0
        model.set_weights(update_rules.lookahead(weights, velocity, self.momentum))
        model.train_on_batch(*batch)
        state["velocity"] = update_rules.momentum_velocity(velocity, weights,
                                                           model.get_weights())
