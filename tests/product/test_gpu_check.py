"""benchmarks/gpu_check.py, as a GPU machine without Spark would run it: its bundle built
here, run from a folder of its own with tiny sizes on JAX's CPU, PySpark's modules taken
from the bundle only (no installed Spark) and no Fashion-MNIST files (synthetic data)."""

import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# No installed PySpark, py4j or pandas: the bundle's own copies, or nothing.
RUN_WITHOUT_SPARK = textwrap.dedent('''
    import importlib.machinery, runpy, sys

    bundle = sys.argv[1]

    class BundleOnly:
        def find_spec(self, name, path=None, target=None):
            if name in ("pyspark", "py4j", "pandas"):
                return importlib.machinery.PathFinder.find_spec(name, [bundle + "/src"])
            return None

    sys.meta_path.insert(0, BundleOnly())
    sys.argv = [bundle + "/gpu_check.py"] + sys.argv[2:]
    runpy.run_path(sys.argv[0], run_name="__main__")
''')


def test_the_bundled_check_runs_without_spark_and_learns(tmp_path):
    bundle = tmp_path / "bundle"
    subprocess.run([sys.executable, os.path.join(REPO, "benchmarks", "gpu_check.py"),
                    "--bundle", str(bundle)], check=True, capture_output=True)
    assert sorted(os.listdir(bundle / "src")) == ["distkeras", "py4j", "pyspark"]
    assert not (bundle / "src" / "pyspark" / "jars").exists()
    env = {name: value for name, value in os.environ.items()
           if name not in ("PYTHONPATH", "SPARK_HOME", "JAVA_HOME")}
    env["KERAS_BACKEND"] = "jax"
    results = tmp_path / "results.json"
    done = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_SPARK, str(bundle), "--rows", "400", "--epochs",
         "2", "--batch-size", "50", "--data", str(tmp_path / "none"), "--json", str(results)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "synthetic" in done.stdout and "device: cpu" in done.stdout
    assert f"distkeras from {bundle / 'src' / 'distkeras'}" in done.stdout
    found = json.loads(results.read_text())
    assert [(run["model"], run["run"]) for run in found["runs"]] == [
        ("mlp", "fit"), ("mlp", "worker"), ("cnn", "fit"), ("cnn", "worker")]
    for run in found["runs"]:
        assert run["samples_per_s"] > 0
        # 10 classes: chance is 0.1. The CNN's BatchNormalization statistics are still
        # far from the data's after 16 steps: it learns, but tests worse than the MLP.
        assert run["accuracy"] > (0.8 if run["model"] == "mlp" else 0.2), run
