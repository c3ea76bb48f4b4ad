"""The ``train`` command: trains a ``.keras`` model on Parquet data with a distributed
trainer, writes the trained model (and its histories), and keeps a status file updated
for job servers."""

import json
import logging
import sys
import threading
import time

from distkeras.cli import common
from distkeras.cli.common import CommandError, error_message, load_model, read_parquet
from distkeras.cli.train_args import (build_trainer, check_arguments, check_distinct_outputs,
                                      check_outputs, options_from_args, train_parser)
from distkeras.data.storage import replacing_local_file
from distkeras.session import warm_up_executors
from distkeras.training import options as train_options

logger = logging.getLogger(__name__)


def write_status(path, state, **details):
    """Replaces the status file with ``{"state": ..., "time": ..., **details}``.

    Raises:
        CommandError: Naming ``--status`` and its path (not the temporary file's), when
            the file cannot be written.
    """
    if path is None:
        return
    try:
        with replacing_local_file(path) as temporary, \
                open(temporary, "w", encoding="utf-8") as handle:
            json.dump({"state": state, "time": time.time(), **details}, handle)
    except OSError as error:
        raise CommandError(f"--status {path}: cannot write it "
                           f"({error.strerror or error})") from error


def _warm_up(spark):
    try:
        warm_up_executors(spark)
    except Exception as error:  # only an optimization: training reports real problems
        logger.info("Executor warm-up skipped: %s", error)


def _trainer_from_config(trainer_class, model, path):
    try:
        with open(path, encoding="utf-8") as handle:
            config = json.load(handle)
        return trainer_class.from_config(config, keras_model=model)
    except (OSError, ValueError, TypeError) as error:
        raise CommandError(f"bad trainer configuration {path}: {error}") from error


def command_train(argv):
    """Runs ``distkeras train`` with the arguments ``argv``; returns the exit status."""
    # --trainer decides which other options exist, so read it first.
    first, _ = train_parser(add_help=False).parse_known_args(argv)
    try:
        # The registry loads every trainer (numpy, pyarrow, pyspark): only once a command
        # runs, so that `--help` and the arguments' mistakes answer at once.
        from distkeras.training.registry import get_trainer_class

        trainer_class = get_trainer_class(first.trainer)
    except ValueError as error:
        raise CommandError(str(error)) from error
    args = train_parser(trainer_class).parse_args(argv)
    _check_one_model(trainer_class)
    try:
        return _train(trainer_class, args)
    except Exception as error:
        write_status(args.status, "failed", error=f"{type(error).__name__}: {error_message(error)}")
        raise
    except KeyboardInterrupt:
        # Ctrl-C or SIGINT: the status said "training" to whoever follows it, for good.
        write_status(args.status, "failed", error="KeyboardInterrupt: interrupted")
        raise


def _check_one_model(trainer_class):
    """Refuses, before Spark starts, a trainer whose result is several models: ``--output``
    holds one, and an ensemble trained for nothing would be lost."""
    # Here, not above: the trainers import pyspark, which waits for a command to run.
    from distkeras.training.sequential import EnsembleTrainer

    if issubclass(trainer_class, EnsembleTrainer):
        raise CommandError(f"{trainer_class.__name__} returns several models and --output "
                           "holds one: train an ensemble from Python (trainer.train(df) "
                           "returns the list, save each with distkeras.utils.save_model), or "
                           "choose another --trainer")


def _train(trainer_class, args):
    write_status(args.status, "starting")
    options = options_from_args(args)  # the flags' mistakes, before Spark starts
    check_distinct_outputs(args)
    if not args.trainer_config:  # a configuration file replaces the flags
        check_arguments(trainer_class, args)
    spark = common.spark_session(args.master, args.spark_conf, args.remote)
    # The executors' Python workers start (and import Keras) while the driver loads the
    # model and reads the data's schema: seconds saved on every job.
    warm_up = threading.Thread(target=_warm_up, args=(spark,), daemon=True)
    warm_up.start()
    # Here, not above: numpy waits for a command to run (`distkeras --help` answers at once).
    from distkeras.keras_io import archives
    from distkeras.training.history import save_history

    try:
        check_outputs(args)
        dataframe = read_parquet(spark, args.data)
        model = load_model(args.model)
        if args.trainer_config:
            trainer = _trainer_from_config(trainer_class, model, args.trainer_config)
        else:
            trainer = build_trainer(trainer_class, model, args)
    finally:
        # Even on a mistake: exiting while the warm-up job runs kills its Python workers,
        # and Spark logs their "crash" after our one-line error.
        warm_up.join()
    write_status(args.status, "training")
    trained = trainer.train(dataframe, **train_options.train_arguments(options, spark))
    if isinstance(trained, list):  # a trainer of your own that returns several models
        raise CommandError(f"{trainer_class.__name__} returned several models; save them "
                           "from Python")
    archives.save_model(trained, args.output)
    if args.history:
        save_history(trainer.get_history(), args.history)
    if args.validation_history:
        save_history(trainer.get_validation_history(), args.validation_history)
    history = trainer.get_history()
    samples = sum(record.get("batch_size", 0) for record in history)
    seconds = trainer.get_training_time()
    final_loss = history[-1].get("loss", float("nan")) if history else float("nan")
    sys.stdout.write(f"trained {trainer_class.__name__} in {seconds:.1f} s, "
                     f"{samples / seconds:.0f} samples/s, final loss {final_loss:.4f}; "
                     f"model written to {args.output}\n")
    write_status(args.status, "finished", training_time=seconds, samples=samples)
    return 0
