"""Training throughput on local Spark against plain Keras, in one run.

Plain ``keras.Model.fit`` in the driver, SingleTrainer, and ADAG with 1 and 2 workers, on
the same data (Fashion-MNIST, 60,000 images), model (784-500-500-10), batch (32), optimizer
(Adam) and backend. Reports samples per second over the whole ``train()`` call (Spark job,
model rebuild and compilation included) and over the training steps alone (first to last
step of each worker), and test accuracy.

    python benchmarks/training.py [--limit N] [--window 12] [--repeat 2]

``--cores N`` runs everything (driver, JVM, executors) on the first N cores only, and
``--json FILE`` writes the results instead of the doc section: `benchmarks/scaling.py`
uses both to compare 1 worker on 1 core with 2 workers on 2 cores.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

FIT = "keras.Model.fit (driver, 1 process)"
RUNS = ("fit", "single", "adag1", "adag2", "adag2-overlap", "single-packed", "adag1-packed",
        "adag2-packed")
PACKED = ", packed features"


def steps_rate(trainer):
    """Samples per second of the steps between the first and the last record of each worker.

    A window of steps is recorded at its end with one timestamp, so the first window's
    steps ran before the span starts: only the samples recorded after it count (counting
    them all overstated the rate by that window's samples, several times over for a small
    ``--limit``). None where no worker recorded two moments (one window each): no span.
    """
    samples, spans = 0, []
    for worker in {record["worker_id"] for record in trainer.get_history()}:
        records = trainer.get_executor_history(worker)
        first = records[0]["timestamp"]
        samples += sum(record["batch_size"] for record in records
                       if record["timestamp"] > first)
        spans.append(records[-1]["timestamp"] - first)
    return samples / max(spans) if max(spans) > 0 else None


def _rate(value):
    return "-" if value is None else f"{value:.0f}"


def _ratio(numerator, denominator):
    return "-" if numerator is None or denominator is None else f"{numerator / denominator:.2f}"


def measure(runs, window, repeat, limit):
    """Runs each of ``runs`` ``repeat`` times; the best (whole, steps, accuracy) of each."""
    import report

    spark, train, (test_images, test_labels) = report.fashion_mnist_setup(limit=limit)
    import numpy as np

    from distkeras.datasets import load_fashion_mnist, load_fashion_mnist_numpy
    from distkeras.trainers import ADAG, SingleTrainer
    from fashion_mnist import build_mlp, test_accuracy

    samples = train.count()
    # The same rows, features stored as binary float32 (`distkeras.data.tensors`).
    packed = load_fashion_mnist(train.sparkSession, "train", limit=limit, num_partitions=2,
                                packed=True).cache()
    packed.count()
    images, labels = load_fashion_mnist_numpy("train")
    x = images[:samples].reshape(samples, -1).astype("float32") / 255.0
    y = np.eye(10, dtype="float32")[labels[:samples]]
    common = dict(worker_optimizer="adam", loss="categorical_crossentropy",
                  metrics=["accuracy"], batch_size=32)
    makers = {
        "single": ("SingleTrainer", lambda: SingleTrainer(build_mlp(), **common)),
        "adag1": (f"ADAG, 1 worker, window {window}", lambda: ADAG(
            build_mlp(), num_workers=1, communication_window=window, **common)),
        "adag2": (f"ADAG, 2 workers, window {window}", lambda: ADAG(
            build_mlp(), num_workers=2, communication_window=window, **common)),
        "adag2-overlap": (f"ADAG, 2 workers, window {window}, overlap_communication",
                          lambda: ADAG(build_mlp(), num_workers=2, communication_window=window,
                                       overlap_communication=True, **common)),
    }
    for key in ("single", "adag1", "adag2"):
        makers[f"{key}-packed"] = (makers[key][0] + PACKED, makers[key][1])
    best = {}
    for _ in range(repeat):
        if "fit" in runs:
            model = build_mlp()
            model.compile(optimizer="adam", loss="categorical_crossentropy",
                          metrics=["accuracy"])
            model.fit(x[:320], y[:320], batch_size=32, verbose=0)  # compile outside timing
            start = time.perf_counter()
            model.fit(x, y, batch_size=32, epochs=1, verbose=0)
            rate = samples / (time.perf_counter() - start)
            result = (rate, rate, test_accuracy(model, test_images, test_labels))
            best[FIT] = max(best.get(FIT, result), result, key=lambda run: run[0])
        for key in runs:
            if key == "fit":
                continue
            name, make = makers[key]
            trainer = make()
            trained = trainer.train(packed if key.endswith("-packed") else train, verbose=0)
            result = (samples / trainer.get_training_time(), steps_rate(trainer),
                      test_accuracy(trained, test_images, test_labels))
            best[name] = max(best.get(name, result), result, key=lambda run: run[0])
    spark.stop()
    return samples, best


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--window", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=2, help="runs of each, best kept")
    parser.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
    parser.add_argument("--cores", type=int, default=None,
                        help="run everything on the first N cores only")
    parser.add_argument("--json", default=None, help="write the results to this file")
    args = parser.parse_args()
    if args.cores:
        # Before Spark starts: the JVM and every Python worker inherit the restriction.
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:args.cores])
    samples, best = measure(args.runs, args.window, args.repeat, args.limit)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump({"samples": samples, "results": best}, handle)
        return
    import report

    # Any subset of the runs may be asked for: a ratio needs both of its runs.
    fit_rate = best[FIT][0] if FIT in best else None
    rows = [[name, _rate(whole), _rate(steps), _ratio(whole, fit_rate), f"{accuracy:.4f}"]
            for name, (whole, steps, accuracy) in best.items()]
    one = best.get(f"ADAG, 1 worker, window {args.window}", (None,))[0]
    two = best.get(f"ADAG, 2 workers, window {args.window}", (None,))[0]
    workers_line = (f"\n\nADAG 2 workers / 1 worker (whole train()): {two / one:.2f}x."
                    if one and two else "")
    body = (f"{samples} samples, 1 epoch, batch 32, Adam; best of {args.repeat} runs; "
            "`local[2]`, executors warmed up before timing. Rows marked \"packed features\" "
            "train on the same rows with the features stored as binary float32 "
            "(`load_fashion_mnist(packed=True)`), the others on `array<float>`.\n\n"
            + report.table(["run", "samples/s (whole train())", "samples/s (steps only)",
                            "ratio to fit", "test accuracy"], rows)
            + workers_line)
    report.write_section(f"Training throughput against keras.Model.fit (window {args.window})",
                         body)


if __name__ == "__main__":
    main()
