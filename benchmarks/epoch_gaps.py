"""Where SingleTrainer's time goes around epoch ends, with and without validation.

For each zoo model: SingleTrainer's wall time, the time to its first step, each epoch's
span (its first to its last step) and the gap between one epoch's last step and the next
one's first (where the worker waits while the driver validates and calls back), from the
worker's step records; and `fit`'s wall time for the same epochs, in the same process.

    python benchmarks/epoch_gaps.py [--models cnn mlp] [--epochs 4] [--limit 6000]
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

import zoo  # noqa: E402


def epoch_times(records):
    """Each epoch's span and the gaps between epochs, in seconds, from step records."""
    stamps = {}
    for record in records:
        stamps.setdefault(record["epoch"], []).append(record["timestamp"])
    epochs = sorted(stamps)
    spans = [max(stamps[e]) - min(stamps[e]) for e in epochs]
    gaps = [min(stamps[b]) - max(stamps[a]) for a, b in zip(epochs, epochs[1:])]
    return min(stamps[epochs[0]]), spans, gaps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["cnn"], choices=zoo.MODELS)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--limit", type=int, default=6000)
    parser.add_argument("--validation", type=int, default=2000)
    args = parser.parse_args()
    from distkeras.session import local_spark_session, warm_up_executors

    spark = local_spark_session("local[2]")
    warm_up_executors(spark, 2)
    import keras

    from distkeras import trainers

    def fresh(kind):
        keras.backend.clear_session()
        keras.utils.set_random_seed(1)
        return zoo.build_model(kind)

    for kind in args.models:
        frame, ((x, y), validation, _) = zoo.load(spark, kind, args.limit, args.validation)
        for validating in (False, True):
            extra = {"validation_data": validation} if validating else {}
            model = fresh(kind)
            model.compile(optimizer="adam", loss="categorical_crossentropy",
                          metrics=["accuracy"])
            start = time.perf_counter()
            model.fit(x, y, batch_size=32, epochs=args.epochs, verbose=0, **extra)
            fit_seconds = time.perf_counter() - start
            trainer = trainers.SingleTrainer(
                keras_model=fresh(kind), worker_optimizer="adam",
                loss="categorical_crossentropy", metrics=["accuracy"], batch_size=32,
                num_epoch=args.epochs, features_col="features", label_col="label")
            start = time.time()
            trainer.train(frame, verbose=0, **extra)
            seconds = time.time() - start
            first, spans, gaps = epoch_times(trainer.get_history())
            print(f"{kind:9} validation={str(validating):5} fit {fit_seconds:5.1f} s  "
                  f"single {seconds:5.1f} s ({seconds / fit_seconds:.2f}x)  first step "
                  f"{first - start:.2f} s  epochs {' '.join(f'{s:.2f}' for s in spans)}  "
                  f"gaps {' '.join(f'{g:.2f}' for g in gaps)}", flush=True)
        frame.unpersist()


if __name__ == "__main__":
    main()
