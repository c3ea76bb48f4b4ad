"""Runs examples/workflow.ipynb end to end, on a small subset, in a fresh Jupyter kernel.

The notebook starts its own local Spark in the kernel process (a separate process from
pytest), so this test does not use the shared ``spark`` fixture.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

NOTEBOOK = Path(__file__).resolve().parents[2] / "examples" / "workflow.ipynb"
TRAINERS = ("SingleTrainer", "ADAG", "DOWNPOUR", "AEASGD", "DynSGD")
# A model that learned nothing scores about 0.10. One pass over 4,000 images takes every
# trainer past 0.70 (measured 0.73 to 0.78 on 1,000 test images); on 2,000 images DOWNPOUR
# (its workers' full deltas added asynchronously) scored only 0.58 to 0.61, too close to
# the bar.
MIN_ACCURACY = 0.5
# Section 7 checks validation every epoch and early stopping's wiring: three epochs are
# enough for that (its six ran 13 of the notebook's 110 seconds).
PARAMETERS = {"LIMIT": 4000, "TEST_LIMIT": 1000, "WORKERS": 2, "EPOCHS": 1,
              "MASTER": "local[2]", "MAX_EPOCHS": 3}
KERNEL = "python3"


def _kernel_dir(prefix):
    return Path(prefix) / "share" / "jupyter" / "kernels" / KERNEL


def _install_kernelspec(tmp_path):
    """Makes kernel ``python3`` run this interpreter; returns the jupyter data dir holding it.

    A fresh virtual environment has no kernelspec: install one with ``--sys-prefix`` (or
    under ``tmp_path`` if the environment is read-only). The directory returned goes first
    on JUPYTER_PATH, so a ``python3`` kernel of another Python (user or system wide) cannot
    take its place.
    """
    for prefix in (sys.prefix, str(tmp_path / "kernel-prefix")):
        kernel_json = _kernel_dir(prefix) / "kernel.json"
        if kernel_json.exists() and json.loads(kernel_json.read_text())["argv"][0] == \
                sys.executable:
            return Path(prefix) / "share" / "jupyter"
        location = ["--sys-prefix"] if prefix == sys.prefix else ["--prefix", prefix]
        result = subprocess.run(
            [sys.executable, "-m", "ipykernel", "install", *location, "--name", KERNEL],
            capture_output=True, text=True, check=False)
        if result.returncode == 0 and kernel_json.exists():
            return Path(prefix) / "share" / "jupyter"
    raise RuntimeError(f"Could not install the {KERNEL!r} kernelspec: {result.stderr}")


def _inject_parameters(notebook, parameters):
    """Adds a cell after the one tagged ``parameters`` that overrides them (as papermill)."""
    source = "\n".join(f"{name} = {value!r}" for name, value in parameters.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    for index, existing in enumerate(notebook.cells):
        if "parameters" in existing.get("metadata", {}).get("tags", []):
            notebook.cells.insert(index + 1, cell)
            return notebook
    raise AssertionError("The notebook has no cell tagged 'parameters'.")


def _text(output):
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return "\n".join(output.get("traceback", []))
    return output.get("data", {}).get("text/plain", "")


def test_workflow_notebook_runs(tmp_path, monkeypatch):
    data_dir = _install_kernelspec(tmp_path)
    # Inherited by the kernel process.
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(
        [str(data_dir)] + [p for p in os.environ.get("JUPYTER_PATH", "").split(os.pathsep) if p]))
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv("KERAS_BACKEND", "jax")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("PYSPARK_DRIVER_PYTHON", sys.executable)
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    spec = KernelSpecManager().get_kernel_spec(KERNEL)
    assert spec.argv[0] == sys.executable, spec.argv

    notebook = _inject_parameters(nbformat.read(NOTEBOOK, as_version=4), PARAMETERS)
    client = NotebookClient(notebook, timeout=600, kernel_name=KERNEL,
                            resources={"metadata": {"path": str(tmp_path)}})
    try:
        client.execute()
    except CellExecutionError as error:
        pytest.fail(f"The notebook failed:\n{error}")

    outputs = [output for cell in notebook.cells if cell.cell_type == "code"
               for output in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]

    results = [line[len("RESULTS_JSON "):] for output in outputs
               for line in _text(output).splitlines() if line.startswith("RESULTS_JSON ")]
    assert len(results) == 1, "the notebook must print one RESULTS_JSON line"
    rows = {row["trainer"]: row for row in json.loads(results[0])}
    assert set(rows) == set(TRAINERS)
    for name, row in rows.items():
        assert row["test accuracy"] > MIN_ACCURACY, (name, row)
        assert row["training time (s)"] > 0 and row["samples/s"] > 0, (name, row)

    # The summary table is the display that follows the RESULTS_JSON line.
    tables = [_text(o) for o in outputs if o.get("output_type") == "execute_result"
              and "test accuracy" in _text(o) and "samples/s" in _text(o)]
    assert tables, "no summary table in the outputs"
    for name in TRAINERS:
        assert name in tables[-1], f"{name} missing from the summary table"

    # Section 7: validation every epoch, early stopping, the test set judged at the end.
    validated = [json.loads(line[len("VALIDATION_JSON "):]) for output in outputs
                 for line in _text(output).splitlines() if line.startswith("VALIDATION_JSON ")]
    assert len(validated) == 1, "the notebook must print one VALIDATION_JSON line"
    epochs = validated[0]["epochs"]
    assert epochs == list(range(1, len(epochs) + 1)) and len(epochs) >= 2
    assert min(validated[0]["val_accuracy"]) > MIN_ACCURACY
    assert validated[0]["test_accuracy"] > MIN_ACCURACY

    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) >= 2, "the loss plot and plot_history's figure should be shown"


def test_progress_bar_in_a_notebook_without_ipywidgets(tmp_path, monkeypatch):
    # A notebook kernel without ipywidgets gets tqdm's text bar, without tqdm.auto's
    # warning to "update jupyter and ipywidgets".
    data_dir = _install_kernelspec(tmp_path)
    monkeypatch.setenv("JUPYTER_PATH", str(data_dir))
    monkeypatch.setenv("IPYTHONDIR", str(tmp_path / "ipython"))
    source = ("import sys\n"
              "sys.modules['ipywidgets'] = None  # as where it is not installed\n"
              "from distkeras.training.monitor import BarProgress\n"
              "bar = BarProgress('ADAG', 100)\n"
              "bar.update(100, {'loss': '0.5000'})\n"
              "bar.close()")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    NotebookClient(notebook, timeout=120, kernel_name=KERNEL,
                   resources={"metadata": {"path": str(tmp_path)}}).execute()
    text = "".join(_text(output) for output in notebook.cells[0].outputs)
    assert "ADAG: 100%" in text and "100/100" in text and "loss=0.5000" in text
    assert "IProgress" not in text and "Warning" not in text
