"""Trainers: the driver side. Validate, start the parameter server, run the Spark job,
collect the history and return a compiled Keras model.

Every trainer is used the same way::

    trainer = ADAG(keras_model=mlp, worker_optimizer="adam", loss="categorical_crossentropy",
                   metrics=["accuracy"], num_workers=2, batch_size=32, communication_window=12)
    model = trainer.train(dataframe)

This module is the public face: the trainers are built in `distkeras.training` (the
settings a run resolves, the run and its results, the execution plans, the server's
lifecycle), and the built-in algorithms' trainers are declared here. `TrainingError`,
defined in `distkeras.errors`, is re-exported here: users catch it as
``distkeras.trainers.TrainingError``.
"""

import copy
import logging

from distkeras import algorithms
from distkeras.errors import TrainingError
from distkeras.executor.windowed import EAMSGDWorker
from distkeras.training.asynchronous import (AlgorithmTrainer, AsynchronousDistributedTrainer,
                                             DistributedTrainer, trainer_for)
from distkeras.training.sequential import AveragingTrainer, EnsembleTrainer, SingleTrainer
from distkeras.training.trainer import Trainer

__all__ = ["ADAG", "AEASGD", "AlgorithmTrainer", "AsynchronousDistributedTrainer",
           "AveragingTrainer", "DOWNPOUR", "DiLoCo", "DistributedTrainer", "DynSGD", "EAMSGD",
           "EnsembleTrainer", "Experimental", "FedAdam", "SingleTrainer", "Trainer",
           "TrainingError", "carries_momentum", "trainer_for"]

logger = logging.getLogger(__name__)


class DOWNPOUR(AlgorithmTrainer):
    """DOWNPOUR (Dean et al. 2012): workers commit ``W - W_pull``; the server adds it.

    Takes `AsynchronousDistributedTrainer`'s arguments; ``communication_window`` is 5 by
    default. The rule: `algorithms.downpour.DOWNPOUR`.
    """

    algorithm = algorithms.DOWNPOUR


class ADAG(AlgorithmTrainer):
    """ADAG (Hermans 2017): workers commit ``(W - W_pull) / window``; the server adds it.

    Takes `AsynchronousDistributedTrainer`'s arguments; ``communication_window`` is the
    number of workers, at most 12, by default. The rule: `algorithms.adag.ADAG`.
    """

    algorithm = algorithms.ADAG


class DynSGD(AlgorithmTrainer):
    """DynSGD (Jiang et al. 2017): each commit is divided by its staleness.

    Takes `AsynchronousDistributedTrainer`'s arguments; ``communication_window`` is 5 by
    default. The rule: `algorithms.dynsgd.DynSGD`.
    """

    algorithm = algorithms.DynSGD


class AEASGD(AlgorithmTrainer):
    """Asynchronous elastic averaging SGD (Zhang, Choromanska & LeCun 2015).

    Takes `AsynchronousDistributedTrainer`'s arguments, ``rho`` (5.0) and
    ``learning_rate`` (0.1, multiplying the elastic force; ``rho * learning_rate`` must
    be at most 1); ``communication_window`` is 16 by default. The rule:
    `algorithms.aeasgd.AEASGD`.
    """

    algorithm = algorithms.AEASGD


def carries_momentum(optimizer):
    """Whether a Keras optimizer (an instance, a name or a config) keeps a moving average
    of its gradients: Adam and its kin (a ``beta_1``), SGD or RMSprop with a momentum."""
    import keras

    if isinstance(optimizer, (str, dict)):
        optimizer = keras.optimizers.get(copy.deepcopy(optimizer))
    if hasattr(optimizer, "beta_1"):
        return True
    return bool(getattr(optimizer, "momentum", 0.0))


class EAMSGD(AEASGD):
    """EAMSGD: AEASGD plus local Nesterov momentum, as in the EASGD paper.

    Takes `AEASGD`'s arguments and ``momentum``, the local momentum, in [0, 1) (0 gives
    AEASGD). ``momentum=None`` (the default) is 0.9, the paper's setting, for a worker
    optimizer without momentum of its own (plain SGD, Adagrad, RMSprop without momentum),
    and 0 for one that has it (Adam and its kin, SGD or RMSprop with momentum). The rule:
    `algorithms.eamsgd.EAMSGD`.

    Notes:
        On top of Adam's own moving average of the gradients, a momentum of 0.9 made the
        zoo's MLP 12 points less accurate than `fit` (0.706 against 0.829; 0.824 with
        momentum 0): hence the default of 0 there.
    """

    algorithm = algorithms.EAMSGD

    def local_momentum(self):
        """The momentum the workers use: ``momentum``, or where None the default for the
        worker optimizer (see the class's docstring)."""
        if self.momentum is not None:
            return self.momentum
        # The optimizer a run trains with: a compiled model lends its own when none given.
        optimizer = self.compiled_settings()["worker_optimizer"]
        momentum = 0.0 if carries_momentum(optimizer) else 0.9
        logger.info("EAMSGD: local momentum %s for the worker optimizer %s (pass momentum= "
                    "to choose)", momentum, type(optimizer).__name__)
        return momentum

    def make_algorithm(self):
        return self.algorithm(**dict(self.hyperparameter_values(),
                                     momentum=self.local_momentum()))

    def allocate_worker(self):
        return EAMSGDWorker(self.master_model, algorithm=self.make_algorithm())


class Experimental(AlgorithmTrainer):
    """The research scaffold: ADAG's commit, damped by the disagreement on the server.

    Takes `AsynchronousDistributedTrainer`'s arguments; ``communication_window`` is the
    number of workers, at most 5, and ``learning_rate`` 1.0 by default. The rule:
    `algorithms.experimental.Experimental`.
    """

    algorithm = algorithms.Experimental


class DiLoCo(AlgorithmTrainer):
    """DiLoCo, asynchronous: H local steps (the window, 20 by default), then an outer
    Nesterov step on the center along the change, divided by its staleness + 1.

    Takes `AsynchronousDistributedTrainer`'s arguments, ``outer_learning_rate`` (0.5) and
    ``outer_momentum`` (0.5); from 2 workers, an optimizer given by name runs at twice
    Keras's default rate unless ``learning_rate`` is given. The rule:
    `algorithms.diloco.DiLoCo`.
    """

    algorithm = algorithms.DiLoCo


class FedAdam(AlgorithmTrainer):
    """FedAdam, asynchronous: the server moves the center by Adam along each worker's
    change over its window (10 steps by default), divided by its staleness + 1.

    Takes `AsynchronousDistributedTrainer`'s arguments, ``server_learning_rate`` (0.01),
    ``beta_1`` (0), ``beta_2`` (0.99) and ``epsilon`` (0.01); from 2 workers, an optimizer
    given by name runs at twice Keras's default rate unless ``learning_rate`` is given.
    The rule: `algorithms.fedadam.FedAdam`.
    """

    algorithm = algorithms.FedAdam
