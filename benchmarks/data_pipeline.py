"""Data pipeline: distributed prediction, the minibatch feed, and a worker's memory.

Three measures, in one run, written as one section of docs/benchmarks.md:

1. ModelPredictor on one Spark core (``local[1]``) against ``model.predict`` in the driver,
   on the 10,000 Fashion-MNIST test images and the 784-500-500-10 MLP (target: ratio of
   samples per second >= 0.8).
2. The feed's share of a worker's time per minibatch (MLP, batch 32, in one process, no
   Spark): iterating `MinibatchFeed` alone against a `SequentialWorker`'s training loop over
   the same feed (target: <= 10%).
3. Peak memory (``ru_maxrss``) of one SingleTrainer worker on a ~2 GB partition against a
   ~200 MB one, each task in a fresh Python worker (target: ratio <= 1.5).

    python benchmarks/data_pipeline.py [--large-rows 640000] [--small-rows 64000]
"""

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

from distkeras.session import local_spark_session, warm_up_executors  # noqa: E402

EXECUTOR_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"

# Run in a child process whose XLA is restricted to one thread, as the executors' is.
_ONE_THREAD_PREDICT = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from distkeras.datasets import load_fashion_mnist_numpy
from fashion_mnist import build_mlp
images, _ = load_fashion_mnist_numpy("test")
x = images.reshape(len(images), -1).astype("float32") / 255.0
model = build_mlp()
model.predict(x, batch_size=1024, verbose=0)
best = 0.0
for _ in range(2):
    start = time.perf_counter()
    model.predict(x, batch_size=1024, verbose=0)
    best = max(best, len(x) / (time.perf_counter() - start))
print(json.dumps({"rate": best}))
"""


# -- 1. prediction ----------------------------------------------------------------------

def measure_prediction(spark, repeat=2):
    from distkeras.datasets import load_fashion_mnist, load_fashion_mnist_numpy
    from distkeras.predictors import ModelPredictor
    from fashion_mnist import build_mlp

    test = load_fashion_mnist(spark, "test").cache()
    samples = test.count()
    model = build_mlp()

    spark_rate = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        (ModelPredictor(model, features_col="features", batch_size=1024).predict(test)
         .write.format("noop").mode("overwrite").save())
        spark_rate = max(spark_rate, samples / (time.perf_counter() - start))

    def identity(record_batches):
        yield from record_batches

    transfer_rate = 0.0  # the same round trip JVM -> Python -> JVM, without the model
    for _ in range(repeat):
        start = time.perf_counter()
        test.mapInArrow(identity, test.schema).write.format("noop").mode("overwrite").save()
        transfer_rate = max(transfer_rate, samples / (time.perf_counter() - start))

    images, _ = load_fashion_mnist_numpy("test")
    x = images.reshape(len(images), -1).astype("float32") / 255.0
    model.predict(x, batch_size=1024, verbose=0)  # compile outside the timing
    driver_rate = 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        model.predict(x, batch_size=1024, verbose=0)
        driver_rate = max(driver_rate, len(x) / (time.perf_counter() - start))

    env = dict(os.environ, XLA_FLAGS=EXECUTOR_XLA_FLAGS,
               KERAS_BACKEND=os.environ.get("KERAS_BACKEND", "jax"))
    examples = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
    child = subprocess.run([sys.executable, "-c", _ONE_THREAD_PREDICT, examples], env=env,
                           capture_output=True, text=True, check=True)
    one_thread_rate = json.loads(child.stdout.strip().splitlines()[-1])["rate"]
    test.unpersist()
    return samples, spark_rate, transfer_rate, driver_rate, one_thread_rate


# -- 2. the feed's share of a step --------------------------------------------------------

def measure_feed_share(batch_size=32):
    from distkeras.datasets import load_fashion_mnist_numpy, to_arrow_table
    from distkeras.feed import MinibatchFeed
    from distkeras.workers import SequentialWorker
    from fashion_mnist import build_mlp

    images, labels = load_fashion_mnist_numpy("train")
    batches = to_arrow_table(images, labels).select(["features", "label"]).to_batches(
        max_chunksize=10000)
    samples = sum(batch.num_rows for batch in batches)

    feed_seconds = float("inf")
    for _ in range(3):
        feed = MinibatchFeed(iter(batches), ["features"], ["label"], batch_size,
                             [(784,)], [(10,)])
        start = time.perf_counter()
        count = 0
        for _x, _y in feed:
            count += 1
        feed_seconds = min(feed_seconds, time.perf_counter() - start)

    class TimedWorker(SequentialWorker):
        """Keeps its compiled model between runs and times optimize() (feed + steps)."""

        seconds = None

        def prepare_model(self):
            if self.model is None:
                super().prepare_model()

        def optimize(self):
            start = time.perf_counter()
            try:
                super().optimize()
            finally:
                self.model.get_weights()  # waits for the last dispatched step
                self.seconds = time.perf_counter() - start

    worker = TimedWorker(build_mlp(), "adam", "categorical_crossentropy", metrics=["accuracy"],
                         features_col="features", label_col="label", batch_size=batch_size)
    worker.backend = "jax"
    worker.run(0, iter([batches[0].slice(0, 20 * batch_size)]), [(10,)])  # compile
    worker_seconds = float("inf")
    for _ in range(2):
        message = worker.run(0, iter(batches), [(10,)])
        assert message["samples"] == samples, message["samples"]
        worker_seconds = min(worker_seconds, worker.seconds)
    feed_ms = feed_seconds / count * 1000
    worker_ms = worker_seconds / count * 1000
    return samples, count, feed_ms, worker_ms


# -- 3. peak memory of one worker ---------------------------------------------------------

def write_random_parquet(path, rows, chunk=16384, seed=0):
    """Random float32 features (784) and one-hot labels (10), written chunk by chunk."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(seed)
    schema = pa.schema([("features", pa.list_(pa.float32())),
                        ("label", pa.list_(pa.float32()))])
    with pq.ParquetWriter(path, schema, compression="none", use_dictionary=False) as writer:
        for start in range(0, rows, chunk):
            count = min(chunk, rows - start)
            features = rng.random((count, 784), dtype=np.float32)
            one_hot = np.zeros((count, 10), dtype=np.float32)
            one_hot[np.arange(count), rng.integers(0, 10, count)] = 1.0
            table = pa.table({
                "features": pa.ListArray.from_arrays(
                    pa.array(np.arange(0, count * 784 + 1, 784, dtype=np.int32)),
                    pa.array(features.reshape(-1))),
                "label": pa.ListArray.from_arrays(
                    pa.array(np.arange(0, count * 10 + 1, 10, dtype=np.int32)),
                    pa.array(one_hot.reshape(-1))),
            }, schema=schema)
            writer.write_table(table, row_group_size=8192)
    return os.path.getsize(path)


def measure_memory(spark, paths, batch_size=32):
    import keras

    from distkeras.trainers import SingleTrainer
    from distkeras.workers import SequentialWorker

    class MemoryWorker(SequentialWorker):
        def result(self):
            message = super().result()
            message["ru_maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            # Per-step history is not needed here, and a long one overflows the message
            # header limit (networking.MAX_HEADER_BYTES, 1 MiB) on the way back.
            message["history"] = {}
            return message

    class MemoryTrainer(SingleTrainer):
        messages = None

        def allocate_worker(self):
            return MemoryWorker(self.master_model)

        def _run_workers(self, *args, **kwargs):
            self.messages = super()._run_workers(*args, **kwargs)
            return self.messages

    results = {}
    # The first training on a fresh machine compiles the step and fills the JAX cache on
    # disk; a warm-up run (not reported) keeps that out of the first measured worker.
    for name, path in [("warm-up", paths["small"])] + list(paths.items()):
        model = keras.Sequential([keras.Input((784,)),
                                  keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(10, activation="softmax")])
        trainer = MemoryTrainer(model, worker_optimizer="adam",
                                loss="categorical_crossentropy", metrics=["accuracy"],
                                batch_size=batch_size)
        frame = spark.read.parquet(path)
        trainer.train(frame, verbose=0)
        (message,) = trainer.messages
        results[name] = (message["samples"], message["ru_maxrss_kib"],
                         trainer.get_training_time())
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--large-rows", type=int, default=640_000)
    parser.add_argument("--small-rows", type=int, default=64_000)
    args = parser.parse_args()
    started = time.time()

    # 1. Prediction, one core.
    spark = local_spark_session("local[1]")
    warm_up_executors(spark, 1)
    import report

    samples, spark_rate, transfer_rate, driver_rate, one_thread_rate = \
        measure_prediction(spark)
    print(f"predict: spark {spark_rate:.0f}/s, driver {driver_rate:.0f}/s, "
          f"driver 1 thread {one_thread_rate:.0f}/s", flush=True)

    # 2. Feed share, in this process.
    feed_samples, minibatches, feed_ms, worker_ms = measure_feed_share()
    print(f"feed {feed_ms:.3f} ms, worker {worker_ms:.3f} ms per minibatch", flush=True)
    spark.stop()

    # 3. Memory: a fresh Python worker per task.
    folder = tempfile.mkdtemp(prefix="distkeras-memory-")
    try:
        paths, sizes = {}, {}
        for name, rows in (("large", args.large_rows), ("small", args.small_rows)):
            paths[name] = os.path.join(folder, f"{name}.parquet")
            start = time.perf_counter()
            sizes[name] = write_random_parquet(paths[name], rows)
            print(f"wrote {name}: {sizes[name] / 1e6:.0f} MB in "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
        spark = local_spark_session("local[1]", **{"spark.python.worker.reuse": "false"})
        memory = measure_memory(spark, {"small": paths["small"], "large": paths["large"]})
        spark.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for name, (rows, kib, seconds) in memory.items():
        print(f"{name}: {rows} rows, peak RSS {kib / 1024:.0f} MiB, train {seconds:.0f} s",
              flush=True)

    # The section.
    def verdict(ok):
        return "met" if ok else "**not met**"

    ratio = spark_rate / driver_rate
    share = feed_ms / worker_ms
    peak_ratio = memory["large"][1] / memory["small"][1]
    prediction = report.table(
        ["run", "samples/s", "ratio to driver predict"],
        [["`ModelPredictor(batch_size=1024).predict(df)`, `local[1]`, noop write",
          f"{spark_rate:.0f}", f"{ratio:.2f}"],
         ["identity `mapInArrow` on the same DataFrame, noop write (Arrow transfer alone)",
          f"{transfer_rate:.0f}", f"{transfer_rate / driver_rate:.2f}"],
         ["`model.predict(x, batch_size=1024)` in the driver (XLA on all cores)",
          f"{driver_rate:.0f}", "1.00"],
         ["same, in a process with XLA on one thread (the executors' setting)",
          f"{one_thread_rate:.0f}", f"{one_thread_rate / driver_rate:.2f}"]])
    transfer_note = (
        f"The identity row is the ceiling for any model: moving the {samples} rows of "
        f"784 floats to the Python worker and back (ModelPredictor keeps every input column) "
        f"takes {samples / transfer_rate:.2f} s, against "
        f"{samples / spark_rate - samples / transfer_rate:.2f} s more for rebuilding the "
        f"model in the task, compiling and predicting.")
    feed = report.table(
        ["feed ms / minibatch", "worker ms / minibatch (feed + step)", "step ms (difference)",
         "feed share"],
        [[f"{feed_ms:.3f}", f"{worker_ms:.3f}", f"{worker_ms - feed_ms:.3f}",
          f"{share:.1%}"]])
    rows = []
    for name in ("small", "large"):
        count, kib, seconds = memory[name]
        rows.append([f"{sizes[name] / 1e6:.0f} MB Parquet", f"{count}",
                     f"{kib / 1024:.0f}", f"{seconds:.1f}"])
    memory_table = report.table(["partition", "rows", "peak RSS of the worker (MiB)",
                                 "train() s"], rows)
    body = f"""
Three measures of the data path, one run (total {time.time() - started:.0f} s).

**Prediction on one core** (target: ModelPredictor >= 0.8x `model.predict` in one process):
{samples} Fashion-MNIST test images as a cached DataFrame, 784-500-500-10 MLP, best of 2
runs each; executors warmed up (`warm_up_executors`) before timing, the driver's predict
called once before timing. The Spark side runs one task with one XLA thread
(`local_spark_session` sets `spark.executorEnv.XLA_FLAGS`); the driver's `model.predict`
runs XLA on all {os.cpu_count()} cores, so the first ratio is against a process with more
cores. The third row restricts the driver-style predict to one XLA thread for a like-for-like
comparison.

{prediction}

Ratio {ratio:.2f} against the driver's predict on all cores: {verdict(ratio >= 0.8)}; against
one XLA thread {spark_rate / one_thread_rate:.2f}: {verdict(spark_rate / one_thread_rate >= 0.8)}. {transfer_note}

**Feed share of a worker's time per minibatch** (target: <= 10%): the 784-500-500-10 MLP,
batch 32, Adam, in this process without Spark (XLA on all cores, so steps are faster than on
an executor and the share is, if anything, overstated). {feed_samples} training images as
Arrow record batches of 10,000 rows; `MinibatchFeed` alone (best of 3) against a
`SequentialWorker`'s `optimize()` over the same feed ({minibatches} minibatches, best of 2,
compiled beforehand). Spark's Arrow transfer to the Python worker is not included.

{feed}

Feed share {share:.1%}: {verdict(share <= 0.10)}.

**Peak memory of one worker** (target: ~2 GB partition <= 1.5x a ~200 MB one): random float32
features (784) and one-hot labels (10), uncompressed Parquet, row groups of 8192 rows; one
SingleTrainer worker (784-16-10 MLP, batch 32, Adam) on `local[1]` with
`spark.python.worker.reuse=false`, so each task runs in a fresh Python worker; peak is the
worker's `ru_maxrss` at the end of training (Keras and JAX included). One unreported
warm-up training on the small file runs first, so neither measured worker compiles the step
from scratch (JAX's compilation cache on disk).

{memory_table}

Ratio {peak_ratio:.2f}: {verdict(peak_ratio <= 1.5)}.
"""
    report.write_section("Data pipeline: prediction, feed and memory", body)


if __name__ == "__main__":
    main()
