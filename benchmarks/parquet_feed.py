"""The feed from Parquet: Spark's ``mapInArrow`` rows against pyarrow in the workers.

Fashion-MNIST is written to Parquet by Spark (2 files), then read back two ways, side by
side in one run (``distkeras.parquetDirect`` false, then true): (a) Spark's path, where the
JVM converts rows to Arrow for ``mapInArrow``, and (b) `distkeras.data.parquet_source`, where
the Python workers read the files with pyarrow. Measured, interleaved run by run:

1. feed: each task turns its partition into minibatches of 32 (`feed.MinibatchFeed`) and
   trains on none: rows per CPU second (this process, the JVM and its Python workers);
2. train: SingleTrainer and ADAG (2 workers), 1 epoch, on the MLP and the CNN of
   benchmarks/zoo.py: wall seconds and rows per CPU second;
3. predict: ModelPredictor on the test images (or, for more than 10,000 rows, training
   images; written alike) against ``model.predict`` in the driver: rows per CPU second;
   all columns written (to Spark's ``noop`` sink), or only the label and the prediction
   (``predict-select``, as an evaluator reads them).

Read the ratios (b)/(a), not the seconds: the machine may be shared.

    python benchmarks/parquet_feed.py [--only feed train predict] [--rows 60000]
        [--train-rows 12000] [--predict-rows 10000] [--models mlp cnn]
        [--trainers single adag] [--repeat 3] [--write-doc]
"""

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from distkeras.data.parquet_source import SETTING  # noqa: E402

TITLE = "Parquet feed: Spark's Arrow rows against pyarrow in the workers"
DOC = os.path.join(os.path.dirname(__file__), "..", "docs", "parquet-feed.md")
PATHS = {"spark": "false", "direct": "true"}


def write_fashion_mnist(spark, folder, split, rows, kind="mlp"):
    """Writes ``rows`` images of ``split`` (as zoo model ``kind`` reads them, flat) with
    one-hot labels to Parquet through Spark, as 2 files; returns the path."""
    import numpy as np

    from distkeras.datasets import load_fashion_mnist_numpy, save_numpy_parquet
    from zoo import arrange

    images, labels = load_fashion_mnist_numpy(split)
    images, labels = images[:rows], labels[:rows]
    x = arrange(kind, images).reshape(len(images), -1)
    y = np.eye(10, dtype="float32")[labels]
    path = os.path.join(folder, f"{split}-{kind}-{rows}.parquet")
    save_numpy_parquet(spark, x, y, path, num_partitions=2)
    return path


def _cpu():
    """CPU seconds of this process and of Spark's (the JVM, its Python workers)."""
    from data_pipeline import _process_cpu_seconds

    driver, spark = _process_cpu_seconds()
    return driver + spark


class Clock:
    """Wall and CPU seconds of each timed run, per name."""

    def __init__(self):
        self.runs = {}

    def time(self, name, run):
        cpu, start = _cpu(), time.perf_counter()
        result = run()
        self.runs.setdefault(name, []).append((time.perf_counter() - start, _cpu() - cpu))
        return result

    def median(self, name):
        walls, cpus = zip(*self.runs[name])
        return statistics.median(walls), statistics.median(cpus)


def _with_setting(spark, value, run):
    def wrapped():
        spark.conf.set(SETTING, value)
        try:
            return run()
        finally:
            spark.conf.unset(SETTING)

    return wrapped


def _feed_job(frame_or_source, batch_size=32):
    """Rows fed by a task that builds minibatches over its partition, summed."""
    def feed(record_batches):
        import pyarrow as pa

        from distkeras.data.feed import MinibatchFeed

        rows = sum(len(x) for x, _ in MinibatchFeed(
            record_batches, ["features"], ["label"], batch_size, [(784,)], [(10,)]))
        yield pa.RecordBatch.from_pydict({"rows": [rows]})

    return sum(row["rows"] for row in
               frame_or_source.mapInArrow(feed, "rows long").collect())


def measure_feed(spark, path, rows, repeat, clock):
    """Minibatches from each path: Spark's ``mapInArrow`` of the scan, and the files read
    in the workers (the same 2 partitions)."""
    from distkeras.data import frame_layout
    from distkeras.training.spark_jobs import feed_batch_rows

    frame = spark.read.parquet(path)
    partitions = frame.rdd.getNumPartitions()
    runs = {}
    for name, value in PATHS.items():
        def run(value=value):
            spark.conf.set(SETTING, value)
            try:
                with feed_batch_rows(spark):  # the trainers' Arrow batches, both paths
                    layout = frame_layout.lay_out(frame, partitions)
                    assert (layout is frame) == (value == "false"), layout
                    assert _feed_job(layout) == rows, "rows lost"
            finally:
                spark.conf.unset(SETTING)
        runs[f"feed {name}"] = run
    # A job that reads nothing: Spark's fixed cost of a job (its CPU is subtracted).
    runs["feed none"] = lambda: _feed_job(spark.range(0, partitions, 1, partitions)
                                          .selectExpr("array(cast(id as float)) as features",
                                                      "array(cast(id as float)) as label")
                                          .where("size(features) = 0"))
    _interleave(runs, repeat, clock)
    return partitions


def _interleave(runs, repeat, clock, warm=1):
    for _ in range(warm):
        for run in runs.values():
            run()
    for _ in range(repeat):
        for name, run in runs.items():
            clock.time(name, run)


TRAINERS = {"single": ("SingleTrainer", {}), "adag": ("ADAG", {"num_workers": 2})}


def measure_training(spark, folder, rows, models, trainer_names, repeat, clock):
    """SingleTrainer and ADAG (2 workers), 1 epoch, each path."""
    import keras

    from distkeras import trainers
    from zoo import build_model

    runs = {}
    for kind in models:
        frame = spark.read.parquet(write_fashion_mnist(spark, folder, "train", rows, kind))
        for trainer_name, extra in (TRAINERS[name] for name in trainer_names):
            for name, value in PATHS.items():
                def train(kind=kind, trainer_name=trainer_name, extra=extra, frame=frame):
                    keras.utils.set_random_seed(1)
                    trainer = getattr(trainers, trainer_name)(
                        keras_model=build_model(kind), worker_optimizer="adam",
                        loss="categorical_crossentropy", batch_size=32, num_epoch=1,
                        features_col="features", label_col="label", **extra)
                    trainer.train(frame, verbose=0)
                runs[f"train {kind} {trainer_name} {name}"] = _with_setting(spark, value, train)
    _interleave(runs, repeat, clock)


def measure_prediction(spark, folder, rows, models, repeat, clock):
    """ModelPredictor on each path, and the driver's ``model.predict``."""
    from distkeras.datasets import load_fashion_mnist_numpy
    from distkeras.predictors import ModelPredictor
    from zoo import arrange, build_model

    runs = {}
    split = "test" if rows <= 10000 else "train"  # the test images, or more
    images, _ = load_fashion_mnist_numpy(split)
    for kind in models:
        frame = spark.read.parquet(write_fashion_mnist(spark, folder, split, rows, kind))
        model = build_model(kind)
        x = arrange(kind, images[:rows])
        for name, value in PATHS.items():
            def predict(model=model, frame=frame):
                ModelPredictor(model, "features", batch_size=1024).predict(frame) \
                    .write.format("noop").mode("overwrite").save()
            runs[f"predict {kind} {name}"] = _with_setting(spark, value, predict)

            def evaluate(model=model, frame=frame):  # what an evaluator reads
                ModelPredictor(model, "features", batch_size=1024).predict(frame) \
                    .select("label", "prediction").write.format("noop").mode("overwrite") \
                    .save()
            runs[f"predict-select {kind} {name}"] = _with_setting(spark, value, evaluate)
        runs[f"predict {kind} driver"] = \
            lambda model=model, x=x: model.predict(x, batch_size=1024, verbose=0)
    _interleave(runs, repeat, clock)


def table(clock, rows_of):
    """Rows: each measure, its wall and CPU seconds, rows per CPU second and the ratio of
    the direct path to Spark's. The feed's CPU seconds are net of a job that reads
    nothing ("feed none", Spark's fixed cost of a job)."""
    import report

    fixed = clock.median("feed none")[1] if "feed none" in clock.runs else 0.0

    def rate(name):
        cpu = clock.median(name)[1] - (fixed if name.startswith("feed ") else 0.0)
        return rows_of(name) / cpu if cpu > 0 else float("inf")

    lines = []
    for name in clock.runs:
        wall, cpu = clock.median(name)
        base = name.rsplit(" ", 1)[0] + " spark"
        ratio = "-"
        if base in clock.runs and not name.endswith((" spark", " none")):
            ratio = f"{rate(name) / rate(base):.2f}"
        lines.append([name, f"{wall:.2f}", f"{cpu:.2f}",
                      "-" if name == "feed none" else f"{rate(name):,.0f}", ratio])
    return report.table(["run", "wall s", "CPU s", "rows per CPU s (feed: net of a job "
                         "that reads nothing)", "vs Spark's path"], lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=["feed", "train", "predict"],
                        choices=["feed", "train", "predict"])
    parser.add_argument("--rows", type=int, default=60000, help="feed rows")
    parser.add_argument("--train-rows", type=int, default=12000)
    parser.add_argument("--predict-rows", type=int, default=10000)
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--trainers", nargs="+", default=list(TRAINERS), choices=TRAINERS)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--write-doc", action="store_true",
                        help="Write the table into docs/parquet-feed.md.")
    args = parser.parse_args()
    from distkeras.session import local_spark_session, warm_up_executors

    spark = local_spark_session("local[2]")
    warm_up_executors(spark, 2)
    folder = tempfile.mkdtemp(prefix="distkeras-parquet-feed-")
    clock = Clock()
    counts = {"feed": args.rows, "train": args.train_rows, "predict": args.predict_rows,
              "predict-select": args.predict_rows}
    try:
        if "feed" in args.only:
            path = write_fashion_mnist(spark, folder, "train", args.rows)
            partitions = measure_feed(spark, path, args.rows, args.repeat, clock)
            print(f"feed: {partitions} partitions", flush=True)
        if "train" in args.only:
            measure_training(spark, folder, args.train_rows, args.models, args.trainers,
                             args.repeat, clock)
        if "predict" in args.only:
            measure_prediction(spark, folder, args.predict_rows, args.models, args.repeat,
                               clock)
    finally:
        spark.stop()
        shutil.rmtree(folder, ignore_errors=True)
    body = table(clock, lambda name: counts[name.split(" ", 1)[0]])
    print(body)
    if args.write_doc:
        import report

        report.write_section(TITLE, body, doc=DOC)


if __name__ == "__main__":
    main()
