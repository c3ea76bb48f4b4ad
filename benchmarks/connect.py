"""The same trainings from a classic session and from a Spark Connect client, side by side.

Fashion-MNIST's MLP 784-500-500-10 (Adam, batch 32) on the first ``--limit`` training
images, 2 workers, tested on the 10,000 test images: SingleTrainer, ADAG, DOWNPOUR (under
Connect their server runs in the Spark job, in classic mode on the driver) and
AllReduceTrainer; then ModelPredictor's predictions against ``model.predict`` on 1,000
test images. Each mode runs in its own process (one mode per Python process), on
``local[2]``.

    python benchmarks/connect.py [--limit 12000] [--epochs 2] [--json PATH]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

TRAINERS = ("SingleTrainer", "ADAG", "DOWNPOUR", "AllReduceTrainer")


def session(mode):
    """A ``local[2]`` session of ``mode``: classic, or a Connect client of a local server."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("KERAS_BACKEND", "jax")  # before Keras loads, in both modes
    if mode == "classic":
        from distkeras.session import local_spark_session

        return local_spark_session("local[2]")
    from pyspark.sql import SparkSession

    return SparkSession.builder.remote("local[2]").getOrCreate()


def build_mlp():
    import keras

    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(500, activation="relu"),
                             keras.layers.Dense(500, activation="relu"),
                             keras.layers.Dense(10, activation="softmax")])


def run_mode(mode, limit, epochs):
    """Trains each of `TRAINERS` from a session of ``mode``; returns the measurements."""
    spark = session(mode)
    import keras
    import numpy as np

    from distkeras import trainers
    from distkeras.datasets import load_fashion_mnist, load_fashion_mnist_numpy
    from distkeras.predictors import ModelPredictor

    train = load_fashion_mnist(spark, "train", limit=limit, num_partitions=2).cache()
    train.count()
    images, labels = load_fashion_mnist_numpy("test")
    images = images.reshape(len(images), -1).astype("float32") / 255.0
    results = []
    for name in TRAINERS:
        keras.utils.set_random_seed(1)
        common = dict(worker_optimizer="adam", loss="categorical_crossentropy",
                      batch_size=32, num_epoch=epochs, label_col="label")
        if name != "SingleTrainer":
            common["num_workers"] = 2
        trainer = getattr(trainers, name)(build_mlp(), **common)
        started = time.perf_counter()
        model = trainer.train(train, verbose=0)
        seconds = time.perf_counter() - started
        accuracy = float((model.predict(images, batch_size=1024, verbose=0).argmax(1)
                          == labels).mean())
        results.append({"mode": mode, "trainer": name, "test_accuracy": accuracy,
                        "seconds": seconds})
    test = load_fashion_mnist(spark, "test", limit=1000, num_partitions=2)
    rows = ModelPredictor(model, "features").predict(test).select(
        "features", "prediction").collect()  # rows in any order: each with its features
    predicted = np.array([row.prediction for row in rows], dtype="float32")
    expected = model.predict(np.array([row.features for row in rows], dtype="float32"),
                             verbose=0)
    results.append({"mode": mode, "trainer": "ModelPredictor",
                    "max_abs_difference": float(np.abs(predicted - expected).max())})
    spark.stop()
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=12000, help="training images")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--mode", choices=("both", "classic", "connect"), default="both")
    parser.add_argument("--json", default=None, help="write the measurements here")
    args = parser.parse_args(argv)
    if args.mode != "both":
        results = run_mode(args.mode, args.limit, args.epochs)
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle)
        return results
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for mode in ("classic", "connect"):
            path = os.path.join(folder, f"{mode}.json")
            subprocess.run([sys.executable, __file__, "--mode", mode, "--limit",
                            str(args.limit), "--epochs", str(args.epochs), "--json", path],
                           check=True)
            with open(path, encoding="utf-8") as handle:
                results += json.load(handle)
    by = {(r["mode"], r["trainer"]): r for r in results}
    print(f"{'trainer':<18}{'classic acc':>12}{'connect acc':>12}{'classic s':>11}"
          f"{'connect s':>11}")
    for name in TRAINERS:
        classic, connect = by[("classic", name)], by[("connect", name)]
        print(f"{name:<18}{classic['test_accuracy']:>12.4f}{connect['test_accuracy']:>12.4f}"
              f"{classic['seconds']:>11.1f}{connect['seconds']:>11.1f}")
    for mode in ("classic", "connect"):
        print(f"ModelPredictor ({mode}): max |prediction - model.predict| = "
              f"{by[(mode, 'ModelPredictor')]['max_abs_difference']:.2e}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)
    return results


if __name__ == "__main__":
    main()
