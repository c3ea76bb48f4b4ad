"""Elephas's side of benchmarks/elephas.py: Fashion-MNIST MLP with elephas on local Spark.

Runs inside ``.venv-elephas`` (elephas, TensorFlow, PySpark 4.0, numpy 1.x) and imports
nothing from distkeras. For each elephas mode and epoch count it trains the 784-500-500-10
MLP (Adam, batch 32) with 2 workers, times the ``fit`` call and measures test accuracy,
then writes the results as JSON.

    .venv-elephas/bin/python benchmarks/elephas_run.py --output results.json \
        [--epochs 1 3] [--limit N] [--modes synchronous asynchronous-epoch asynchronous-batch]
"""

import argparse
import gzip
import json
import logging
import os
import socket
import struct
import sys
import time
import traceback
from importlib.metadata import version

# This script's folder holds benchmarks/elephas.py, which would shadow the elephas package.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.abspath(entry or ".") != HERE]

DATA_DIR = "/usr/share/datasets/fashion-mnist"
FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
MODES = ("synchronous", "asynchronous-epoch", "asynchronous-batch")
NUM_WORKERS = 2
BATCH_SIZE = 32


def read_idx(path):
    """Reads an unsigned-byte IDX file (the MNIST format), gzipped or not, into numpy.

    distkeras.datasets.read_idx's logic, narrowed to the one element type Fashion-MNIST
    uses: this venv has no distkeras (and must not import it).
    """
    import numpy as np

    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if data[:3] != b"\x00\x00\x08":
        raise ValueError(f"{path} is not an unsigned-byte IDX file (magic {data[:4]!r}).")
    ndim = data[3]
    shape = struct.unpack(f">{ndim}I", data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_split(split, limit=None):
    """Images as float32 rows in [0, 1], one-hot float32 labels and the integer labels."""
    import numpy as np

    folder = os.environ.get("DISTKERAS_FASHION_MNIST_DIR", DATA_DIR)
    images_file, labels_file = FILES[split]
    images = read_idx(os.path.join(folder, images_file))[:limit]
    labels = read_idx(os.path.join(folder, labels_file))[:limit]
    x = images.reshape(len(images), -1).astype("float32") / 255.0
    y = np.eye(10, dtype="float32")[labels]
    return x, y, labels


def start_spark(master, tf_threads):
    """A local SparkContext on 127.0.0.1 whose executors use this venv's Python."""
    # elephas's parameter server and its clients find the driver through SPARK_LOCAL_IP.
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    builder = (SparkSession.builder.master(master).appName("elephas-benchmark")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               # to_simple_rdd ships the 60,000 images from the driver (about 190 MB).
               .config("spark.driver.memory", "3g")
               .config("spark.executorEnv.TF_CPP_MIN_LOG_LEVEL", "2"))
    if tf_threads:
        # local[2] already runs one worker per core; distkeras's workers get one XLA
        # thread each, so TensorFlow's get the same (TF reads these at start-up).
        for name in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
            builder = builder.config(f"spark.executorEnv.{name}", str(tf_threads))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark.sparkContext


def _import_tensorflow(partition):
    import numpy as np
    import tensorflow as tf

    import elephas.worker  # noqa: F401  (what the training tasks import)

    model = tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.train_on_batch(np.zeros((1, 2), "float32"), np.zeros((1, 1), "float32"))
    yield f"{os.getpid()}:{sum(1 for _ in partition)}"


def warm_up_executors(sc, tasks):
    """Imports TensorFlow in the executors' Python workers before any timing.

    distkeras's benchmark does the same (its warm_up_executors); Spark then reuses the
    warmed Python workers for the training jobs.
    """
    return sc.parallelize(range(tasks), tasks).mapPartitions(_import_tensorflow).collect()


def build_model():
    """The 784-500-500-10 MLP, compiled with Adam at its default learning rate."""
    import tensorflow as tf

    model = tf.keras.Sequential([
        tf.keras.Input((784,)),
        tf.keras.layers.Dense(500, activation="relu"),
        tf.keras.layers.Dense(500, activation="relu"),
        tf.keras.layers.Dense(10, activation="softmax"),
    ], name="mlp_784_500_500_10")
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    return model


def free_port():
    """A TCP port free on 127.0.0.1 now, for one parameter server."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spark_model(mode):
    """The elephas model for ``mode`` (one of MODES) around a fresh compiled MLP."""
    from elephas.spark_model import AsynchronousSparkModel, SparkModel

    if mode == "synchronous":
        return SparkModel(build_model(), num_workers=NUM_WORKERS, batch_size=BATCH_SIZE)
    frequency = mode.split("-")[1]
    return AsynchronousSparkModel(build_model(), num_workers=NUM_WORKERS,
                                  batch_size=BATCH_SIZE, mode="asynchronous",
                                  frequency=frequency, parameter_server_mode="http",
                                  port=free_port())


def run_one(rdd, mode, epochs, samples, test):
    """Trains once; wall time of ``fit`` only, samples per second and test accuracy."""
    model = spark_model(mode)
    start = time.perf_counter()
    model.fit(rdd, epochs=epochs, batch_size=BATCH_SIZE, verbose=0)
    seconds = time.perf_counter() - start
    x_test, _, labels = test
    predictions = model.master_network.predict(x_test, batch_size=1024, verbose=0)
    return {"wall_s": seconds, "samples_per_s": samples * epochs / seconds,
            "test_accuracy": float((predictions.argmax(axis=1) == labels).mean())}


def versions():
    """The versions of the packages the results depend on."""
    import numpy
    import pyspark
    import tensorflow as tf

    return {"elephas": version("elephas"), "tensorflow": tf.__version__,
            "keras": version("keras"), "pyspark": pyspark.__version__,
            "numpy": numpy.__version__, "python": sys.version.split()[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, help="JSON file for the results")
    parser.add_argument("--epochs", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--limit", type=int, default=None)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--master", default=f"local[{NUM_WORKERS}]")
    parser.add_argument("--tf-threads", type=int, default=1,
                        help="TensorFlow threads per executor (0: TensorFlow's default)")
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    # Flask logs every request of the parameter server (two per batch in batch mode).
    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    sc = start_spark(args.master, args.tf_threads)
    from elephas.utils.rdd_utils import to_simple_rdd

    warm_up_executors(sc, NUM_WORKERS)
    x, y, _ = load_split("train", args.limit)
    test = load_split("test")
    rdd = to_simple_rdd(sc, x, y).cache()
    rdd.count()  # Ship the data once, outside the timings, as distkeras's cached DataFrame.
    results = {"versions": versions(), "samples": len(x), "tf_threads": args.tf_threads,
               "runs": []}
    for mode in args.modes:
        for epochs in args.epochs:
            run = {"mode": mode, "epochs": epochs}
            try:
                run.update(run_one(rdd, mode, epochs, len(x), test))
            except Exception as error:  # noqa: BLE001  (reported in the doc, not hidden)
                run["error"] = f"{type(error).__name__}: {error}"
                run["traceback"] = traceback.format_exc()[-4000:]
            print(json.dumps(run), flush=True)
            results["runs"].append(run)
            with open(args.output, "w", encoding="utf-8") as handle:
                json.dump(results, handle, indent=2)
    sc.stop()


if __name__ == "__main__":
    main()
