"""The workers under their dist-keras import path: they run on the executors and train a
replica of the model on one partition.

A thin face: the workers live in `distkeras.executor` (see there), each built on the
driver with its `TaskSpec` and shipped to the executors by Spark.
"""

from distkeras.executor.averaging import AveragingWorker, SequentialEpochWorker
from distkeras.executor.failures import (WorkerFailure, one_line, send_failure,
                                         unretryable_error)
from distkeras.executor.network import NetworkWorker
from distkeras.executor.replica import (ModelReplica, overrides_train_step,
                                        pack_train_function_as_fit)
from distkeras.executor.sequential import EnsembleWorker, SequentialWorker
from distkeras.executor.task_spec import TaskSpec
from distkeras.executor.windowed import (ADAGWorker, AEASGDWorker, DOWNPOURWorker,
                                         DynSGDWorker, EAMSGDWorker, ExperimentalWorker,
                                         WindowedWorker)
from distkeras.executor.worker import Worker

__all__ = ["ADAGWorker", "AEASGDWorker", "AveragingWorker", "DOWNPOURWorker",
           "DynSGDWorker", "EAMSGDWorker", "EnsembleWorker", "ExperimentalWorker",
           "ModelReplica", "NetworkWorker", "SequentialEpochWorker", "SequentialWorker",
           "TaskSpec", "WindowedWorker", "Worker", "WorkerFailure", "one_line",
           "overrides_train_step", "pack_train_function_as_fit", "send_failure",
           "unretryable_error"]
