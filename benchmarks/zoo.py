"""A model zoo on Fashion-MNIST: plain `fit`, SingleTrainer, AllReduceTrainer and the
parameter-server trainers.

Five kinds of model (an MLP, a CNN with BatchNormalization and Dropout, an LSTM over the 28
image rows, a small Transformer encoder over patches, an Embedding over quantized pixels),
each trained by `keras.Model.fit` in the driver and by distkeras's trainers with 2 workers
at their defaults, at equal epochs, on `local[2]`. For every run: whole wall time, the time
from the start to the first step (compile and start-up), steps-only samples/s, test
accuracy, and the validation accuracy after every epoch against wall time (one plot per
model in docs/zoo/).

    python benchmarks/zoo.py [--models mlp cnn lstm vit embedding] [--runs fit single adag ...]
                             [--limit 12000] [--epochs 3] [--placement driver executor]
                             [--seeds 1 2 3] [--out DIR] [--json PATH] [--include PATH ...]

A run ``NAME/W`` sets ``communication_window=W``; ``NAME+bfloat16`` or ``NAME+topk`` (or
``NAME+topk:0.05``) its ``compression``, as in ``--runs adag adag+bfloat16 adag+topk``.
``--placement`` runs each parameter-server trainer with its server on the driver, in the
Spark job (``parameter_server_location="executor"``), or both, one after the other.

The section goes into benchmarks/results.md and the plots into docs/zoo/, or both into
``--out DIR``. ``--json`` writes every run's figures; with compressed runs, a table of
each run's test accuracy over the seeds (mean, min-max, and the difference to the same
run uncompressed) follows, joining the runs of ``--include``'s earlier JSON files.
"""

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

MODELS = ("mlp", "cnn", "lstm", "vit", "embedding")
# Run name: (trainer class, extra arguments); "fit" is Keras's own.
RUNS = {
    "fit": (None, {}),
    # `fit` at 2 workers' global batch: what AllReduceTrainer's steps take.
    "fit2x": (None, {"batch_scale": 2}),
    "allreduce": ("AllReduceTrainer", {"num_workers": 2}),
    "single": ("SingleTrainer", {}),
    "adag": ("ADAG", {"num_workers": 2}),
    "downpour": ("DOWNPOUR", {"num_workers": 2}),
    "dynsgd": ("DynSGD", {"num_workers": 2}),
    "experimental": ("Experimental", {"num_workers": 2}),
    "aeasgd": ("AEASGD", {"num_workers": 2}),
    "eamsgd": ("EAMSGD", {"num_workers": 2}),
    "diloco": ("DiLoCo", {"num_workers": 2}),
    "fedadam": ("FedAdam", {"num_workers": 2}),
}
LEVELS = 16  # the embedding model's pixel tokens


def build_model(kind):
    """One zoo model, uncompiled; every model reads the 784 pixels of a row (scaled to [0, 1],
    or quantized to `LEVELS` integer tokens for the embedding model) and outputs 10 classes.
    """
    import keras
    from keras import layers

    if kind == "mlp":
        return keras.Sequential([keras.Input((784,)), layers.Dense(500, activation="relu"),
                                 layers.Dense(500, activation="relu"),
                                 layers.Dense(10, activation="softmax")], name="mlp")
    if kind == "cnn":
        return keras.Sequential([
            keras.Input((28, 28, 1)),
            layers.Conv2D(16, 3, padding="same"), layers.BatchNormalization(), layers.ReLU(),
            layers.MaxPooling2D(),
            layers.Conv2D(32, 3, padding="same"), layers.BatchNormalization(), layers.ReLU(),
            layers.MaxPooling2D(),
            layers.Flatten(), layers.Dropout(0.25), layers.Dense(64, activation="relu"),
            layers.Dense(10, activation="softmax")], name="cnn")
    if kind == "lstm":
        return keras.Sequential([keras.Input((28, 28)), layers.LSTM(64),
                                 layers.Dense(10, activation="softmax")], name="lstm")
    if kind == "vit":
        # 16 patches of 7x7 pixels, each with its position one-hot (see `arrange`), 2 blocks
        # of self-attention.
        inputs = keras.Input((16, 49 + 16))
        x = layers.Dense(32)(inputs)
        for _ in range(2):
            attended = layers.MultiHeadAttention(4, 16)(x, x)
            x = layers.LayerNormalization()(x + attended)
            x = layers.LayerNormalization()(x + layers.Dense(32)(
                layers.Dense(64, activation="gelu")(x)))
        x = layers.GlobalAveragePooling1D()(x)
        return keras.Model(inputs, layers.Dense(10, activation="softmax")(x), name="vit")
    if kind == "embedding":
        inputs = keras.Input((784,), dtype="int32")
        x = layers.Embedding(LEVELS, 4)(inputs)
        x = layers.Reshape((28, 28 * 4))(x)
        x = layers.Dense(32, activation="relu")(x)
        x = layers.Flatten()(x)
        return keras.Model(inputs, layers.Dense(10, activation="softmax")(x), name="embedding")
    raise ValueError(f"Unknown zoo model {kind!r}; choose from {', '.join(MODELS)}.")


def arrange(kind, images):
    """Pixels (n, 28, 28) uint8 as the model ``kind`` reads them: (n, input shape)."""
    import numpy as np

    n = len(images)
    if kind == "embedding":
        return (images // (256 // LEVELS)).reshape(n, 784).astype("int32")
    scaled = images.astype("float32") / 255.0
    if kind == "vit":
        patches = scaled.reshape(n, 4, 7, 4, 7).transpose(0, 1, 3, 2, 4).reshape(n, 16, 49)
        positions = np.broadcast_to(np.eye(16, dtype="float32"), (n, 16, 16))
        return np.ascontiguousarray(np.concatenate([patches, positions], axis=2))
    return scaled.reshape({"mlp": (n, 784), "cnn": (n, 28, 28, 1), "lstm": (n, 28, 28)}[kind])


class EpochClock:
    """A Keras callback that records (seconds since `start`, val_accuracy) at epoch ends and
    the moment of the first training batch (for `fit`)."""

    def __new__(cls, start):
        import keras

        class Clock(keras.callbacks.Callback):
            def __init__(self):
                super().__init__()
                self.points, self.first_step = [], None

            def on_train_batch_end(self, batch, logs=None):
                if self.first_step is None:
                    self.first_step = time.perf_counter() - start

            def on_epoch_end(self, epoch, logs=None):
                self.points.append((time.perf_counter() - start,
                                    (logs or {}).get("val_accuracy")))

        return Clock()


def steps_rate(records):
    """Samples/s between each worker's first and last step record (see training.py)."""
    from training import steps_rate as rate

    class Records:
        def get_history(self):
            return records

        def get_executor_history(self, worker):
            return [record for record in records if record["worker_id"] == worker]

    return rate(Records())


def steps_rate_by_epoch(records):
    """`steps_rate` of each epoch's records apart, summed: for a trainer that runs an epoch
    per Spark job (AllReduceTrainer with validation), whose jobs' starts would count."""
    samples = seconds = 0.0
    for epoch in sorted({record["epoch"] for record in records}):
        of_epoch = [record for record in records if record["epoch"] == epoch]
        rate = steps_rate(of_epoch)
        if rate:
            count = sum(record["batch_size"] for record in of_epoch)
            samples, seconds = samples + count, seconds + count / rate
    return samples / seconds if seconds else None


def has_server(trainer_name):
    """Whether the trainer of that name runs a parameter server (takes a placement)."""
    from distkeras import trainers

    return trainer_name is not None and issubclass(getattr(trainers, trainer_name),
                                                   trainers.AsynchronousDistributedTrainer)


def run(name, kind, train, data, epochs, batch_size, placement=None, seed=1):
    """Trains the model ``kind`` with the run ``name`` (a parameter-server trainer with its
    server at ``placement``, when given) from Keras's random seed ``seed``; returns its
    measurements."""
    import keras

    from distkeras import trainers
    from distkeras.tools.experiments import test_accuracy

    (x_train, y_train), (x_val, y_val), (x_test, labels) = data
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    model = build_model(kind)
    base, _, compression = name.partition("+")
    trainer_name, extra = RUNS[base.split("/")[0]]
    if "/" in base:  # "adag/4": that trainer with communication_window=4
        extra = dict(extra, communication_window=int(base.split("/")[1]))
    if compression:  # "adag+bfloat16": that trainer with compression="bfloat16"
        extra = dict(extra, compression=compression)
    start = time.perf_counter()
    clock = EpochClock(start)
    if trainer_name is None:
        model.compile(optimizer="adam", loss="categorical_crossentropy", metrics=["accuracy"])
        model.fit(x_train, y_train, batch_size=batch_size * extra.get("batch_scale", 1),
                  epochs=epochs, verbose=0,
                  validation_data=(x_val, y_val), callbacks=[clock])
        trained, first_step = model, clock.first_step
        # From the first epoch's end to the last's (the first holds the compiles).
        span = clock.points[-1][0] - clock.points[0][0] if epochs > 1 else \
            clock.points[0][0] - first_step
        rate = len(x_train) * max(epochs - 1, 1) / span
    else:
        arguments = dict(keras_model=model, worker_optimizer="adam",
                         loss="categorical_crossentropy", metrics=["accuracy"],
                         batch_size=batch_size, num_epoch=epochs, features_col="features",
                         label_col="label")
        arguments.update(extra)
        if placement is not None:
            arguments.update(parameter_server_location=placement)
        trainer = getattr(trainers, trainer_name)(**arguments)
        wall_start = time.time()
        trained = trainer.train(train, verbose=0, validation_data=(x_val, y_val),
                                callbacks=[clock])
        records = trainer.get_history()
        first_step = min(record["timestamp"] for record in records) - wall_start
        rate = steps_rate_by_epoch(records) if trainer_name == "AllReduceTrainer" \
            else steps_rate(records)
    seconds = time.perf_counter() - start
    if placement is not None:
        name = f"{name} ({placement})"
    return {"run": name, "seconds": seconds, "first_step": first_step, "rate": rate,
            "accuracy": test_accuracy(trained, x_test, labels), "points": clock.points}


def load(spark, kind, limit, validation):
    """The training DataFrame (features as the model reads them, one-hot labels) and the
    numpy arrays: training, validation (the first ``validation`` test images) and test."""
    import numpy as np

    import pyarrow as pa
    import pyarrow.parquet as pq

    from distkeras.datasets import load_fashion_mnist_numpy

    images, labels = load_fashion_mnist_numpy("train")
    images, labels = images[:limit], labels[:limit]
    test_images, test_labels = load_fashion_mnist_numpy("test")
    x, y = arrange(kind, images), np.eye(10, dtype="float32")[labels]
    x_test = arrange(kind, test_images)
    y_test = np.eye(10, dtype="float32")[test_labels]
    path = os.path.join("/tmp", f"distkeras-zoo-{kind}-{limit}.parquet")
    table = pa.table({name: pa.FixedSizeListArray.from_arrays(
        pa.array(values.reshape(-1).astype("float32")), values[0].size)
        for name, values in (("features", x), ("label", y))})
    pq.write_table(table, path)
    frame = spark.read.parquet(path).repartition(2).cache()
    frame.count()
    return frame, ((x, y), (x_test[:validation], y_test[:validation]), (x_test, test_labels))


def plot(kind, results, folder):
    """Validation accuracy against seconds, a line per run; returns the PNG's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 4))
    for result in results:
        points = [(0.0, None)] + result["points"]
        axis.plot([p[0] for p in points[1:]], [p[1] for p in points[1:]], marker="o",
                  label=result["run"])
    axis.set_xlabel("seconds since the start")
    axis.set_ylabel("validation accuracy")
    axis.set_title(f"{kind} on Fashion-MNIST")
    axis.legend()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{kind}.png")
    figure.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(figure)
    return path


def compression_table(records):
    """A Markdown table of each compressed run's test accuracy over its seeds against the
    same run uncompressed: model, trainer, compression, seeds, mean, min-max, and the mean's
    difference to float32's in points.

    Args:
        records: ``{"model", "run", "seed", "accuracy"}`` dicts, ``run`` as named in
            ``--runs`` (``adag+bfloat16``), and ``placement`` where one was given.
    """
    groups = {}
    for record in records:
        base, _, compression = record["run"].partition("+")
        if record.get("placement"):
            base += f" ({record['placement']})"
        groups.setdefault((record["model"], base, compression), []).append(record["accuracy"])
    rows = []
    for (model, base, compression), values in groups.items():
        reference = groups.get((model, base, ""))
        if not compression and not any(key[:2] == (model, base) and key[2]
                                       for key in groups):
            continue  # a run with no compressed counterpart
        mean = sum(values) / len(values)
        difference = "-" if not compression or reference is None else \
            f"{(mean - sum(reference) / len(reference)) * 100:+.2f}"
        rows.append([model, base, compression or "none", len(values), f"{mean:.4f}",
                     f"{min(values):.4f}-{max(values):.4f}", difference])
    order = {name: place for place, name in enumerate(MODELS)}
    rows.sort(key=lambda row: (order.get(row[0], len(order)), row[1],
                               row[2] != "none", row[2]))
    lines = ["| model | trainer | compression | seeds | mean accuracy | min-max | "
             "points vs none |", "|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def run_name(text):
    base, plus, compression = text.partition("+")
    name, _, window = base.partition("/")
    if name not in RUNS or (window and not window.isdigit()) or (
            plus and compression.partition(":")[0] not in ("bfloat16", "topk")):
        raise argparse.ArgumentTypeError(f"{text!r}: expected one of {', '.join(RUNS)}, "
                                         "optionally with /WINDOW (adag/4) and "
                                         "+bfloat16 or +topk (adag+topk)")
    return text


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--runs", nargs="+", default=list(RUNS), type=run_name,
                        help=f"Of {', '.join(RUNS)}; NAME/W sets communication_window=W, "
                             "NAME+bfloat16 or NAME+topk its compression.")
    parser.add_argument("--limit", type=int, default=12000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--validation", type=int, default=2000)
    parser.add_argument("--seeds", nargs="+", type=int, default=[1],
                        help="Keras random seeds (the models' initial weights, fit's "
                             "order): each run once per seed.")
    parser.add_argument("--title", default="Model zoo")
    parser.add_argument("--placement", nargs="+", choices=("driver", "executor"),
                        help="Where the parameter-server trainers' server runs (several: "
                             "each run once per placement). Default: the trainers' own.")
    parser.add_argument("--out", help="Write the section (results.md) and the plots into "
                                      "this folder, not benchmarks/ and docs/zoo/.")
    parser.add_argument("--json", help="Also write every run's figures to this JSON file.")
    parser.add_argument("--include", nargs="+", default=[],
                        help="JSON files of earlier runs (--json) whose runs join the "
                             "compression table.")
    args = parser.parse_args()
    import report
    from distkeras.session import local_spark_session, warm_up_executors

    spark = local_spark_session("local[2]")
    warm_up_executors(spark, 2)
    folder = args.out or os.path.join(os.path.dirname(__file__), "..", "docs", "zoo")
    os.makedirs(folder, exist_ok=True)
    sections, records = [], []
    for kind in args.models:
        frame, data = load(spark, kind, args.limit, args.validation)
        results = []
        for name in args.runs:
            server = has_server(RUNS[name.partition("+")[0].split("/")[0]][0])
            for placement in (args.placement or [None]) if server else [None]:
                for seed in args.seeds:
                    result = run(name, kind, frame, data, args.epochs, args.batch_size,
                                 placement, seed)
                    records.append({"model": kind, "run": name, "placement": placement,
                                    "seed": seed,
                                    **{key: result[key] for key in
                                       ("seconds", "first_step", "rate", "accuracy")}})
                    if len(args.seeds) > 1:
                        result["run"] += f" seed {seed}"
                    print(kind, result, flush=True)
                    results.append(result)
                    if args.json:  # after every run: a long study keeps what it measured
                        with open(args.json, "w", encoding="utf-8") as handle:
                            json.dump(records, handle, indent=1)
        frame.unpersist()
        fit = next((r for r in results if r["run"] == "fit"), None)
        rows = [[r["run"], f"{r['seconds']:.1f}",
                 f"{r['seconds'] / fit['seconds']:.2f}" if fit else "-",
                 f"{r['first_step']:.1f}",
                 "-" if r["rate"] is None else f"{r['rate']:.0f}",
                 f"{r['rate'] / fit['rate']:.2f}" if fit and r["rate"] else "-",
                 f"{r['accuracy']:.4f}",
                 f"{(r['accuracy'] - fit['accuracy']) * 100:+.2f}" if fit else "-",
                 " ".join(f"{s:.0f}s:{a:.3f}" for s, a in r["points"] if a is not None)]
                for r in results]
        png = plot(kind, results, folder)
        sections.append(f"### {kind}\n\n" + report.table(
            ["run", "wall s", "x fit", "start to first step s", "steps samples/s",
             "x fit", "test accuracy", "points vs fit", "val accuracy after each epoch"],
            rows) + f"\n\n![{kind}](zoo/{os.path.basename(png)})\n")
    body = (f"Fashion-MNIST, the first {args.limit} training images, {args.epochs} epochs, "
            f"batch {args.batch_size}, Adam; every trainer at its defaults with 2 workers "
            "(SingleTrainer: 1); `local[2]`, executors warmed up; `fit` in the driver "
            f"process. Validation: the first {args.validation} test images after each "
            "epoch; test accuracy on all 10,000.\n\n" + "\n".join(sections))
    earlier = report.included(args.include)
    if any("+" in record["run"] for record in earlier + records):
        body += "\n### Accuracy with compression\n\n" + compression_table(earlier + records)
    report.write_section(args.title, body, **(
        {"doc": os.path.join(args.out, "results.md")} if args.out else {}))
    spark.stop()


if __name__ == "__main__":
    main()
