"""The Keras backends side by side: keras.Model.fit, SingleTrainer and ADAG on each.

For each backend (JAX, torch, tensorflow; `scripts/setup.sh --backends` installs the other
two) a process of its own trains the 784-500-500-10 MLP on the full Fashion-MNIST training
set (packed features, 2 even cached partitions, executors warmed), 1 epoch, batch 32, Adam:
plain ``fit`` on the driver, SingleTrainer, and ADAG on 2 workers (window 12). Prints and
writes samples per second and test accuracy.

    python benchmarks/backends.py [--backends jax torch tensorflow] [--limit N]
"""

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))


def measure(limit=None):
    """In the backend's own process: one JSON line of results."""
    import report

    spark, frame, (images, labels) = report.fashion_mnist_setup("local[2]", limit=limit,
                                                                packed=True)
    import keras
    import numpy as np
    from fashion_mnist import build_mlp

    from distkeras.datasets import load_fashion_mnist_numpy
    from distkeras.trainers import ADAG, SingleTrainer

    def accuracy(model):
        return float(np.mean(model.predict(images, batch_size=1024, verbose=0).argmax(1)
                             == labels))

    results = {"backend": keras.backend.backend()}
    x, y = load_fashion_mnist_numpy("train")
    x = x[:limit].reshape(len(x[:limit]), -1).astype("float32") / 255.0
    y = np.eye(10, dtype="float32")[y[:limit]]
    results["samples"] = len(x)
    model = build_mlp()
    model.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
    started = time.time()
    model.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    results["fit"] = {"rate": len(x) / (time.time() - started), "accuracy": accuracy(model)}
    common = dict(worker_optimizer="adam", loss="categorical_crossentropy",
                  metrics=["accuracy"])
    for name, trainer in (("single", SingleTrainer(build_mlp(), **common)),
                          ("adag2", ADAG(build_mlp(), num_workers=2, communication_window=12,
                                         **common))):
        trained = trainer.train(frame, verbose=0)
        results[name] = {"rate": len(x) / trainer.get_training_time(),
                         "accuracy": accuracy(trained)}
    spark.stop()
    sys.stdout.write(json.dumps(results) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["jax", "torch", "tensorflow"])
    parser.add_argument("--limit", type=int, default=None,
                        help="train on the first N images only (default: all 60,000)")
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        measure(args.limit)
        return
    rows = []
    limit = ["--limit", str(args.limit)] if args.limit else []
    for backend in args.backends:
        run = subprocess.run([sys.executable, __file__, "--measure", *limit],
                             capture_output=True, text=True,
                             env={**os.environ, "KERAS_BACKEND": backend})
        if run.returncode != 0:
            raise SystemExit(f"{backend} failed:\n{run.stderr[-3000:]}")
        result = json.loads(run.stdout.strip().splitlines()[-1])
        fit = result["fit"]["rate"]
        for key, label in (("fit", "keras.Model.fit (driver)"), ("single", "SingleTrainer"),
                           ("adag2", "ADAG, 2 workers, window 12")):
            rows.append([backend, label, f"{result[key]['rate']:.0f}",
                         f"{result[key]['rate'] / fit:.2f}",
                         f"{result[key]['accuracy']:.4f}"])
    import report

    body = (f"{result['samples']} samples, 1 epoch, batch 32, Adam; `local[2]`, packed "
            "features in 2 even cached partitions, executors warmed; one run each, every "
            "backend in its own process. Samples per second over the whole `train()` (fit: "
            "the whole `fit`); the ratio is to the same backend's `fit`. On JAX the workers "
            "run a window of steps per compiled call (`distkeras/executor/jax_steps.py`); on torch "
            "and tensorflow they call Keras's `train_on_batch` step by step.\n\n"
            + report.table(["backend", "run", "samples/s", "ratio to fit", "test accuracy"],
                           rows))
    # This process trains nothing: the line names the backends its children measured.
    report.write_section("Keras backends side by side", body, backend=", ".join(args.backends))


if __name__ == "__main__":
    main()
