"""Where ModelPredictor's time goes, per row, on a plain Parquet scan of Fashion-MNIST.

Each stage of the prediction is run alone, side by side in one run and interleaved run by
run (the machine may be shared: read the ratios, not the seconds), and measured in CPU
seconds of every process: this driver, Spark's JVM and its Python workers (split). Stages:

- ``job``: a Python job that reads nothing (a job's fixed cost);
- ``scan``: Spark's scan of every column, written to the ``noop`` sink (the JVM's rows);
- ``first``: the first row of the features (the check `ModelPredictor.predict` makes);
- ``udf features``: an Arrow UDF of the features returning zeros (the JVM's row to Arrow);
- ``udf keys``: an Arrow UDF of ``_metadata.file_path`` and ``_metadata.row_index``
  returning zeros (the rows named, not sent);
- ``read``, ``decode``, ``model``: the files read in the workers with pyarrow, then turned
  into numpy, then predicted on, each task returning a count only;
- ``direct zeros``: the files read in the workers, every column sent back with zeros (the
  JVM's Arrow to rows), and ``direct zeros -features`` without the features;
- ``predictor``: `ModelPredictor(model, batch_size=1024).predict(frame)` to ``noop``,
  ``predictor spark`` with ``distkeras.parquetDirect=false``, and ``predictor mapInArrow``
  the files read by a ``mapInArrow`` that sends every column back (the previous path);
  ``... select``: the same, then only ``label`` and ``prediction`` written (an evaluator);
- ``driver``: ``model.predict(x, batch_size=1024)`` in this process.

    nice -n 15 python benchmarks/predict_profile.py [--models mlp cnn] [--rows 20000]
        [--repeat 2] [--only STAGE ...]
"""

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))


def cpu_seconds():
    """CPU seconds so far of (this process, Spark's JVM, Spark's Python workers), from
    /proc (Linux)."""
    tick = os.sysconf("SC_CLK_TCK")
    children, seconds, names = {}, {}, {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii") as handle:
                head, fields = handle.read().rsplit(")", 1)
        except OSError:  # the process ended meanwhile
            continue
        fields = fields.split()
        children.setdefault(int(fields[1]), []).append(int(name))
        seconds[int(name)] = (int(fields[11]) + int(fields[12])) / tick
        names[int(name)] = head.split("(", 1)[1]
    jvm = python = 0.0
    pending = list(children.get(os.getpid(), []))
    while pending:
        pid = pending.pop()
        if names[pid] == "java":
            jvm += seconds[pid]
        else:
            python += seconds[pid]
        pending += children.get(pid, [])
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, jvm, python


class Clock:
    """CPU seconds (driver, JVM, Python workers) and wall seconds of each run, per name."""

    def __init__(self):
        self.runs = {}

    def time(self, name, run):
        before, start = cpu_seconds(), time.perf_counter()
        run()
        after = cpu_seconds()
        self.runs.setdefault(name, []).append(
            (time.perf_counter() - start, *(b - a for a, b in zip(before, after))))

    def median(self, name):
        """Median (wall, driver, JVM, Python, total CPU) seconds of ``name``'s runs."""
        runs = self.runs[name]
        return [statistics.median(values) for values in zip(*runs)] + \
            [statistics.median(sum(run[1:]) for run in runs)]


def zeros_udf(count, width=10):
    """An Arrow UDF (iterator form) of ``count`` columns returning ``width`` zeros a row."""
    import typing

    import pyarrow as pa
    from pyspark.sql import functions as F

    def zeros(batches):
        import numpy as np

        from distkeras.data.datasets import float_lists

        for columns in batches:
            rows = len(columns if count == 1 else columns[0])
            yield float_lists(np.zeros((rows, width), np.float32))

    argument = pa.Array if count == 1 else typing.Tuple[pa.Array, ...]
    zeros.__annotations__ = {"batches": typing.Iterator[argument],
                             "return": typing.Iterator[pa.Array]}
    return F.arrow_udf(zeros, "array<float>")


def noop(frame):
    frame.write.format("noop").mode("overwrite").save()


def direct_stages(frame, model, kind):
    """The stages of the files read in the workers (a count back, or the rows back)."""
    import numpy as np

    from distkeras.data import parquet_source
    from distkeras.ml.prediction_tasks import model_key
    from distkeras.utils import serialize_model

    source = parquet_source.direct_source(frame, batch_rows=10000)
    assert source is not None, "not a plain Parquet scan"
    model_bytes = serialize_model(model)
    key = model_key(model_bytes)
    shape = tuple(int(dim) for dim in model.inputs[0].shape[1:])

    def counting(stage):
        def run(record_batches):
            import pyarrow as pa

            from distkeras.data.feed import column_rows
            from distkeras.ml import prediction_tasks

            rows = 0
            if stage == "read":
                rows = sum(batch.num_rows for batch in record_batches)
            elif stage == "decode":
                rows = sum(len(column_rows(batch.column("features"), shape, "features",
                                           np.float32)) for batch in record_batches)
            else:
                columns = ((batch.column("features"),) for batch in record_batches)
                rows = sum(len(predicted) for predicted in prediction_tasks.predict_batches(
                    columns, key, model_bytes, "jax", ["features"], [shape], 1024))
            yield pa.RecordBatch.from_pydict({"rows": [rows]})

        return lambda: source.mapInArrow(run, "rows long").collect()

    def back(with_features):
        def run(record_batches):
            import pyarrow as pa

            from distkeras.data.datasets import float_lists

            for batch in record_batches:
                if not with_features:
                    batch = batch.drop_columns(["features"])
                yield batch.append_column(
                    "prediction", float_lists(np.zeros((batch.num_rows, 10), np.float32)))

        from pyspark.sql import types as T

        kept = frame if with_features else frame.drop("features")
        schema = T.StructType(kept.schema.fields + [
            T.StructField("prediction", T.ArrayType(T.FloatType()))])
        return lambda: noop(source.mapInArrow(run, schema))

    return {"read": counting("read"), "decode": counting("decode"),
            "model": counting("model"), "direct zeros": back(True),
            "direct zeros -features": back(False)}


def stages(spark, frame, model, x, kind):
    from pyspark.sql import functions as F

    from distkeras.data.parquet_source import SETTING
    from distkeras.predictors import ModelPredictor

    def predictor(direct, select=False):
        def run():
            spark.conf.set(SETTING, direct)
            try:
                predicted = ModelPredictor(model, "features", batch_size=1024).predict(frame)
                noop(predicted.select("label", "prediction") if select else predicted)
            finally:
                spark.conf.unset(SETTING)
        return run

    def mapinarrow():  # the previous direct path: every column back through Arrow
        from distkeras.data.feed import integer_dtype
        from distkeras.ml.parquet_predictions import direct_source, read_in_workers
        from distkeras.utils import serialize_model

        settings = (serialize_model(model), "jax", ["features"],
                    [tuple(int(dim) for dim in model.inputs[0].shape[1:])], 1024, None, None,
                    [integer_dtype(model.inputs[0])])
        return read_in_workers(direct_source(frame), frame, ["prediction"], settings)

    keys = [F.col("_metadata.file_path"), F.col("_metadata.row_index")]

    def job(record_batches):
        for _ in record_batches:
            pass
        return iter(())

    runs = {
        "job": lambda: spark.range(0, 2, 1, 2).mapInArrow(job, "id long").collect(),
        "scan": lambda: noop(frame),
        "first": lambda: frame.select("features").first(),
        "udf features": lambda: noop(frame.withColumn("p", zeros_udf(1)("features"))),
        "udf keys": lambda: noop(frame.withColumn("p", zeros_udf(2)(*keys))),
        "plan": lambda: ModelPredictor(model, "features", batch_size=1024).predict(frame),
        **direct_stages(frame, model, kind),
        "predictor": predictor("true"),
        "predictor spark": predictor("false"),
        "predictor mapInArrow": lambda: noop(mapinarrow()),
        "predictor select": predictor("true", select=True),
        "predictor mapInArrow select": lambda: noop(mapinarrow().select("label", "prediction")),
        "driver": lambda: model.predict(x, batch_size=1024, verbose=0),
    }
    return runs


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "cnn"])
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--only", nargs="+", help="stages to run (default: all)")
    parser.add_argument("--folder", help="keep the Parquet files here, for the next run")
    args = parser.parse_args()

    from distkeras.session import local_spark_session, warm_up_executors

    spark = local_spark_session("local[2]")
    warm_up_executors(spark, 2)
    from parquet_feed import write_fashion_mnist
    from zoo import arrange, build_model

    from distkeras.datasets import load_fashion_mnist_numpy

    folder = args.folder or tempfile.mkdtemp(prefix="distkeras-predict-profile-")
    split = "test" if args.rows <= 10000 else "train"
    images, _ = load_fashion_mnist_numpy(split)
    clock = Clock()
    try:
        for kind in args.models:
            path = os.path.join(folder, f"{split}-{kind}-{args.rows}.parquet")
            if not os.path.exists(path):
                write_fashion_mnist(spark, folder, split, args.rows, kind)
            frame = spark.read.parquet(path)
            model = build_model(kind)
            x = arrange(kind, images[:args.rows])
            runs = stages(spark, frame, model, x, kind)
            if args.only:
                runs = {name: run for name, run in runs.items()
                        if name in args.only or name == "driver"}
            for run in runs.values():  # warm: JIT, compilation, the workers' model
                run()
            for _ in range(args.repeat):
                for name, run in runs.items():
                    clock.time(f"{kind} {name}", run)
    finally:
        spark.stop()
        if not args.folder:
            shutil.rmtree(folder, ignore_errors=True)
    import report

    lines = []
    for name in clock.runs:
        wall, driver, jvm, python, total = clock.median(name)
        kind = name.split(" ", 1)[0]
        per_core = ""
        if not name.endswith(" driver"):
            base = clock.median(f"{kind} driver")[4]
            per_core = f"{base / total:.2f}" if total > 0 else "-"
        lines.append([name, f"{wall:.2f}", f"{driver:.2f}", f"{jvm:.2f}", f"{python:.2f}",
                      f"{total:.2f}", f"{args.rows / total:,.0f}" if total else "-",
                      per_core])
    print(report.table(["run", "wall s", "driver CPU s", "JVM CPU s", "workers CPU s",
                        "CPU s", "rows per CPU s", "driver CPU s / this CPU s"], lines))


if __name__ == "__main__":
    main()
