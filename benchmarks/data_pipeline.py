"""Data pipeline: distributed prediction, the minibatch feed, and a worker's memory.

Three measures, written as two sections of benchmarks/results.md:

1. ModelPredictor on one Spark core (``local[1]``) against ``model.predict`` in the driver,
   on the 10,000 Fashion-MNIST test images and the 784-500-500-10 MLP (target: ratio of
   samples per second >= 0.8), as is and with every process pinned to one CPU.
2. The feed's share of a worker's time per minibatch (MLP, batch 32, in one process, no
   Spark): iterating `MinibatchFeed` alone against a `SequentialWorker`'s training loop over
   the same feed (target: <= 10%).
3. Peak memory (``ru_maxrss``) of one SingleTrainer worker on a ~2 GB partition against a
   ~200 MB one, each task in a fresh Python worker (target: ratio <= 1.5).

    python benchmarks/data_pipeline.py [--only prediction|feed-memory] [--repeat 5]
        [--large-rows 640000] [--small-rows 64000]
"""

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

from distkeras.session import local_spark_session, warm_up_executors  # noqa: E402

PREDICTION_TITLE = "Data pipeline: ModelPredictor against model.predict"
FEED_MEMORY_TITLE = "Data pipeline: feed and memory"


# -- 1. prediction ----------------------------------------------------------------------

def _process_cpu_seconds():
    """CPU seconds so far of this process, and of its children (the Spark JVM) with their
    descendants (the Python workers), read from /proc (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    children, seconds = {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:  # the process ended meanwhile
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
        seconds[int(name)] = (int(fields[11]) + int(fields[12])) / tick
    spark = 0.0
    pending = list(children.get(os.getpid(), []))
    while pending:
        pid = pending.pop()
        spark += seconds[pid]
        pending += children.get(pid, [])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, spark


class Timings:
    """Samples/s of each timed run, and CPU seconds (this process, Spark) per run.

    ``cores`` counts this process, plus Spark's processes with ``with_spark`` (not for the
    driver's predict: the JVM's background work then, its GC and JIT after the previous
    Spark run, is not the driver's).
    """

    def __init__(self, samples, with_spark=True):
        self.samples = samples
        self.with_spark = with_spark
        self.rates, self.driver_cpu, self.spark_cpu, self.cores = [], [], [], []

    def time(self, run):
        """Times one call of ``run``."""
        driver0, spark0 = _process_cpu_seconds()
        start = time.perf_counter()
        run()
        seconds = time.perf_counter() - start
        driver1, spark1 = _process_cpu_seconds()
        self.rates.append(self.samples / seconds)
        self.driver_cpu.append(driver1 - driver0)
        self.spark_cpu.append(spark1 - spark0)
        spark = spark1 - spark0 if self.with_spark else 0.0
        self.cores.append((driver1 - driver0 + spark) / seconds)
        return seconds

    def summary(self):
        return {"best": max(self.rates), "median": statistics.median(self.rates),
                "driver_cpu": statistics.median(self.driver_cpu),
                "spark_cpu": statistics.median(self.spark_cpu),
                "cores": statistics.median(self.cores)}


def _zeros_udf():
    """An Arrow UDF with ModelPredictor's data path (features in, 10 floats out) and no
    model: the transfer alone."""
    from typing import Iterator

    import numpy as np
    import pyarrow as pa
    from pyspark.sql import functions as F

    from distkeras.datasets import float_lists
    from distkeras.data.feed import column_to_numpy

    def zeros(batches: Iterator[pa.Array]) -> Iterator[pa.Array]:
        for batch in batches:
            column_to_numpy(batch, (784,), "features")
            yield float_lists(np.zeros((len(batch), 10), np.float32))

    return F.arrow_udf(zeros, "array<float>")


def _with_arrow_batch_rows(spark, rows, run):
    """``run`` with Spark's Arrow batches of ``rows`` rows instead of the session's."""
    key = "spark.sql.execution.arrow.maxRecordsPerBatch"

    def wrapped():
        before = spark.conf.get(key)
        spark.conf.set(key, str(rows))
        try:
            run()
        finally:
            spark.conf.set(key, before)

    return wrapped


def measure_prediction(spark, repeat):
    """ModelPredictor (Spark's default Arrow batches, then batches of 1,000 rows), its data
    path without a model, that path on 100 rows (a job's fixed cost) and the driver's
    predict, interleaved run by run so a busy machine slows all alike; also the first, cold
    ModelPredictor run."""
    from distkeras.datasets import load_fashion_mnist, load_fashion_mnist_numpy
    from distkeras.predictors import ModelPredictor
    from fashion_mnist import build_mlp

    test = load_fashion_mnist(spark, "test").cache()
    samples = test.count()
    packed = load_fashion_mnist(spark, "test", packed=True).cache()
    packed.count()
    few = test.limit(100).cache()
    few.count()
    model = build_mlp()
    images, _ = load_fashion_mnist_numpy("test")
    x = images.reshape(len(images), -1).astype("float32") / 255.0
    udf = _zeros_udf()

    def noop(frame):
        frame.write.format("noop").mode("overwrite").save()

    def predictor(frame=test):
        noop(ModelPredictor(model, "features", batch_size=1024).predict(frame))

    runs = {
        "predictor": predictor,
        "predictor_1000": _with_arrow_batch_rows(spark, 1000, predictor),
        "predictor_packed": lambda: predictor(packed),
        "transfer": lambda: noop(test.withColumn("prediction", udf("features"))),
        "transfer_packed": lambda: noop(packed.withColumn("prediction", udf("features"))),
        "job_100": lambda: noop(few.withColumn("prediction", udf("features"))),
        "driver": lambda: model.predict(x, batch_size=1024, verbose=0),
        "driver_default": lambda: model.predict(x, verbose=0),  # Keras's batch_size=32
    }
    timings = {name: Timings(100 if name == "job_100" else samples,
                             with_spark=not name.startswith("driver")) for name in runs}
    cold = timings["predictor"].time(predictor)  # rebuilds and compiles the model
    timings["predictor"] = Timings(samples)
    for run in runs.values():  # warm-up: JVM JIT, XLA compilation in the driver
        for _ in range(3):
            run()
    for _ in range(repeat):
        for name, run in runs.items():
            timings[name].time(run)
    for frame in (test, packed, few):
        frame.unpersist()
    result = {name: timing.summary() for name, timing in timings.items()}
    result.update(samples=samples, cold_seconds=cold)
    return result


def _prediction_in_this_process(repeat):
    spark = local_spark_session("local[1]")
    warm_up_executors(spark, 1)
    try:
        return measure_prediction(spark, repeat)
    finally:
        spark.stop()


def measure_prediction_pinned(repeat):
    """`measure_prediction` in a child process pinned to CPU 0, with its Spark JVM and
    Python workers (they inherit the affinity): every side gets one core."""
    child = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--pinned-child", "--repeat", str(repeat)],
        preexec_fn=lambda: os.sched_setaffinity(0, {0}), capture_output=True, text=True,
        check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


# -- 2. the feed's share of a step --------------------------------------------------------

def measure_feed_share(batch_size=32):
    from distkeras.datasets import load_fashion_mnist_numpy, to_arrow_table
    from distkeras.data.feed import MinibatchFeed
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

    from distkeras.datasets import float_lists

    rng = np.random.default_rng(seed)
    schema = pa.schema([("features", pa.list_(pa.float32())),
                        ("label", pa.list_(pa.float32()))])
    with pq.ParquetWriter(path, schema, compression="none", use_dictionary=False) as writer:
        for start in range(0, rows, chunk):
            count = min(chunk, rows - start)
            features = rng.random((count, 784), dtype=np.float32)
            one_hot = np.zeros((count, 10), dtype=np.float32)
            one_hot[np.arange(count), rng.integers(0, 10, count)] = 1.0
            table = pa.table({"features": float_lists(features), "label": float_lists(one_hot)},
                             schema=schema)
            writer.write_table(table, row_group_size=8192)
    return os.path.getsize(path)


def measure_memory(spark, paths, batch_size=32):
    import keras

    from distkeras.trainers import SingleTrainer
    from distkeras.training.one_task import OneTaskPlan
    from distkeras.workers import SequentialWorker

    class MemoryWorker(SequentialWorker):
        def result(self):
            message = super().result()
            message["ru_maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            # Per-step history is not needed here, and a long one overflows the message
            # header limit (networking.MAX_HEADER_BYTES, 1 MiB) on the way back.
            message["history"] = {}
            return message

    class MemoryPlan(OneTaskPlan):
        def run_workers(self, *args, **kwargs):
            self.trainer.messages = super().run_workers(*args, **kwargs)
            return self.trainer.messages

    class MemoryTrainer(SingleTrainer):
        messages = None
        plan = MemoryPlan

        def allocate_worker(self):
            return MemoryWorker(self.master_model)

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


def _verdict(ok):
    return "met" if ok else "**not met**"


def _prediction_rows(result):
    """Table rows of one `measure_prediction` result."""
    driver = result["driver"]["best"]
    names = [("predictor", "`ModelPredictor(batch_size=1024).predict(df)`, noop write"),
             ("predictor_1000", "same, Arrow batches of 1,000 rows "
                                "(`spark.sql.execution.arrow.maxRecordsPerBatch`)"),
             ("predictor_packed", "same, features packed (`load_fashion_mnist(packed=True)`: "
                                  "binary float32 rows)"),
             ("transfer", "its data path without a model (Arrow UDF returning zeros)"),
             ("transfer_packed", "the same for the packed features"),
             ("driver", "`model.predict(x, batch_size=1024)` in the driver"),
             ("driver_default", "`model.predict(x)` in the driver (Keras's default "
                                "batch_size, 32)")]
    rows = []
    for key, label in names:
        timing = result[key]
        cpu = timing["driver_cpu"] + (0.0 if key.startswith("driver") else timing["spark_cpu"])
        rows.append([label, f"{timing['best']:.0f}", f"{timing['median']:.0f}",
                     f"{timing['best'] / driver:.2f}", f"{cpu:.2f}",
                     f"{timing['cores']:.2f}"])
    return rows


def prediction_section(repeat):
    """Measures ModelPredictor as is and pinned to one CPU; writes its section."""
    import report

    started = time.time()
    free = _prediction_in_this_process(repeat)
    print("as is:", json.dumps(free), flush=True)
    pinned = measure_prediction_pinned(repeat)
    print("pinned:", json.dumps(pinned), flush=True)
    header = ["run", "best samples/s", "median samples/s", "best / driver best",
              "CPU s per run", "cores busy (CPU s / wall s)"]
    samples = free["samples"]
    ratio = free["predictor"]["best"] / free["driver"]["best"]
    pinned_ratio = pinned["predictor"]["best"] / pinned["driver"]["best"]
    packed_ratio = free["predictor_packed"]["best"] / free["driver"]["best"]
    pinned_packed_ratio = pinned["predictor_packed"]["best"] / pinned["driver"]["best"]
    # Each as a user calls it: ModelPredictor's default batch (1024) against Keras's (32).
    default_ratio = free["predictor"]["best"] / free["driver_default"]["best"]
    pinned_default_ratio = pinned["predictor"]["best"] / pinned["driver_default"]["best"]

    def seconds(result, name):  # best wall seconds per run
        return (100 if name == "job_100" else samples) / result[name]["best"]

    def cpu(result, name):
        return result[name]["driver_cpu"] + result[name]["spark_cpu"]

    predict_s, transfer_s = seconds(free, "predictor"), seconds(free, "transfer")
    driver_s = seconds(free, "driver")
    body = f"""
One run, total {time.time() - started:.0f} s. {samples} Fashion-MNIST test images as a
cached DataFrame, 784-500-500-10 MLP, `local[1]` (one Spark task at a time). Executors
warmed up (`warm_up_executors`); each measured call runs 3 times unmeasured first (JVM JIT,
XLA compilation, the model rebuilt once in the Python worker), then the calls take turns
{repeat} times, so a machine busy with other work slows all of them alike. CPU seconds are
the median per run of this process plus, for the Spark rows, the Spark JVM and its Python
workers (from `/proc`; the driver's row counts the driver alone, as the JVM's background
work then is not its own); "cores busy" is the median of that CPU time over wall time.

Cores in use: `local[1]` runs one task, but that task is two processes, the JVM (reads the
rows, writes them as Arrow) and the Python worker (predicts), which can run on different
cores at once. The driver's `model.predict` runs JAX's CPU client, which uses several
threads whatever `XLA_FLAGS` says (see its "cores busy"). So the first table lets each side
use all of the machine's {os.cpu_count()} cores; the second pins everything (driver, JVM,
Python worker) to CPU 0 with `sched_setaffinity`, the like-for-like one-core comparison.

As is (no pinning):

{report.table(header, _prediction_rows(free))}

All on one core (`sched_setaffinity(0, {{0}})`, child process):

{report.table(header, _prediction_rows(pinned))}

Ratio {ratio:.2f} as is, {pinned_ratio:.2f} on one core: {_verdict(min(ratio, pinned_ratio) >= 0.8)}
for `array<float>` features; with packed features {packed_ratio:.2f} as is and
{pinned_packed_ratio:.2f} on one core: {_verdict(min(packed_ratio, pinned_packed_ratio) >= 0.8)}
(target 0.8, at the same batch size). Each called at its own default, as a user would write
them (`ModelPredictor(model).predict(df)`, batch 1024, against `model.predict(x)`, batch
32): {default_ratio:.2f} as is and {pinned_default_ratio:.2f} on one core. That comparison
favours us by the batch size alone, so the verdict above stands on equal batches
(the `mapInArrow` version this replaced, which sent every column through Python
and back and rebuilt the model in every task, measured 0.13 in this benchmark's previous
run, commit 433a722). First call on a fresh Python worker (model rebuilt from its `.keras`
bytes and compiled): {free['cold_seconds']:.2f} s; later calls reuse the worker's model.

Where the time goes (as is, best runs): the zeros row moves the same data with no model in
{transfer_s:.3f} s, against {driver_s:.3f} s for the driver's whole predict, so no work on
the model side can lift ModelPredictor above {driver_s / transfer_s:.2f} of the driver on
this path. Of those {transfer_s:.3f} s, {seconds(free, "job_100"):.3f} s is a job's fixed
cost (the same UDF over 100 rows); the rest is per row, mostly the JVM writing each of the
784 floats of a row into Arrow one element at a time (`ArrowWriter`'s
`ArrayWriter.setValue` held most of the task thread's samples in a JFR profile).
ModelPredictor adds {predict_s - transfer_s:.3f} s to the zeros row, the order of the
driver's predict, including a small Spark job of its own before the prediction's (since
2026-12-01: `predict()` reads the first row on the driver, to refuse a null or a row of the
wrong size for the model before any task runs; measured alone, 0.05-0.08 s here, a cost
per call, not per row): the Python side now costs about what `model.predict` costs (the model
stays in the worker between calls, and Spark's `gc.collect()` after each task no longer
walks the Keras and JAX objects, frozen with `gc.freeze()`). On one core, where nothing
overlaps, the Spark side spends {cpu(pinned, "predictor"):.2f} CPU s per run, the driver
{pinned["driver"]["driver_cpu"]:.2f}. Arrow batches of 1,000 rows instead of Spark's
10,000 change the best rate by x{free["predictor_1000"]["best"] / free["predictor"]["best"]:.2f}
as is and x{pinned["predictor_1000"]["best"] / pinned["predictor"]["best"]:.2f} on one core
(the JVM can convert the next batch while Python predicts only with a second core).
Packed features (one binary of 784 float32 per row, `distkeras.data.tensors`) move through the
zeros path in {seconds(free, "transfer_packed"):.3f} s instead of {transfer_s:.3f} s
(x{free["transfer_packed"]["best"] / free["transfer"]["best"]:.2f}): the JVM copies each row's
bytes whole.
"""
    report.write_section(PREDICTION_TITLE, body)


def feed_memory_section(large_rows, small_rows):
    """Measures the feed's share of a step and a worker's peak memory; writes their
    section."""
    import report

    started = time.time()
    feed_samples, minibatches, feed_ms, worker_ms = measure_feed_share()
    print(f"feed {feed_ms:.3f} ms, worker {worker_ms:.3f} ms per minibatch", flush=True)

    # A fresh Python worker per task.
    folder = tempfile.mkdtemp(prefix="distkeras-memory-")
    try:
        paths, sizes = {}, {}
        for name, rows in (("large", large_rows), ("small", small_rows)):
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

    share = feed_ms / worker_ms
    peak_ratio = memory["large"][1] / memory["small"][1]
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
Two measures of the data path, one run (total {time.time() - started:.0f} s).

**Feed share of a worker's time per minibatch** (target: <= 10%): the 784-500-500-10 MLP,
batch 32, Adam, in this process without Spark (XLA on all cores, so steps are faster than on
an executor and the share is, if anything, overstated). {feed_samples} training images as
Arrow record batches of 10,000 rows; `MinibatchFeed` alone (best of 3) against a
`SequentialWorker`'s `optimize()` over the same feed ({minibatches} minibatches, best of 2,
compiled beforehand). Spark's Arrow transfer to the Python worker is not included.

{feed}

Feed share {share:.1%}: {_verdict(share <= 0.10)}.

**Peak memory of one worker** (target: ~2 GB partition <= 1.5x a ~200 MB one): random float32
features (784) and one-hot labels (10), uncompressed Parquet, row groups of 8192 rows; one
SingleTrainer worker (784-16-10 MLP, batch 32, Adam) on `local[1]` with
`spark.python.worker.reuse=false`, so each task runs in a fresh Python worker; peak is the
worker's `ru_maxrss` at the end of training (Keras and JAX included). One unreported
warm-up training on the small file runs first, so neither measured worker compiles the step
from scratch (JAX's compilation cache on disk).

{memory_table}

Ratio {peak_ratio:.2f}: {_verdict(peak_ratio <= 1.5)}.
"""
    report.write_section(FEED_MEMORY_TITLE, body)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["prediction", "feed-memory"], default=None,
                        help="run one section only (default: both)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each prediction")
    parser.add_argument("--large-rows", type=int, default=640_000)
    parser.add_argument("--small-rows", type=int, default=64_000)
    parser.add_argument("--pinned-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pinned_child:  # the child of measure_prediction_pinned: JSON on stdout
        print(json.dumps(_prediction_in_this_process(args.repeat)), flush=True)
        return
    if args.only in (None, "prediction"):
        prediction_section(args.repeat)
    if args.only in (None, "feed-memory"):
        feed_memory_section(args.large_rows, args.small_rows)


if __name__ == "__main__":
    main()
