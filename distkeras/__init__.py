"""Distributed Keras: data-parallel training of Keras 3 models on Apache Spark.

Importing the package makes JAX the default Keras backend (the fastest on CPU), unless
``KERAS_BACKEND`` is already set. The same default applies on the executors, which import
this package before they import Keras.
"""

import os

os.environ.setdefault("KERAS_BACKEND", "jax")

__version__ = "0.1.0"

# The names most scripts need, from the package itself (``from distkeras import ADAG,
# local_spark_session``). Imported on first use: importing the package must not import
# Keras or JAX, as the driver starts Spark first. The built-in algorithms' trainers are
# among them, by their registration (`algorithms.register`).
_EXPORTS = {
    "local_spark_session": "distkeras.session",
    "DistkerasError": "distkeras.errors",
    "TrainingError": "distkeras.errors",
    "Algorithm": "distkeras.algorithms",
    "Hyperparameter": "distkeras.algorithms",
    "ModelPredictor": "distkeras.predictors",
    **{name: "distkeras.trainers" for name in (
        "Trainer", "trainer_for", "SingleTrainer", "AveragingTrainer", "EnsembleTrainer",
        "AllReduceTrainer")},
}


def _exports():
    """`_EXPORTS` and the registered algorithms' trainers: ``{name: module}``."""
    # Late: importing the package must not load numpy, Keras or JAX (Spark starts first).
    from distkeras.algorithms import registered

    return dict(_EXPORTS, **{name: "distkeras.trainers" for name in registered()})


def __getattr__(name):
    """The public name ``name``, imported from its module on first use."""
    import importlib

    if name == "__all__":
        return sorted(_exports())
    module = _EXPORTS.get(name) or (None if name.startswith("_") else _exports().get(name))
    if module is None:
        raise AttributeError(f"module 'distkeras' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__():
    return sorted(set(globals()) | set(_exports()))
