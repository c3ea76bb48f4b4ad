"""A check of distkeras on one GPU, without Spark, Java or a network.

Trains the zoo's MLP and CNN (`zoo.build_model`) two ways on the machine's first device:
Keras's own `fit`, and the executor's step loop (the `SequentialWorker` a SingleTrainer's
Spark task runs, `Worker.run`), fed Arrow record batches of ``list<float>`` columns as a
``mapInArrow`` task feeds it. Prints, per run, the samples/s of the epochs after the first
(which holds the compiles) and the test accuracy, and the device JAX trained on.

Data: Fashion-MNIST's IDX files from ``--data`` (default: Debian's folder); where they are
missing, synthetic images of 10 classes, and the output says so.

On a machine with JAX (CUDA) and pyarrow only, build a bundle here, copy it there, run it:

    python benchmarks/gpu_check.py --bundle /tmp/gpu-check [--wheels] [--python-version 3.12]
    # there:
    python /tmp/gpu-check/gpu_check.py [--rows 12000] [--epochs 3] [--json out.json]

The bundle holds this script, `zoo.py`, distkeras's source and PySpark's Python modules
(``src/``, 30 MB: no jars, no Java needed) and, with
``--wheels``, Keras and its dependencies as wheels (``wheels/``, downloaded here by pip for
``--python-version``), installed there into ``site/`` on the first run, offline.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FASHION = "/usr/share/datasets/fashion-mnist"


def use_bundle(folder=HERE):
    """Puts a bundle's distkeras source and its Keras (installed offline from its wheels on
    the first run) ahead on ``sys.path``; a checkout's own modules are used as they are."""
    sys.path.insert(0, folder)
    source = os.path.join(folder, "src")
    if os.path.isdir(source):
        sys.path.insert(0, source)
    site, wheels = os.path.join(folder, "site"), os.path.join(folder, "wheels")
    if os.path.isdir(wheels) and not os.path.isdir(site):
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-index", "--quiet",
                        "--find-links", wheels, "--target", site, "keras"], check=True)
    if os.path.isdir(site):
        sys.path.append(site)  # last: the machine's own numpy and ml_dtypes (JAX's) win
    if "src" not in os.listdir(folder) and os.path.basename(folder) == "benchmarks":
        sys.path.insert(0, os.path.dirname(folder))  # a checkout: its distkeras


def build_bundle(folder, wheels, python_version=None):
    """Writes the bundle `use_bundle` reads: this script, zoo.py, distkeras's source and,
    with ``wheels``, Keras's wheels for ``python_version`` (pip, with a network)."""
    import distkeras

    os.makedirs(folder, exist_ok=True)
    for name in ("gpu_check.py", "zoo.py"):
        shutil.copy(os.path.join(HERE, name), folder)
    target = os.path.join(folder, "src", "distkeras")
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(os.path.dirname(distkeras.__file__), target,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # PySpark's Python modules, which distkeras's executor side imports (types, cloudpickle),
    # without Spark itself (its jars and scripts): nothing here starts Java.
    import py4j
    import pyspark

    for module, skipped in ((pyspark, ("jars", "bin", "sbin", "examples", "data", "licenses",
                                       "python", "tests")), (py4j, ())):
        target = os.path.join(folder, "src", module.__name__)
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(os.path.dirname(module.__file__), target,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", *skipped))
    if wheels:
        import keras

        command = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:",
                   "--dest", os.path.join(folder, "wheels"), f"keras=={keras.__version__}"]
        if python_version:
            command += ["--python-version", python_version,
                        "--platform", "manylinux_2_28_x86_64"]
        subprocess.run(command, check=True)
    return folder


def fashion(folder, rows):
    """(train images, train labels, test images, test labels) uint8, and where they came
    from: Fashion-MNIST's files in ``folder``, else synthetic images of 10 classes."""
    import numpy as np

    names = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
             "t10k-labels-idx1-ubyte"]
    if folder and all(os.path.exists(os.path.join(folder, name + ".gz")) or
                      os.path.exists(os.path.join(folder, name)) for name in names):
        from distkeras.data.datasets import load_fashion_mnist_numpy

        images, labels = load_fashion_mnist_numpy("train", folder)
        test_images, test_labels = load_fashion_mnist_numpy("test", folder)
        return (images[:rows], labels[:rows], test_images, test_labels), \
            f"Fashion-MNIST from {folder}"
    rng = np.random.default_rng(0)
    templates = rng.uniform(0, 255, size=(10, 28, 28))

    def draw(count):
        labels = rng.integers(0, 10, count)
        noisy = templates[labels] + rng.normal(0, 90, size=(count, 28, 28))
        return np.clip(noisy, 0, 255).astype("uint8"), labels.astype("uint8")

    return (*draw(rows), *draw(max(rows // 5, 100))), \
        f"synthetic (no Fashion-MNIST files in {folder})"


def arrow_batches(x, y, rows_per_batch):
    """The rows as a ``mapInArrow`` task gets them: ``list<float>`` columns, in batches."""
    import pyarrow as pa

    def lists(values):
        flat = values.reshape(len(values), -1).astype("float32")
        offsets = pa.array(range(0, flat.size + 1, flat.shape[1]), pa.int32())
        return pa.ListArray.from_arrays(offsets, pa.array(flat.ravel()))

    return [pa.RecordBatch.from_arrays([lists(x[start:start + rows_per_batch]),
                                        lists(y[start:start + rows_per_batch])],
                                       names=["features", "label"])
            for start in range(0, len(x), rows_per_batch)]


def _accuracy(model, x, labels):
    return float((model.predict(x, batch_size=1000, verbose=0).argmax(1) == labels).mean())


def fit_run(kind, data, epochs, batch_size):
    """Keras's `fit`: samples/s of the epochs after the first, test accuracy."""
    import keras
    import zoo

    x, y, x_test, labels = data
    keras.utils.set_random_seed(1)
    model = zoo.build_model(kind)
    model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
    ends = []
    clock = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: ends.append(time.perf_counter()))
    model.fit(x, y, batch_size=batch_size, epochs=epochs, verbose=0, callbacks=[clock])
    rate = len(x) * (epochs - 1) / (ends[-1] - ends[0]) if epochs > 1 else None
    return rate, _accuracy(model, x_test, labels)


def worker_run(kind, data, epochs, batch_size):
    """The executor's step loop (`SequentialWorker.run`) over Arrow batches: samples/s
    of the epochs after the first, from its step records, and test accuracy."""
    import keras
    import numpy as np
    import zoo

    from distkeras import workers
    from distkeras.data.feed import FEED_RECORDS_PER_BATCH
    from distkeras.executor.epochs import EPOCH_END
    from distkeras.keras_io.archives import serialize_model
    from distkeras.transport.history_messages import unpack_history

    x, y, x_test, labels = data
    keras.utils.set_random_seed(1)
    model = zoo.build_model(kind)
    worker = workers.SequentialWorker(
        serialize_model(model), optimizer="adam", loss="categorical_crossentropy",
        metrics=["accuracy"], features_col="features", label_col="label",
        batch_size=batch_size, num_epoch=epochs)
    batches = arrow_batches(x, y, FEED_RECORDS_PER_BATCH)

    def replayed():  # the epochs as `epochs.Replay` hands them to the worker
        for epoch in range(epochs):
            if epoch:
                yield EPOCH_END
            yield from batches

    message = worker.run(0, replayed(), [(10,)])
    steps = unpack_history(message)
    epoch, stamps = np.asarray(steps["epoch"]), np.asarray(steps["timestamp"])
    later = epoch >= 1
    rate = None
    if later.any() and (~later).any():
        span = stamps.max() - stamps[~later].max()
        rate = float(np.sum(np.asarray(steps["batch_size"])[later])) / span if span else None
    model.compile(loss="categorical_crossentropy")
    model.set_weights(message["weights"])
    return rate, _accuracy(model, x_test, labels)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", metavar="DIR", help="write the bundle to DIR and stop")
    parser.add_argument("--wheels", action="store_true", help="put Keras's wheels in it")
    parser.add_argument("--python-version", help="the GPU machine's Python, e.g. 3.12")
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"], choices=["mlp", "cnn"])
    parser.add_argument("--rows", type=int, default=12000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--data", default=FASHION, help="folder of Fashion-MNIST's IDX files")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args(argv)
    use_bundle()
    if args.bundle:
        print("bundle:", build_bundle(args.bundle, args.wheels, args.python_version))
        return None
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import numpy as np
    import zoo

    import distkeras

    (images, labels, test_images, test_labels), source = fashion(args.data, args.rows)
    device = jax.devices()[0]
    print(f"device: {device.platform} {device.device_kind}; jax {jax.__version__}; "
          f"data: {source}; {len(images)} training rows, {args.epochs} epochs, "
          f"batch {args.batch_size}; distkeras from {os.path.dirname(distkeras.__file__)}",
          flush=True)
    results = {"device": f"{device.platform} {device.device_kind}", "data": source,
               "rows": len(images), "epochs": args.epochs, "runs": []}
    for kind in args.models:
        data = (zoo.arrange(kind, images), np.eye(10, dtype="float32")[labels],
                zoo.arrange(kind, test_images), test_labels)
        for name, run in (("fit", fit_run), ("worker", worker_run)):
            start = time.perf_counter()
            rate, accuracy = run(kind, data, args.epochs, args.batch_size)
            seconds = time.perf_counter() - start
            results["runs"].append({"model": kind, "run": name, "samples_per_s": rate,
                                    "accuracy": accuracy, "seconds": seconds})
            shown = "-" if rate is None else f"{rate:,.0f}"
            print(f"{kind:4} {name:6} samples/s {shown:>10}  accuracy {accuracy:.3f}  "
                  f"({seconds:.1f} s)", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(results, file, indent=1)
    return results


if __name__ == "__main__":
    main()
