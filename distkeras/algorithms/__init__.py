"""Asynchronous optimizers, one small file each, on the Algorithm API (`base`).

Each built-in's file registers its class (`base.register`); importing this package
imports every module in it, so the built-ins are this package's names without a list
to keep. `update_rules` holds the update rules they share, as small pure functions on
weights.
"""

import importlib
import pkgutil

from distkeras.algorithms.base import (Algorithm, Hyperparameter, ServerContext,
                                       WorkerContext, register, registered, unregister)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

# The built-ins, as this package's names (`distkeras.algorithms.ADAG`).
globals().update(registered())

__all__ = ["Algorithm", "Hyperparameter", "ServerContext", "WorkerContext", "register",
           "registered", "unregister", *registered()]
