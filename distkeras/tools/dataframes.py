"""dist-keras's DataFrame helpers: a random order of the rows, and the rows cached in
as many partitions as workers (the driver; Spark runs them)."""

import numpy as np


def shuffle(dataframe, seed=None):
    """Returns ``dataframe``'s rows in a random order (dist-keras's ``utils.shuffle``).

    Every row moves through a Spark shuffle, as in dist-keras: cache or save the result
    to train on it several times in the same order. ``trainer.train(df, shuffle=True)``
    shuffles as it lays the rows out for the workers, without a separate step.

    Args:
        dataframe: A Spark DataFrame.
        seed: Seed of the random order (None: a new order at every call).

    Returns:
        A DataFrame with the same rows and columns.
    """
    from pyspark.sql import functions as F

    return dataframe.orderBy(F.rand(seed))


def precache(dataframe, num_workers=None):
    """Lays ``dataframe`` out in ``num_workers`` partitions, caches and computes it
    (dist-keras's ``utils.precache``); returns the cached DataFrame.

    A trainer then reads the rows from the executors' memory instead of computing them
    again (reading the Parquet, running the transformers) at every epoch and every run.

    Args:
        dataframe: A Spark DataFrame.
        num_workers: The partitions to lay it out in (the trainer's ``num_workers``);
            None keeps its partitions.
    """
    if num_workers is not None:
        if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) \
                or num_workers < 1:
            raise ValueError("`num_workers` must be an integer >= 1. Received: "
                             f"num_workers={num_workers!r}")
        dataframe = dataframe.repartition(num_workers)
    dataframe = dataframe.cache()
    dataframe.count()
    return dataframe

