"""Sweeps: train every combination of trainer, workers and window; measure; plot.

From Python (with a SparkSession started before Keras is imported)::

    from distkeras.tools.experiments import sweep
    results = sweep(spark, trainers=("SingleTrainer", "ADAG", "DOWNPOUR"), workers=(1, 2),
                    windows=(4, 12), output_dir="experiments")

From the shell::

    python -m distkeras.tools.experiments sweep --trainer ADAG DOWNPOUR --workers 1 2 \\
        --window 1 4 12 32 --epochs 1 --dataset fashion_mnist [--limit N] \\
        [--master local[2]] [--output-dir DIR]

Each run trains a fresh model with the same initial weights (``seed``) on the same cached
DataFrame and is evaluated on the test set on the driver. ``output_dir`` receives
``results.csv`` (rewritten after every run, so a long sweep that fails keeps what it did),
``by_workers.png`` and ``by_window.png`` (also drawn, of the finished runs, when a run
fails).
"""

import argparse
import csv
import inspect
import logging
import os
import sys
import time

import numpy as np

from distkeras.data.datasets import load_fashion_mnist, load_fashion_mnist_numpy
from distkeras.data.storage import replacing_local_file
from distkeras.session import default_parallelism, local_spark_session, warm_up_executors
from distkeras.tools.plotting import plot_comparison
from distkeras.training import registry

logger = logging.getLogger(__name__)

COLUMNS = ("trainer", "workers", "window", "epochs", "wall_time_s", "samples_per_s",
           "test_accuracy", "mean_staleness")
_DECIMALS = {"wall_time_s": 3, "samples_per_s": 1, "test_accuracy": 4, "mean_staleness": 3}
DEFAULT_SEED = 1234


def build_mlp(input_dim=784, hidden=(500, 500), num_classes=10):
    """The benchmark model: an uncompiled MLP 784-500-500-10 (ReLU, softmax output)."""
    import keras

    layers = [keras.Input((input_dim,))]
    layers += [keras.layers.Dense(units, activation="relu") for units in hidden]
    layers.append(keras.layers.Dense(num_classes, activation="softmax"))
    name = "mlp_" + "_".join(str(size) for size in (input_dim, *hidden, num_classes))
    return keras.Sequential(layers, name=name)


def _load_fashion_mnist(spark, limit=None, test_limit=None):
    # Packed features: the same values, handed to the workers faster (`distkeras.data.tensors`).
    train = load_fashion_mnist(spark, "train", limit=limit, packed=True).cache()
    images, labels = load_fashion_mnist_numpy("test")
    if test_limit is not None:
        images, labels = images[:test_limit], labels[:test_limit]
    images = images.reshape(len(images), -1).astype(np.float32) / 255.0
    return train, (images, labels.astype(np.int64))


# name -> loader(spark, limit, test_limit) returning (training DataFrame with `features`
# (an array or packed) and one-hot `label`, (test features, integer test labels)).
DATASETS = {"fashion_mnist": _load_fashion_mnist}


# -- validation ---------------------------------------------------------------------------

def _positive_ints(name, values):
    values = [values] if isinstance(values, (int, np.integer)) else list(values)
    if not values:
        raise ValueError(f"`{name}` must hold at least one value. Received: {name}={values!r}")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"`{name}` must hold integers >= 1. Received: {name}={values!r}")
    return list(dict.fromkeys(int(value) for value in values))  # unique, in order


def _positive_int_value(name, value, optional=False):
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        expected = "None or an integer >= 1" if optional else "an integer >= 1"
        raise ValueError(f"`{name}` must be {expected}. Received: {name}={value!r}")


def _check_output_dir(output_dir, name="`output_dir`"):
    """Refuses an ``output_dir`` that is a file: ``os.makedirs`` said "File exists"."""
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise ValueError(f"{name} {output_dir} is a file: give a folder for results.csv "
                         "and the plots.")


def resolve_trainers(trainers):
    """``{name: class}`` for trainer names (see `distkeras.training.registry`) or Trainer
    classes.

    Raises:
        ValueError: For an unknown name, listing the available trainers.
    """
    if isinstance(trainers, str) or inspect.isclass(trainers):
        trainers = [trainers]
    resolved = {}
    for trainer in trainers:
        if inspect.isclass(trainer):
            resolved[trainer.__name__] = trainer
        else:
            resolved[str(trainer)] = registry.get_trainer_class(str(trainer))
    if not resolved:
        raise ValueError("`trainers` must name at least one trainer, for example ('ADAG',).")
    return resolved


def _parameters(trainer_class):
    return inspect.signature(trainer_class.__init__).parameters


def uses_workers(trainer_class):
    """Whether the trainer runs a number of replicas (``num_workers`` or ``num_ensembles``)."""
    parameters = _parameters(trainer_class)
    return "num_workers" in parameters or "num_ensembles" in parameters


def uses_window(trainer_class):
    """Whether the trainer has a ``communication_window``."""
    return "communication_window" in _parameters(trainer_class)


def plan(trainer_classes, workers, windows):
    """The runs of a sweep: ``(name, class, workers, window)``; window None where unused.

    A trainer without workers (SingleTrainer) runs once with 1 worker; one without a
    communication window runs once per number of workers.
    """
    runs = []
    for name, trainer_class in trainer_classes.items():
        for count in (workers if uses_workers(trainer_class) else [1]):
            for window in (windows if uses_window(trainer_class) else [None]):
                runs.append((name, trainer_class, count, window))
    return runs


def build_trainer(trainer_class, keras_model, workers=1, window=None, *, epochs=1,
                  batch_size=32, worker_optimizer="adam", seed=None):
    """A trainer for a sweep run: categorical cross-entropy on ``features`` / ``label``."""
    parameters = _parameters(trainer_class)
    kwargs = dict(keras_model=keras_model, worker_optimizer=worker_optimizer,
                  loss="categorical_crossentropy", metrics=["accuracy"],
                  batch_size=batch_size, num_epoch=epochs, features_col="features",
                  label_col="label")
    if "num_workers" in parameters:
        kwargs["num_workers"] = workers
    elif "num_ensembles" in parameters:
        kwargs["num_ensembles"] = workers
    if window is not None and "communication_window" in parameters:
        kwargs["communication_window"] = window
    if seed is not None and "seed" in parameters:
        kwargs["seed"] = seed
    return trainer_class(**kwargs)


# -- measuring ------------------------------------------------------------------------------

def test_accuracy(model, images, labels, batch_size=1024):
    """Accuracy of a model, or of an ensemble (a list: mean of the members' outputs)."""
    models = model if isinstance(model, (list, tuple)) else [model]
    outputs = np.mean([np.asarray(member.predict(images, batch_size=batch_size, verbose=0))
                       for member in models], axis=0)
    return float((outputs.argmax(axis=1) == labels).mean())


test_accuracy.__test__ = False  # not a pytest test, despite its name


def mean_staleness(trainer):
    """Mean staleness of the commits of a parameter-server trainer; None without a server."""
    get_staleness = getattr(trainer, "get_staleness", None)
    if get_staleness is None:
        return None
    values = [staleness for _, staleness in get_staleness()]
    return float(np.mean(values)) if values else None


def run_one(dataframe, test_data, trainer_class, workers=1, window=None, *, epochs=1,
            batch_size=32, worker_optimizer="adam", model_builder=None, seed=DEFAULT_SEED,
            num_samples=None, name=None):
    """Trains one configuration and measures it.

    Returns:
        ``(result, trainer)``: the result dict (the `COLUMNS`) and the trained trainer (for
        its history, e.g. `distkeras.tools.plotting.plot_history`).
    """
    import keras

    keras.backend.clear_session()
    if seed is not None:
        keras.utils.set_random_seed(seed)  # the same initial weights for every run
    model = (model_builder or build_mlp)()
    trainer = build_trainer(trainer_class, model, workers, window, epochs=epochs,
                            batch_size=batch_size, worker_optimizer=worker_optimizer, seed=seed)
    trained = trainer.train(dataframe)
    seconds = trainer.get_training_time()
    if num_samples is None:
        num_samples = dataframe.count()
    images, labels = test_data
    result = {
        "trainer": name or trainer_class.__name__,
        "workers": workers,
        "window": window,
        "epochs": epochs,
        "wall_time_s": seconds,
        "samples_per_s": num_samples * epochs / seconds,
        "test_accuracy": test_accuracy(trained, images, labels),
        "mean_staleness": mean_staleness(trainer),
    }
    return result, trainer


# -- output ---------------------------------------------------------------------------------

def _cell(column, value):
    if value is None:
        return ""
    if column in _DECIMALS:
        return f"{float(value):.{_DECIMALS[column]}f}"
    return str(value)


def write_csv(results, path):
    """Writes results (dicts with the `COLUMNS`) to ``path`` atomically."""
    with replacing_local_file(path) as temporary, \
            open(temporary, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for result in results:
            writer.writerow([_cell(column, result.get(column)) for column in COLUMNS])


def read_csv(path):
    """Reads `write_csv` output back into result dicts (numbers as numbers, '' as None)."""
    integers, floats = {"workers", "window", "epochs"}, set(_DECIMALS)
    rows = []
    with open(path, newline="", encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            for key, value in row.items():
                if value == "":
                    row[key] = None
                elif key in integers:
                    row[key] = int(value)
                elif key in floats:
                    row[key] = float(value)
            rows.append(row)
    return rows


def format_table(results):
    """Results as a fixed-width text table."""
    headers = {"trainer": "trainer", "workers": "workers", "window": "window",
               "epochs": "epochs", "wall_time_s": "wall time (s)",
               "samples_per_s": "samples/s", "test_accuracy": "test accuracy",
               "mean_staleness": "staleness"}
    cells = [[_cell(column, result.get(column)) or "-" for column in COLUMNS]
             for result in results]
    widths = [max([len(headers[column])] + [len(row[index]) for row in cells])
              for index, column in enumerate(COLUMNS)]
    lines = ["  ".join(headers[column].ljust(width) if index == 0 else
                       headers[column].rjust(width)
                       for index, (column, width) in enumerate(zip(COLUMNS, widths)))]
    for row in cells:
        lines.append("  ".join(cell.ljust(width) if index == 0 else cell.rjust(width)
                               for index, (cell, width) in enumerate(zip(row, widths))))
    return "\n".join(lines) + "\n"


def plot_results(results, output_dir, title=None):
    """Writes ``by_workers.png`` and ``by_window.png``; returns their paths."""
    paths = []
    for by in ("workers", "window"):
        path = os.path.join(output_dir, f"by_{by}.png")
        plot_comparison(results, path, by=by, title=title)
        paths.append(path)
    return paths


# -- the sweep ------------------------------------------------------------------------------

def _even_partitions(train, count):
    """``train`` cached in ``count`` partitions of equal size (as is for one worker).

    The slowest worker sets an asynchronous run's wall time, and Spark's split of a file
    is uneven (32768 and 27232 rows for Fashion-MNIST on 2 cores), so every run with
    ``count`` workers trains on the same evenly spread copy, shuffled once, outside the
    timing.
    """
    if count == 1:
        return train
    frame = train.repartition(count).cache()
    frame.count()
    return frame


def sweep(spark, trainers=("ADAG",), workers=(1, 2), windows=(12,), epochs=1,
          dataset="fashion_mnist", limit=None, batch_size=32, model_builder=None,
          output_dir="experiments", worker_optimizer="adam", seed=DEFAULT_SEED,
          test_limit=None):
    """Trains every combination of trainer, workers and window, and measures each run.

    SingleTrainer runs once (1 worker); trainers without a communication window run once
    per number of workers. Every run starts from the same initial weights (``seed``) and
    trains on the same cached DataFrame; its test accuracy is computed on the driver.

    Args:
        spark: The SparkSession (start it before importing Keras).
        trainers: Trainer names (see `distkeras.training.registry`) or Trainer classes.
        workers: Numbers of workers to try.
        windows: Communication windows to try.
        epochs: Passes over the data in every run.
        dataset: A key of `DATASETS` (``"fashion_mnist"``).
        limit: Train on the first ``limit`` rows only.
        batch_size: Rows per minibatch.
        model_builder: A function returning a fresh uncompiled Keras model (784 inputs,
            10 softmax outputs); default `build_mlp` (784-500-500-10).
        output_dir: Folder for ``results.csv``, ``by_workers.png`` and ``by_window.png``.
        worker_optimizer: Every replica's Keras optimizer.
        seed: Seed of the initial weights (None: fresh ones per run).
        test_limit: Evaluate on the first ``test_limit`` test images only.

    Returns:
        A list of result dicts with the keys of `COLUMNS` (``window`` and
        ``mean_staleness`` are None where they do not apply).
    """
    trainer_classes = resolve_trainers(trainers)
    workers = _positive_ints("workers", workers)
    windows = _positive_ints("windows", windows)
    _positive_int_value("epochs", epochs)
    _positive_int_value("batch_size", batch_size)
    _positive_int_value("limit", limit, optional=True)
    _positive_int_value("test_limit", test_limit, optional=True)
    if dataset not in DATASETS:
        raise ValueError(f"Unknown dataset {dataset!r}. Available datasets: "
                         f"{', '.join(sorted(DATASETS))}.")
    _check_output_dir(output_dir)
    runs = plan(trainer_classes, workers, windows)
    parallelism = default_parallelism(spark)
    if max(count for _, _, count, _ in runs) > parallelism:
        logger.warning("Some runs use more workers than Spark runs tasks at once (%d): "
                       "those workers take turns and their wall times are not comparable.",
                       parallelism)
    os.makedirs(output_dir, exist_ok=True)
    csv_path = os.path.join(output_dir, "results.csv")

    train, test_data = DATASETS[dataset](spark, limit=limit, test_limit=test_limit)
    even = {}  # workers -> the data cached in that many even partitions
    results = []

    def plot(note=""):
        title = (f"{dataset}: {num_samples} samples, {epochs} "
                 f"epoch{'s' if epochs != 1 else ''}, batch {batch_size}{note}")
        plot_results(results, output_dir, title=title)

    try:
        num_samples = train.count()  # also fills the cache
        logger.info("%s: %d training rows, %d test rows; %d runs", dataset, num_samples,
                    len(test_data[1]), len(runs))
        for index, (name, trainer_class, count, window) in enumerate(runs, start=1):
            logger.info("Run %d/%d: %s, %d worker(s), window %s", index, len(runs), name,
                        count, "-" if window is None else window)
            if count not in even:
                even[count] = _even_partitions(train, count)
            started = time.time()
            result, _ = run_one(even[count], test_data, trainer_class, count, window,
                                epochs=epochs, batch_size=batch_size,
                                worker_optimizer=worker_optimizer,
                                model_builder=model_builder, seed=seed,
                                num_samples=num_samples, name=name)
            results.append(result)
            write_csv(results, csv_path)
            logger.info("Run %d/%d: %.1f s training, %.0f samples/s, test accuracy %.4f "
                        "(%.1f s with evaluation)", index, len(runs), result["wall_time_s"],
                        result["samples_per_s"], result["test_accuracy"],
                        time.time() - started)
    except Exception:
        if results:  # the finished runs keep their plots, as they keep their CSV rows
            logger.error("Run %d/%d failed: the %d finished runs are in %s and its plots",
                         len(results) + 1, len(runs), len(results), csv_path)
            plot(f" ({len(results)} of {len(runs)} runs: the sweep stopped)")
        raise
    finally:
        for frame in even.values():
            if frame is not train:
                frame.unpersist()
        train.unpersist()
    plot()
    logger.info("Wrote %s and plots in %s", csv_path, output_dir)
    return results


# -- command line ---------------------------------------------------------------------------

class _OneLineParser(argparse.ArgumentParser):
    """Argument errors as one line on stderr, exit status 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except None ones (their help says what unset means)."""

    def _get_help_string(self, action):
        if action.default is None:
            return action.help
        return super()._get_help_string(action)


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def _parser():
    parser = _OneLineParser(
        prog="python -m distkeras.tools.experiments",
        description="Sweeps of distkeras trainers on local Spark: wall time, throughput, "
                    "test accuracy and staleness, as a CSV table and plots.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND",
                                     parser_class=_OneLineParser)
    command = commands.add_parser(
        "sweep", help="train every trainer x workers x window combination",
        formatter_class=_HelpFormatter,
        description="Train every trainer x workers x window combination on local Spark; "
                    "write results.csv, by_workers.png and by_window.png.")
    command.add_argument("--trainer", nargs="+", default=["ADAG"], metavar="NAME",
                         help="trainers (distkeras.training.registry names)")
    command.add_argument("--workers", nargs="+", type=_positive_int, default=[1, 2],
                         metavar="N", help="numbers of workers")
    command.add_argument("--window", nargs="+", type=_positive_int, default=[12],
                         metavar="N", help="communication windows")
    command.add_argument("--epochs", type=_positive_int, default=1, help="passes over the data")
    command.add_argument("--batch-size", type=_positive_int, default=32, help="minibatch size")
    command.add_argument("--dataset", choices=sorted(DATASETS), default="fashion_mnist",
                         help="the data set")
    command.add_argument("--limit", type=_positive_int, default=None,
                         help="train on the first N rows only (default: all)")
    command.add_argument("--test-limit", type=_positive_int, default=None,
                         help="evaluate on the first N test rows only (default: all)")
    command.add_argument("--optimizer", default="adam", help="the workers' Keras optimizer")
    command.add_argument("--seed", type=int, default=DEFAULT_SEED,
                         help="seed of the initial weights")
    command.add_argument("--master", default=None,
                         help="Spark master; unset: local[N], N the largest --workers")
    command.add_argument("--output-dir", default="experiments",
                         help="folder for results.csv and the plots")
    command.add_argument("--log-level", default="INFO",
                         choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                         help="distkeras log level (on stderr)")
    return parser


def _run_sweep(args):
    # Validate everything that needs no Spark first: a typo costs no Spark start-up.
    try:
        trainer_classes = resolve_trainers(args.trainer)
        _check_output_dir(args.output_dir, "--output-dir")
    except ValueError as error:
        sys.stderr.write(f"python -m distkeras.tools.experiments sweep: error: {error}\n")
        return 2
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s",
                                           "%H:%M:%S"))
    package_logger = logging.getLogger("distkeras")
    package_logger.addHandler(handler)
    package_logger.setLevel(args.log_level)

    master = args.master or f"local[{max(args.workers)}]"
    from pyspark.sql import SparkSession

    owns_session = SparkSession.getActiveSession() is None
    spark = local_spark_session(master, app_name="distkeras-experiments")
    try:
        # Keras (and JAX) are imported from here on, after Spark has started.
        needed = max(count for _, _, count, _ in plan(trainer_classes, args.workers, [1]))
        warm_up_executors(spark, min(needed, default_parallelism(spark)))
        results = sweep(spark, trainers=list(trainer_classes), workers=args.workers,
                        windows=args.window, epochs=args.epochs, dataset=args.dataset,
                        limit=args.limit, batch_size=args.batch_size,
                        output_dir=args.output_dir, worker_optimizer=args.optimizer,
                        seed=args.seed, test_limit=args.test_limit)
    finally:
        package_logger.removeHandler(handler)
        if owns_session:
            spark.stop()
    csv_path = os.path.join(args.output_dir, "results.csv")
    sys.stdout.write(f"results: {csv_path}\n")
    sys.stdout.write("plots: " + ", ".join(os.path.join(args.output_dir, f"by_{by}.png")
                                           for by in ("workers", "window")) + "\n")
    sys.stdout.write(format_table(results))
    return 0


def main(argv=None):
    """The command line; returns the exit status (0, 1 on a failed run, 2 on bad arguments)."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_usage(sys.stderr)
        return 2
    try:
        return _run_sweep(args)
    except (ValueError, TypeError, RuntimeError, OSError) as error:
        lines = [line for line in str(error).splitlines() if line.strip()]
        message = lines[0] if lines else type(error).__name__
        sys.stderr.write(f"python -m distkeras.tools.experiments sweep: error: {message}\n")
        return 1


if __name__ == "__main__":
    # The module's own copy, not this ``__main__`` one: its logger is then
    # `distkeras.tools.experiments`, under the package logger the command sets up.
    from distkeras.tools.experiments import main as _main
    sys.exit(_main())
