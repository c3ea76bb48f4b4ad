"""Keras on an executor, prepared before a worker or a predictor builds its model.

Selects the driver's backend before Keras is imported there, and lets the worker processes
of one machine share their compiled JAX steps.
"""

import logging
import os

from distkeras.errors import BackendUnavailableError

logger = logging.getLogger(__name__)


def enable_compilation_cache():
    """Shares compiled JAX steps between the worker processes of this machine.

    Every worker compiles the same training step; with the cache on disk only the first
    one pays for it.
    """
    import keras

    if keras.backend.backend() != "jax":
        return
    import tempfile

    import jax

    folder = os.environ.get("DISTKERAS_JAX_CACHE",
                            os.path.join(tempfile.gettempdir(), "distkeras-jax-cache"))
    try:
        jax.config.update("jax_compilation_cache_dir", folder)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    except (AttributeError, ValueError) as error:  # an older JAX without these options
        logger.info("JAX compilation cache not enabled: %s", error)


def _import_backend(backend):
    """Imports Keras on the ``backend`` just selected, or says which backend this
    executor lacks: a bare "No module named 'torch'" from deep in Keras, retried by Spark
    up to 4 times, did not say that the driver's ``KERAS_BACKEND`` chose it."""
    import importlib

    try:
        importlib.import_module("keras")  # loads the backend KERAS_BACKEND names
    except ImportError as error:
        raise BackendUnavailableError(
            f"The driver trains with Keras's {backend!r} backend (KERAS_BACKEND={backend}) "
            f"but this executor's Python cannot load it: {error}. Install {backend} in the "
            "executors' Python environment (the one spark.pyspark.python or PYSPARK_PYTHON "
            "names), or set KERAS_BACKEND on the driver, before importing distkeras, to a "
            "backend the executors have (jax, the default).") from error


def ensure_backend(backend):
    """Selects the driver's Keras backend on this executor, before Keras is imported."""
    import sys

    if backend is None:
        return
    if "keras" not in sys.modules:
        os.environ["KERAS_BACKEND"] = backend
        _import_backend(backend)
        return
    import keras

    if keras.backend.backend() != backend:
        raise RuntimeError(
            f"This executor's Keras runs the {keras.backend.backend()!r} backend but the "
            f"driver's runs {backend!r}. Set KERAS_BACKEND={backend} for the executors too "
            f"(for example --conf spark.executorEnv.KERAS_BACKEND={backend})."
        )
