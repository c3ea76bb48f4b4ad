"""Errors that say what kind of failure happened, so each is handled as it should be."""


class DistkerasError(Exception):
    """The base of every error distkeras raises of its own (``except DistkerasError``
    catches them all; each also keeps its built-in kind: ValueError, RuntimeError, ...)."""


class UnretryableError(DistkerasError):
    """An error that every retry of the worker's task would meet again.

    A worker that meets one tells the driver instead of failing its Spark task: Spark
    retries a failed task (4 times on a cluster's defaults), and each retry would train
    again up to the same error.
    """


class InvalidDataError(UnretryableError, ValueError):
    """Rows that no retry can train on: nulls, NaN or infinite values, arrays of the wrong
    length, class indices out of range, negative sample weights."""


class InvalidUpdateError(UnretryableError, ValueError):
    """A worker's commit that does not fit the model (a custom worker's bug)."""


class BackendUnavailableError(UnretryableError, ImportError):
    """An executor whose Python environment cannot load the driver's Keras backend (the
    driver runs ``KERAS_BACKEND=torch``, the executors have no torch installed)."""


class ExecutorEnvironmentError(DistkerasError, ImportError):
    """The executors' Python cannot import distkeras or its dependencies: the message names
    the Python to give them (``spark.pyspark.python`` / ``PYSPARK_PYTHON``)."""


class TrainingError(DistkerasError, RuntimeError):
    """A worker or the parameter server failed during training."""


class DataSourceError(UnretryableError, OSError):
    """Data that cannot be read where the DataFrame said it was (a Parquet file deleted or
    moved after the DataFrame was created)."""
