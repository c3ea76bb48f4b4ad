"""Asynchronous optimizers, one small file each, on the Algorithm API (`base`).

`update_rules` holds the update rules they share, as small pure functions on weights.
"""

from distkeras.algorithms.adag import ADAG
from distkeras.algorithms.aeasgd import AEASGD
from distkeras.algorithms.base import (Algorithm, Hyperparameter, ServerContext,
                                       WorkerContext)
from distkeras.algorithms.diloco import DiLoCo
from distkeras.algorithms.downpour import DOWNPOUR
from distkeras.algorithms.dynsgd import DynSGD
from distkeras.algorithms.eamsgd import EAMSGD
from distkeras.algorithms.experimental import Experimental
from distkeras.algorithms.fedadam import FedAdam

__all__ = ["ADAG", "AEASGD", "Algorithm", "DiLoCo", "DOWNPOUR", "DynSGD", "EAMSGD",
           "Experimental", "FedAdam", "Hyperparameter", "ServerContext", "WorkerContext"]
