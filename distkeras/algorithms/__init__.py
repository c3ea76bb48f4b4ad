"""Asynchronous optimizers, one small file each, on the Algorithm API (`base`)."""

from distkeras.algorithms.adag import ADAG
from distkeras.algorithms.aeasgd import AEASGD
from distkeras.algorithms.base import (Algorithm, Hyperparameter, ServerContext,
                                       WorkerContext)
from distkeras.algorithms.downpour import DOWNPOUR
from distkeras.algorithms.dynsgd import DynSGD
from distkeras.algorithms.eamsgd import EAMSGD
from distkeras.algorithms.experimental import Experimental

__all__ = ["ADAG", "AEASGD", "Algorithm", "DOWNPOUR", "DynSGD", "EAMSGD", "Experimental",
           "Hyperparameter", "ServerContext", "WorkerContext"]
