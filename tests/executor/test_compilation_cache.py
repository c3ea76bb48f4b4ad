"""Workers on one machine share their compiled JAX steps through a cache on disk."""

import os
import subprocess
import sys
import textwrap

import pytest

STEP = textwrap.dedent("""
    import numpy as np
    from distkeras.executor.backend import enable_compilation_cache
    enable_compilation_cache()
    import keras
    from distkeras.executor.replica import ModelReplica
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(7, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="adam", loss="categorical_crossentropy")
    replica = ModelReplica(model, lambda logs, size: None)
    x = np.ones((8, 5), "float32")
    y = np.eye(3, dtype="float32")[np.arange(8) % 3]
    replica.train_on_batch(x, y)
    replica.get_weights()
""")


def _entries(folder):
    return sorted(name for name in os.listdir(folder)) if os.path.isdir(folder) else []


def _train_one_step(folder):
    env = dict(os.environ, KERAS_BACKEND="jax", DISTKERAS_JAX_CACHE=str(folder))
    subprocess.run([sys.executable, "-c", STEP], env=env, check=True, timeout=300,
                   capture_output=True)


@pytest.mark.skipif(os.environ.get("KERAS_BACKEND", "jax") != "jax", reason="JAX only")
def test_a_second_worker_process_reuses_the_first_ones_compiled_step(tmp_path):
    folder = tmp_path / "cache"
    _train_one_step(folder)
    first = _entries(folder)
    assert first, "the first process wrote no compiled step to the cache"
    _train_one_step(folder)
    # The same model's step, compiled by another process: read from the cache, not
    # compiled and written again.
    assert _entries(folder) == first
