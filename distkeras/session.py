"""A SparkSession set up for distkeras on one machine (local mode)."""

import os
import sys


def local_spark_session(master="local[2]", app_name="distkeras", **conf):
    """Starts (or returns) a local SparkSession ready for distkeras.

    Executors use this Python interpreter and the driver's Keras backend; Spark listens on
    127.0.0.1 only and runs no web UI. Start it before importing Keras: JAX dislikes forks
    after it has started its threads.

    Args:
        master: The Spark master, ``local[N]`` for N parallel tasks.
        app_name: The application name.
        **conf: Extra Spark settings, for example ``{"spark.driver.memory": "4g"}`` given as
            ``**{"spark.driver.memory": "4g"}``.

    Returns:
        A `pyspark.sql.SparkSession`.
    """
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.sql.execution.arrow.pyspark.enabled", "true")
               .config("spark.executorEnv.KERAS_BACKEND",
                       os.environ.get("KERAS_BACKEND", "jax")))
    # XLA's CPU threads stay as JAX sets them: a lone worker (SingleTrainer) runs a
    # convolution on every core, as `fit` does (one thread per worker made a CNN 1.3-1.5x
    # slower), and several workers on one machine are each pinned to their own cores
    # (`distkeras.executor.affinity`). DISTKERAS_EXECUTOR_XLA_FLAGS sets the executors' XLA_FLAGS.
    if os.environ.get("DISTKERAS_EXECUTOR_XLA_FLAGS"):
        builder = builder.config("spark.executorEnv.XLA_FLAGS",
                                 os.environ["DISTKERAS_EXECUTOR_XLA_FLAGS"])
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def _import_keras_on_executor(record_batches):
    import importlib
    import os

    import pyarrow as pa

    # The workers' modules (before Keras, as a task imports them), once per Python worker
    # rather than in the first task.
    for name in ("averaging", "devices", "network", "sequential", "windowed"):
        importlib.import_module(f"distkeras.executor.{name}")
    # Keras loads on the GPUs Spark gave this task, as a training task's would.
    with sys.modules["distkeras.executor.devices"].task_devices():
        import keras
        import numpy as np

        # One tiny training step starts the backend's runtime (JAX's CPU client, XLA).
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        model.train_on_batch(np.zeros((1, 2), "float32"), np.zeros((1, 1), "float32"))
    for _ in record_batches:
        pass
    yield pa.RecordBatch.from_pydict({"worker": [f"{os.getpid()}:{keras.backend.backend()}"]})


def warm_up_executors(spark, num_tasks=None):
    """Starts the executors' Python workers and imports Keras in them.

    The first task in a fresh Python worker spends a few seconds importing Keras and its
    backend. Running this once after the session starts moves that cost out of the first
    `train()`; Spark reuses the warmed processes (``spark.python.worker.reuse``).

    Args:
        spark: The SparkSession.
        num_tasks: Parallel tasks to warm (default: the default parallelism).

    Returns:
        The executors' Keras backends, one per task.
    """
    tasks = num_tasks or spark.sparkContext.defaultParallelism
    # Through mapInArrow, like training: Spark keeps separate pools of Python workers for
    # RDD jobs and for SQL jobs, and training runs in the latter.
    rows = spark.range(0, tasks, 1, tasks).mapInArrow(
        _import_keras_on_executor, "worker string").collect()
    return [row["worker"] for row in rows]
