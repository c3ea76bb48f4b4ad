"""Training throughput on local Spark against plain Keras, in one run.

Plain ``keras.Model.fit`` in the driver, SingleTrainer, and ADAG with 1 and 2 workers, on
the same data (Fashion-MNIST, 60,000 images), model (784-500-500-10), batch (32), optimizer
(Adam) and backend. Reports samples per second over the whole ``train()`` call (Spark job,
model rebuild and compilation included) and over the training steps alone (first to last
step of each worker), and test accuracy.

    python benchmarks/training.py [--limit N] [--window 12]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))



def steps_rate(trainer, samples):
    """Samples per second between the first and the last recorded step of each worker."""
    history = trainer.get_history()
    workers = {record["worker_id"] for record in history}
    spans = []
    for worker in workers:
        records = trainer.get_executor_history(worker)
        spans.append(records[-1]["timestamp"] - records[0]["timestamp"])
    return samples / max(spans)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--window", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each, best kept")
    args = parser.parse_args()
    import report

    spark, train, (test_images, test_labels) = report.fashion_mnist_setup(limit=args.limit)
    import numpy as np

    from distkeras.datasets import load_fashion_mnist_numpy
    from distkeras.trainers import ADAG, SingleTrainer
    from fashion_mnist import build_mlp, test_accuracy

    samples = train.count()
    images, labels = load_fashion_mnist_numpy("train")
    x = images[:samples].reshape(samples, -1).astype("float32") / 255.0
    y = np.eye(10, dtype="float32")[labels[:samples]]

    rows, rates = [], {}
    best = {}
    for _ in range(args.repeat):
        model = build_mlp()
        model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
        model.fit(x[:320], y[:320], batch_size=32, verbose=0)  # compile outside the timing
        start = time.perf_counter()
        model.fit(x, y, batch_size=32, epochs=1, verbose=0)
        seconds = time.perf_counter() - start
        result = (samples / seconds, samples / seconds, test_accuracy(model, test_images,
                                                                       test_labels))
        best["keras.Model.fit (driver, 1 process)"] = max(
            best.get("keras.Model.fit (driver, 1 process)", result), result)
        common = dict(worker_optimizer="adam", loss="categorical_crossentropy",
                      metrics=["accuracy"], batch_size=32)
        trainers = {
            "SingleTrainer": SingleTrainer(build_mlp(), **common),
            f"ADAG, 1 worker, window {args.window}": ADAG(
                build_mlp(), num_workers=1, communication_window=args.window, **common),
            f"ADAG, 2 workers, window {args.window}": ADAG(
                build_mlp(), num_workers=2, communication_window=args.window, **common),
        }
        for name, trainer in trainers.items():
            trained = trainer.train(train)
            result = (samples / trainer.get_training_time(), steps_rate(trainer, samples),
                      test_accuracy(trained, test_images, test_labels))
            best[name] = max(best.get(name, result), result)
    fit_rate = best["keras.Model.fit (driver, 1 process)"][0]
    for name, (whole, steps, accuracy) in best.items():
        rates[name] = whole
        rows.append([name, f"{whole:.0f}", f"{steps:.0f}", f"{whole / fit_rate:.2f}",
                     f"{accuracy:.4f}"])
    one = rates[f"ADAG, 1 worker, window {args.window}"]
    two = rates[f"ADAG, 2 workers, window {args.window}"]
    body = (f"{samples} samples, 1 epoch, batch 32, Adam; best of {args.repeat} runs; "
            "`local[2]`, executors warmed up before timing.\n\n"
            + report.table(["run", "samples/s (whole train())", "samples/s (steps only)",
                            "ratio to fit", "test accuracy"], rows)
            + f"\n\nADAG 2 workers / 1 worker (whole train()): {two / one:.2f}x.")
    report.write_section(f"Training throughput against keras.Model.fit (window {args.window})",
                         body)
    spark.stop()


if __name__ == "__main__":
    main()
