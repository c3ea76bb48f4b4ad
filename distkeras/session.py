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
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session
