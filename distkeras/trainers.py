"""Trainers: the driver side. Validate, start the parameter server, run the Spark job,
collect the history and return a compiled Keras model.

Every trainer is used the same way::

    trainer = ADAG(keras_model=mlp, worker_optimizer="adam", loss="categorical_crossentropy",
                   metrics=["accuracy"], num_workers=2, batch_size=32, communication_window=12)
    model = trainer.train(dataframe)

This module is the public face: the trainers are built in `distkeras.training`, and the
built-in algorithms' trainers (DOWNPOUR, ADAG, ...) derive there from the algorithms'
registration (`training.algorithm_trainers`). `TrainingError`, defined in
`distkeras.errors`, is re-exported here: users catch it as
``distkeras.trainers.TrainingError``.
"""

from distkeras.algorithms.eamsgd import carries_momentum
from distkeras.errors import TrainingError
from distkeras.training.algorithm_trainers import builtin_trainers
from distkeras.training.allreduce import AllReduceTrainer
from distkeras.training.asynchronous import (AlgorithmTrainer, AsynchronousDistributedTrainer,
                                             DistributedTrainer, trainer_for)
from distkeras.training.sequential import AveragingTrainer, EnsembleTrainer, SingleTrainer
from distkeras.training.trainer import Trainer

# The built-in algorithms' trainers, one per registered algorithm.
globals().update(builtin_trainers())



def __getattr__(name):
    """The trainer of an algorithm registered after this module was imported."""
    found = builtin_trainers().get(name)
    if found is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return found


# The names written here, then the built-in algorithms' trainers, by their registration.
__all__ = ["AlgorithmTrainer", "AllReduceTrainer", "AsynchronousDistributedTrainer", "AveragingTrainer",
           "DistributedTrainer", "EnsembleTrainer", "SingleTrainer", "Trainer", "TrainingError",
           "carries_momentum", "trainer_for"]
__all__ += list(builtin_trainers())
