"""EAMSGD: AEASGD's elastic exchange plus local Nesterov momentum (the EASGD paper)."""

import copy
import logging

from distkeras.algorithms import update_rules
from distkeras.algorithms.aeasgd import AEASGD
from distkeras.algorithms.base import Hyperparameter, register
from distkeras.algorithms.arguments import check_fraction

logger = logging.getLogger(__name__)


def _check_momentum(name, value):
    if value is not None:
        check_fraction(name, value)


def carries_momentum(optimizer):
    """Whether a Keras optimizer (an instance, a name or a config) keeps a moving average
    of its gradients: Adam and its kin (a ``beta_1``), SGD or RMSprop with a momentum."""
    import keras

    if isinstance(optimizer, (str, dict)):
        optimizer = keras.optimizers.get(copy.deepcopy(optimizer))
    if hasattr(optimizer, "beta_1"):
        return True
    return bool(getattr(optimizer, "momentum", 0.0))


@register
class EAMSGD(AEASGD):
    """AEASGD with local momentum: each step is taken by the Keras optimizer at the
    look-ahead point ``W + momentum * v``; ``v`` becomes where it ended minus ``W``.

    ``momentum`` None is chosen from the worker optimizer (`for_optimizer`): the paper's
    0.9 for one without momentum of its own (plain SGD, Adagrad, RMSprop without
    momentum), 0 for one that has it (Adam and its kin, SGD or RMSprop with momentum).
    At 0 the steps are AEASGD's, on the JAX window path.

    Notes:
        Momentum on top of Adam's own moving average of the gradients overshoots: hence
        the default of 0 for such optimizers. The original code's signs were inconsistent;
        this follows the paper. See docs/algorithms/eamsgd.md for the measurements.
    """

    hyperparameters = AEASGD.hyperparameters + (Hyperparameter(
        "momentum", None, _check_momentum,
        "the local Nesterov momentum, in [0, 1); None: chosen from the worker optimizer"),)

    def __init__(self, **values):
        super().__init__(**values)
        if self.momentum == 0:
            self.local_step = None  # AEASGD's own steps

    def for_optimizer(self, optimizer):
        if self.momentum is not None:
            return self
        momentum = 0.0 if carries_momentum(optimizer) else 0.9
        logger.info("EAMSGD: local momentum %s for the worker optimizer %s (pass momentum= "
                    "to choose)", momentum, type(optimizer).__name__)
        return type(self)(**dict(self.get_config(), momentum=momentum))

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
