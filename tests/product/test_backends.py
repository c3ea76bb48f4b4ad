"""The torch and tensorflow Keras backends, end to end on local Spark.

JAX is the default (and the shared test session's backend); DESIGN.md asks that torch and
tensorflow work where installed. `scripts/setup.sh --backends` installs both; each runs
here in a process of its own, with its own SparkSession.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SUPPORT = Path(__file__).parents[1] / "backend_support.py"


@pytest.mark.parametrize("backend, module", [("torch", "torch"),
                                             ("tensorflow", "tensorflow")])
def test_training_and_prediction_run_on_the_backend(backend, module):
    if importlib.util.find_spec(module) is None:
        pytest.fail(f"{module} is not installed: run `bash scripts/setup.sh --backends` "
                    "(the README's test command does).")
    env = {**os.environ, "KERAS_BACKEND": backend}
    run = subprocess.run([sys.executable, str(SUPPORT)], env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])

    assert results["driver"] == backend and results["executors"] == [backend]
    # Both trainers run every epoch in one Spark job, waiting on the driver at the ends.
    assert results["AveragingTrainer"]["one_job"] and results["SingleTrainer"]["one_job"]
    for trainer in ("SingleTrainer", "ADAG", "AveragingTrainer"):
        result = results[trainer]
        assert result["accuracy"] > 0.6, (trainer, result)  # 0.1 by chance
        assert result["validation_epochs"] == [1, 2] and result["compiled"]
    # 3,000 rows, batch 32: 94 steps per epoch, on one worker or shared by two.
    assert results["SingleTrainer"]["steps"] == 188
    assert results["ADAG"]["steps"] == 2 * 2 * 47
    # A train_step of the user's own that unpacks x, y = data, as fit hands it the batch
    # (Keras's train_on_batch handed it (x, y, None): "too many values to unpack").
    own = results["own_train_step"]
    assert len(own["losses"]) == 8  # 256 rows, 32 each
    np.testing.assert_allclose(np.mean(own["losses"]), own["fit_loss"], rtol=1e-4)
    assert own["weight_error"] < 1e-5


def test_an_executor_lacking_the_drivers_backend_says_so_once(tmp_path):
    # An executor's Python process on the driver's KERAS_BACKEND=torch, torch not installed
    # there (a torch package that cannot be imported stands in for it).
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'torch'\")\n")
    code = (
        "from distkeras.executor import backend, failures\n"
        "try:\n"
        "    backend.ensure_backend('torch')\n"
        "except ImportError as error:\n"
        "    print(failures.unretryable_error(error) is not None, failures.one_line(error))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(tmp_path), str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    env.pop("KERAS_BACKEND", None)
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]
    # Was no error here, then "No module named 'torch'" from inside Keras, at each of
    # Spark's retries of every task.
    assert run.stdout.startswith("True BackendUnavailableError: The driver trains with "
                                 "Keras's 'torch' backend (KERAS_BACKEND=torch)"), run.stdout
    assert "Install torch in the executors' Python environment" in run.stdout
