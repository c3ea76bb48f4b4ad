"""Several epochs: the first read from Spark, the later ones replayed from local disk.

Trains the 784-500-500-10 MLP for 3 epochs on the full Fashion-MNIST training set (packed
features, 2 even partitions, executors warmed) with SingleTrainer and ADAG (2 workers,
window 6), ``--repeat`` times in turns, and reports each epoch's samples per second from
the per-step history (each worker reads its partition from Spark in epoch 1 and replays
it from the executor's local disk in the later ones, see `distkeras.executor.epochs`), the wall
time and the test accuracy.

    python benchmarks/epochs.py [--repeat 2] [--limit N]
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

EPOCHS = 3


def epoch_rates(history):
    """Per epoch, its samples over the time from its first step to its last (all workers)."""
    rates = []
    for epoch in range(EPOCHS):
        records = [record for record in history if record.get("epoch", 0) == epoch]
        times = [record["timestamp"] for record in records]
        samples = sum(record["batch_size"] for record in records)
        span = max(times) - min(times)
        # One window an epoch (a small --limit) has one timestamp: no rate, NaN.
        rates.append(samples / span if span > 0 else float("nan"))
    return rates


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--limit", type=int, default=None,
                        help="train on the first N images only (default: all 60,000)")
    args = parser.parse_args()
    import report

    spark, frame, test = report.fashion_mnist_setup("local[2]", limit=args.limit, packed=True)
    from fashion_mnist import build_mlp

    from distkeras.trainers import ADAG, SingleTrainer

    def single():
        return SingleTrainer(build_mlp(), "adam", "categorical_crossentropy",
                             num_epoch=EPOCHS)

    def adag():
        return ADAG(build_mlp(), "adam", "categorical_crossentropy", num_workers=2,
                    communication_window=6, num_epoch=EPOCHS)

    images, labels = test
    results = {"SingleTrainer": [], "ADAG, 2 workers, window 6": []}
    for _ in range(args.repeat):
        for name, make in zip(results, (single, adag)):
            trainer = make()
            model = trainer.train(frame, verbose=0)
            accuracy = float((model.predict(images, batch_size=1000, verbose=0).argmax(1)
                              == labels).mean())
            results[name].append((trainer.get_training_time(),
                                  epoch_rates(trainer.get_history()), accuracy))
    rows = []
    for name, runs in results.items():
        best = min(runs, key=lambda run: run[0])
        rows.append([name, f"{best[0]:.1f}", *(f"{rate:,.0f}" for rate in best[1]),
                     f"{best[1][1] / best[1][0]:.2f}", f"{statistics.median(r[2] for r in runs):.4f}"])
    body = (f"{frame.count()} training images, packed, in 2 even partitions; best of "
            f"{args.repeat} runs (by wall time); accuracy: the median, on the 10,000 "
            "test images.\n\n" + report.table(
                ["trainer", "wall s (3 epochs)", "epoch 1 samples/s (from Spark)",
                 "epoch 2 samples/s (replayed)", "epoch 3 samples/s (replayed)",
                 "epoch 2 / epoch 1", "test accuracy"], rows))
    report.write_section("Several epochs: replayed from local disk", body)
    spark.stop()


if __name__ == "__main__":
    main()
