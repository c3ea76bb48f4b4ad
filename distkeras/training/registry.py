"""Trainer classes by name: the built-ins and plug-ins installed on this machine.

The built-ins are the trainers without an algorithm (the three sequential trainers and
AllReduceTrainer) and one trainer per registered algorithm
(`algorithms.register`, `algorithm_trainers`). A package can add its own trainer (for
example a researcher's new optimizer installed on the cluster) with an entry point in the
group ``distkeras.trainers``::

    [project.entry-points."distkeras.trainers"]
    MyOptimizer = "my_package.optimizers:MyOptimizer"

The entry point names a `Trainer` class, or an `algorithms.Algorithm` class, whose trainer
(`asynchronous.trainer_for`) is then made here.

Only registered classes can be run by name (the command line and the job server), so a
name sent over the network never leads to importing arbitrary code.
"""

import inspect
import logging
from importlib import metadata

from distkeras import algorithms
from distkeras.training.algorithm_trainers import builtin_trainers
from distkeras.training.allreduce import AllReduceTrainer
from distkeras.training.asynchronous import trainer_for
from distkeras.training.sequential import AveragingTrainer, EnsembleTrainer, SingleTrainer
from distkeras.training.trainer import Trainer

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "distkeras.trainers"
_SEQUENTIAL = {cls.__name__: cls for cls in (SingleTrainer, AveragingTrainer,
                                              EnsembleTrainer, AllReduceTrainer)}
# The built-ins' names when this module was imported (`trainer_classes` reads the
# algorithms registered since too).
BUILTIN_TRAINERS = (*_SEQUENTIAL, *algorithms.registered())


def trainer_classes():
    """All runnable trainer classes by name: built-ins first, then installed plug-ins."""
    classes = dict(_SEQUENTIAL, **builtin_trainers())
    for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name in classes:
            logger.warning("Plug-in trainer %r ignored: a built-in has that name.",
                           entry_point.name)
            continue
        try:
            loaded = entry_point.load()
        except Exception as error:  # a broken plug-in must not hide the others
            logger.warning("Plug-in trainer %r could not be loaded: %s", entry_point.name, error)
            continue
        if inspect.isclass(loaded) and issubclass(loaded, algorithms.Algorithm):
            loaded = trainer_for(loaded, entry_point.name)
        if inspect.isclass(loaded) and issubclass(loaded, Trainer):
            classes[entry_point.name] = loaded
        else:
            logger.warning("Plug-in %r is not a distkeras Trainer or Algorithm class; "
                           "ignored.",
                           entry_point.name)
    return classes


def get_trainer_class(name):
    """The trainer class registered under ``name``.

    Raises:
        ValueError: Naming the available trainers, when ``name`` is not one of them.
    """
    classes = trainer_classes()
    if name not in classes:
        raise ValueError(
            f"Unknown trainer {name!r}. Available trainers: {', '.join(sorted(classes))}.")
    return classes[name]
