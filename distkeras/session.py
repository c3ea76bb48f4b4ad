"""A SparkSession set up for distkeras on one machine (local mode), and what distkeras
reads of any session, classic or Spark Connect: its master, its parallelism and its task
slots, without the classic-only ``sparkContext``."""

import logging
import os
import re
import sys

logger = logging.getLogger(__name__)


def is_connect(spark):
    """Whether ``spark`` is a Spark Connect session (``SparkSession.builder.remote(...)``),
    which has no ``sparkContext``, RDDs or JVM on the client."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def master(spark):
    """The session's Spark master (``local[2]``, ``yarn``, ``spark://...``): the running
    context's in classic mode, the server's configuration under Connect.

    Notes:
        In classic mode the session's ``spark.master`` setting can differ from the master
        the context runs (``builder.master(...).getOrCreate()`` on a running context
        changes the setting, not the context), so the context's is read.
    """
    if not is_connect(spark):
        return spark.sparkContext.master
    return spark.conf.get("spark.master", "local") or "local"


def local_cores(master_url):
    """The tasks a ``local[N]``/``local[N,F]``/``local[*]``/``local`` master runs at once
    (the cores it uses), or None for a cluster's master."""
    if not master_url.startswith("local"):
        return None
    match = re.match(r"local\[(\d+|\*)", master_url)
    if match is None:
        return 1
    return os.cpu_count() if match.group(1) == "*" else int(match.group(1))


def _conf_int(spark, key):
    value = spark.conf.get(key, None)
    try:
        return int(value) if value not in (None, "") else None
    except ValueError:
        return None


def task_cpus(spark):
    """``spark.task.cpus``: the cores each task reserves (at least 1)."""
    return max(1, _conf_int(spark, "spark.task.cpus") or 1)


def default_parallelism(spark):
    """The session's default parallelism: ``sparkContext.defaultParallelism`` in classic
    mode; under Connect, ``spark.default.parallelism`` where set, else the cores of a local
    master or of the configured executors (2 where none of these say)."""
    if not is_connect(spark):
        return spark.sparkContext.defaultParallelism
    configured = _conf_int(spark, "spark.default.parallelism")
    if configured:
        return configured
    cores = local_cores(master(spark))
    if cores is None:
        executors, per_executor = (_conf_int(spark, "spark.executor.instances"),
                                   _conf_int(spark, "spark.executor.cores"))
        cores = executors * per_executor if executors and per_executor else None
    return max(cores or 2, 1)


def concurrent_task_slots(spark):
    """How many tasks Spark can run at once now (what a barrier stage needs), or None
    where the session does not say.

    Classic mode asks the scheduler; Spark Connect has no client-side scheduler, so the
    count comes from the configuration: a local master's cores, or
    ``spark.executor.instances * spark.executor.cores``, over ``spark.task.cpus``.
    """
    if not is_connect(spark):
        try:
            scala_context = spark.sparkContext._jsc.sc()
            profile = scala_context.resourceProfileManager().defaultResourceProfile()
            return int(scala_context.maxNumConcurrentTasks(profile))
        except Exception as error:  # py4j: an internal API that another Spark may lack
            logger.debug("Spark's task slots are unknown: %s", error)
            return None
    cores = local_cores(master(spark))
    if cores is None:
        executors, per_executor = (_conf_int(spark, "spark.executor.instances"),
                                   _conf_int(spark, "spark.executor.cores"))
        if not executors or not per_executor:
            return None
        cores = executors * per_executor
    return cores // task_cpus(spark)


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
    tasks = num_tasks or default_parallelism(spark)
    # Through mapInArrow, like training: Spark keeps separate pools of Python workers for
    # RDD jobs and for SQL jobs, and training runs in the latter.
    rows = spark.range(0, tasks, 1, tasks).mapInArrow(
        _import_keras_on_executor, "worker string").collect()
    return [row["worker"] for row in rows]
