"""The workers under their dist-keras import path: they run on the executors and train a
replica of the model on one partition.

A thin face of dist-keras's names: the workers live in `distkeras.executor` (see there),
each built on the driver with its `TaskSpec` and shipped to the executors by Spark.
"""

from distkeras.executor.network import NetworkWorker
from distkeras.executor.sequential import SequentialWorker
from distkeras.executor.windowed import (ADAGWorker, AEASGDWorker, DOWNPOURWorker,
                                         DynSGDWorker, EAMSGDWorker, ExperimentalWorker)
from distkeras.executor.worker import Worker

__all__ = ["Worker", "SequentialWorker", "NetworkWorker", "ADAGWorker", "DOWNPOURWorker",
           "AEASGDWorker", "EAMSGDWorker", "DynSGDWorker", "ExperimentalWorker"]
