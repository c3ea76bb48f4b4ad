"""The main job: Fashion-MNIST on local Spark with SingleTrainer and ADAG.

Trains an MLP 784-500-500-10 (Adam, batch 32, one epoch) on the 60,000 training images,
then reports for each trainer the test accuracy on the 10,000 test images, the training
wall time and the samples per second.

    python examples/fashion_mnist.py [--workers 2] [--epochs 1] [--limit N]
"""

import argparse
import json
import logging
import time

from distkeras.session import local_spark_session


def build_mlp():
    import keras

    return keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(500, activation="relu"),
        keras.layers.Dense(500, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ], name="mlp_784_500_500_10")


def test_accuracy(model, images, labels):
    predictions = model.predict(images, batch_size=1024, verbose=0)
    return float((predictions.argmax(axis=1) == labels).mean())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2, help="ADAG workers (default 2)")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the data (default 1)")
    parser.add_argument("--batch-size", type=int, default=32, help="minibatch size (default 32)")
    # ADAG keeps 1/window of each window's progress, so with few workers a smaller window
    # than ADAG's default (12) matches SingleTrainer's accuracy after one epoch; see
    # docs/benchmarks.md for both.
    parser.add_argument("--window", type=int, default=6,
                        help="ADAG communication window (default 6)")
    parser.add_argument("--limit", type=int, default=None,
                        help="train on the first N images only (default: all 60,000)")
    parser.add_argument("--features", choices=["packed", "array"], default="packed",
                        help="store the training features as packed float32 (binary, the "
                             "faster to read) or as array<float> (default packed)")
    parser.add_argument("--master", default=None,
                        help="Spark master (default local[WORKERS])")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    spark = local_spark_session(args.master or f"local[{max(args.workers, 1)}]")
    # Keras (and JAX) are imported only after Spark has started.
    from distkeras.datasets import load_fashion_mnist, load_fashion_mnist_numpy
    from distkeras.session import warm_up_executors
    from distkeras.trainers import ADAG, SingleTrainer

    # Start the executors' Python workers (and their Keras imports) before any timing, as
    # in a notebook session that has run a job before.
    warm_up_executors(spark, max(args.workers, 1))

    # One partition per ADAG worker, rows spread evenly (Spark's split of the Parquet file is
    # uneven, and the slowest worker sets the wall time); cached, so the shuffle that
    # evens them happens once, here, as when preparing data to train on several times.
    # Features packed as float32 bytes unless --features array: Spark hands a row's bytes
    # to the workers in one copy rather than float by float.
    train = load_fashion_mnist(spark, "train", limit=args.limit,
                               num_partitions=max(args.workers, 1),
                               packed=args.features == "packed").cache()
    num_samples = train.count()
    test_images, test_labels = load_fashion_mnist_numpy("test")
    test_images = test_images.reshape(len(test_images), -1).astype("float32") / 255.0

    common = dict(worker_optimizer="adam", loss="categorical_crossentropy",
                  metrics=["accuracy"], batch_size=args.batch_size, num_epoch=args.epochs,
                  features_col="features", label_col="label")
    trainers = {
        "SingleTrainer": SingleTrainer(keras_model=build_mlp(), **common),
        f"ADAG ({args.workers} worker{'s' if args.workers != 1 else ''})": ADAG(
            keras_model=build_mlp(), num_workers=args.workers,
            communication_window=args.window, **common),
    }
    results = []
    print(f"Fashion-MNIST: {num_samples} training images ({args.features} features), "
          f"{len(test_labels)} test images, {args.epochs} epoch(s), batch {args.batch_size}")
    print(f"{'trainer':<24}{'test accuracy':>15}{'wall time (s)':>15}{'samples/s':>12}")
    for name, trainer in trainers.items():
        model = trainer.train(train)
        seconds = trainer.get_training_time()
        accuracy = test_accuracy(model, test_images, test_labels)
        rate = num_samples * args.epochs / seconds
        results.append({"trainer": name, "test_accuracy": accuracy,
                        "training_time_s": seconds, "samples_per_s": rate})
        print(f"{name:<24}{accuracy:>15.4f}{seconds:>15.1f}{rate:>12.0f}", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    spark.stop()
    return results


if __name__ == "__main__":
    started = time.time()
    main()
    print(f"total {time.time() - started:.0f} s")
