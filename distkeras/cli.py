"""The ``distkeras`` command line: train, predict, and (with Punchcard) serve jobs.

Works as an installed command and under ``spark-submit`` (``spark-submit
$(python -c 'import distkeras.cli as c; print(c.__file__)') train ...``). Every failure
ends with a one-line message on stderr and a non-zero exit status.
"""

import argparse
import inspect
import json
import logging
import os
import re
import sys
import threading
import time

from distkeras import train_options
from distkeras.errors import DistkerasError

logger = logging.getLogger(__name__)

# Trainer arguments that have their own options below; every other constructor argument of
# the chosen trainer becomes an option of its own (--rho, --momentum, --learning-rate, ...).
COMMON_ARGUMENTS = {"keras_model", "worker_optimizer", "loss", "metrics", "num_workers",
                    "num_ensembles", "batch_size", "features_col", "label_col", "num_epoch",
                    "communication_window"}


class CommandError(DistkerasError):
    """A failure to report in one line."""


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where its help already says what it is."""

    def _get_help_string(self, action):
        if action.help and "(default" in action.help:  # "(default: x)", "(default x; ...)"
            return action.help
        return super()._get_help_string(action)


def _columns(text):
    names = [name.strip() for name in text.split(",") if name.strip()]
    return names[0] if len(names) == 1 else names


def _option_value(text):
    """An option's value: JSON where it parses (numbers, lists, null), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def trainer_options(trainer_class):
    """The trainer's own constructor arguments: ``{name: default}``."""
    signature = inspect.signature(trainer_class.__init__)
    return {name: parameter.default for name, parameter in signature.parameters.items()
            if name != "self" and name not in COMMON_ARGUMENTS
            and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)}


def _add_trainer_options(parser, trainer_class):
    group = parser.add_argument_group(f"options of {trainer_class.__name__}")
    # An algorithm's trainer: its hyperparameters' own lines (`algorithms.Hyperparameter`).
    declared = {parameter.name: parameter.doc for parameter in getattr(
        getattr(trainer_class, "algorithm", None), "hyperparameters", ())}
    for name, default in trainer_options(trainer_class).items():
        flag = f"--{name.replace('_', '-')}"
        about = declared.get(name) or f"{trainer_class.__name__}'s {name}"
        if isinstance(default, bool):  # a switch: --overlap-communication / --no-...
            group.add_argument(flag, dest=f"trainer_{name}", default=default,
                               action=argparse.BooleanOptionalAction, help=about)
            continue
        kind = type(default) if isinstance(default, (int, float)) else _option_value
        group.add_argument(flag, dest=f"trainer_{name}", type=kind, metavar=name.upper(),
                           default=default if default is not inspect.Parameter.empty else None,
                           help=about)


def _train_parser(trainer_class=None, add_help=True):
    parser = argparse.ArgumentParser(
        prog="distkeras train", formatter_class=_HelpFormatter,
        add_help=add_help,
        description="Train a Keras model on Parquet data with a distributed trainer. "
                    "`distkeras train --trainer NAME --help` lists NAME's own options.")
    parser.add_argument("--data", required=add_help, help="Parquet path (any Hadoop filesystem)")
    parser.add_argument("--model", required=add_help, help="the model, a .keras archive")
    parser.add_argument("--output", required=add_help,
                        help="where to write the trained .keras")
    parser.add_argument("--trainer", default="ADAG", help="trainer class name")
    parser.add_argument("--workers", type=int, default=None,
                        help="parallel workers (default 2; not for SingleTrainer)")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the data")
    parser.add_argument("--batch-size", type=int, default=32, help="rows per minibatch")
    parser.add_argument("--window", type=int, default=None,
                        help="communication window (default: %(default)s, the trainer's own)")
    parser.add_argument("--features", default="features",
                        help="feature column(s), comma-separated for several inputs")
    parser.add_argument("--label", default="label",
                        help="label column(s), comma-separated for several outputs; \"\" "
                             "for none (a model compiled with loss=None, trained as fit(x))")
    parser.add_argument("--optimizer", default=None,
                        help="worker optimizer (default: the model's compiled one, else adam)")
    parser.add_argument("--loss", default=None,
                        help="loss (default: the model's compiled loss; required otherwise)")
    parser.add_argument("--metrics", default=None,
                        help="comma-separated metrics (default: the model's compiled ones, "
                             "else accuracy for one output with a classification "
                             "loss and none otherwise)")
    parser.add_argument("--shuffle", action="store_true", help="shuffle rows each epoch")
    parser.add_argument("--validation", default=None,
                        help="a fraction of the rows to hold out (0.1), or a Parquet path, "
                             "to evaluate after each epoch")
    parser.add_argument("--sample-weight-col", default=None,
                        help="a numeric column weighing each row's loss")
    parser.add_argument("--class-weight", default=None,
                        help='JSON object from class index to weight, e.g. \'{"1": 5}\'')
    parser.add_argument("--train-options", default=None,
                        help="JSON file of train options (shuffle, validation, "
                             "sample_weight_col, class_weight); the flags above override it")
    parser.add_argument("--history", default=None, help="where to write the history (JSON)")
    parser.add_argument("--validation-history", default=None,
                        help="where to write the validation history (JSON)")
    parser.add_argument("--master", default=None,
                        help="Spark master (default: spark-submit's, else local[*])")
    _add_conf_option(parser)
    parser.add_argument("--trainer-config", default=None,
                        help="JSON file of the trainer's get_config(); replaces the training "
                             "options above")
    parser.add_argument("--status", default=None,
                        help="JSON file to keep updated with the run's state (job servers)")
    parser.add_argument("--job-id", default=None,
                        help="an identifier for job servers to recognize the process")
    if trainer_class is not None:
        _add_trainer_options(parser, trainer_class)
    return parser


def _spark_setting(text):
    """A ``--conf KEY=VALUE`` option's ``(key, value)``."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, as spark-submit's --conf "
                                         f"(spark.executor.cores=2). Received: {text!r}")
    return key.strip(), value


def _add_conf_option(parser):
    parser.add_argument("--conf", dest="spark_conf", action="append", type=_spark_setting,
                        default=[], metavar="KEY=VALUE",
                        help="a Spark setting for this run's session, as spark-submit's "
                             "--conf (repeatable; spark.executor.instances=4, ...)")


def _spark(master, conf=()):
    """The run's SparkSession, with the ``(key, value)`` settings of ``conf``."""
    from distkeras.session import local_spark_session

    conf = dict(conf)
    if master is None and os.environ.get("PYSPARK_GATEWAY_PORT"):  # under spark-submit
        from pyspark.sql import SparkSession

        return _configured(SparkSession.builder.appName("distkeras"), conf).getOrCreate()
    master = master or "local[*]"
    if master.startswith("local"):
        return local_spark_session(master, **conf)
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.master(master).appName("distkeras")
    return _configured(builder, conf).getOrCreate()


def _configured(builder, conf):
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder


def _read_parquet(spark, path):
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import AnalysisException

    try:
        return spark.read.parquet(path)
    except AnalysisException as error:
        raise CommandError(f"cannot read Parquet data at {path}: "
                           f"{str(error).splitlines()[0]}") from error
    except Py4JJavaError as error:
        # Py4J's own message is only "An error occurred while calling o41.parquet": the
        # reason is the Java exception's innermost cause.
        cause = _java_root_cause(error)
        if "is not a Parquet file" in cause or "CANNOT_READ_FILE_FOOTER" in str(error):
            raise CommandError(f"{path} is not a Parquet file or a folder of Parquet files "
                               f"({cause})") from error
        raise CommandError(f"cannot read Parquet data at {path}: {cause}") from error


def _java_root_cause(error):
    """The first line of the innermost cause of a `Py4JJavaError`."""
    cause = error.java_exception
    while cause.getCause() is not None:
        cause = cause.getCause()
    message = str(cause.getMessage() or cause.toString()).strip()
    return message.splitlines()[0][:300] if message else str(cause.toString())


def _load_model(path):
    from distkeras import utils

    try:
        return utils.load_model(path, compile=True)
    except FileNotFoundError as error:
        raise CommandError(f"model file not found: {path}") from error
    except (ValueError, OSError) as error:
        raise CommandError(f"cannot load the model {path}: {error}") from error


def _compile_settings(model, args):
    compiled = getattr(model, "compiled", False)
    loss = args.loss or (model.loss if compiled else None)
    if loss is None and not compiled:  # compiled with loss=None: its own (add_loss)
        raise CommandError("--loss is required: the model file has no compiled loss")
    optimizer = args.optimizer or (model.optimizer if compiled else "adam")
    metrics = None if args.metrics is None else \
        [name for name in args.metrics.split(",") if name]
    return optimizer, loss, metrics


def check_arguments(trainer_class, args):
    """Refuses, before Spark starts, the settings that would fail once it has: counts
    below 1, ``--workers`` or ``--window`` for a trainer without them, and an optimizer
    or loss name Keras does not know (the model and data are checked as they are read).

    Raises:
        CommandError: Naming the option and what to give instead.
    """
    for flag, value in (("--epochs", args.epochs), ("--batch-size", args.batch_size),
                        ("--workers", args.workers), ("--window", args.window)):
        if value is not None and value < 1:
            raise CommandError(f"{flag} must be an integer >= 1. Received: {flag} {value}")
    parameters = inspect.signature(trainer_class.__init__).parameters
    if args.workers is not None and not {"num_workers", "num_ensembles"} & set(parameters):
        raise CommandError(f"{trainer_class.__name__} trains on one worker: --workers does "
                           "not apply (use a distributed trainer, such as ADAG)")
    if args.window is not None and "communication_window" not in parameters:
        raise CommandError(f"{trainer_class.__name__} has no communication window")
    _check_names(args.optimizer, args.loss)


def _check_names(optimizer, loss):
    """Refuses an optimizer or loss name that Keras would not resolve, without building
    either: an optimizer creates variables, which start JAX before Spark."""
    import keras

    if optimizer is not None:
        known = {name.lower() for name, value in vars(keras.optimizers).items()
                 if isinstance(value, type) and issubclass(value, keras.optimizers.Optimizer)}
        if optimizer.lower() not in known:
            raise CommandError(f"--optimizer: Keras does not know {optimizer!r}. Check the "
                               f"spelling against keras.optimizers ({', '.join(sorted(known))})")
    if loss is not None:
        try:
            keras.losses.get(loss)  # a function or a Loss: no variables
        except ValueError as error:
            raise CommandError(f"--loss: Keras does not know {loss!r} ({error}). Check the "
                               "spelling against keras.losses") from error


def build_trainer(trainer_class, model, args):
    """The trainer the ``train`` command's arguments describe."""
    optimizer, loss, metrics = _compile_settings(model, args)
    parameters = inspect.signature(trainer_class.__init__).parameters
    settings = {"keras_model": model, "worker_optimizer": optimizer, "loss": loss,
                "metrics": metrics, "batch_size": args.batch_size, "num_epoch": args.epochs,
                "features_col": _columns(args.features), "label_col": _columns(args.label) or None}  # --label "": none
    workers = 2 if args.workers is None else args.workers
    if "num_workers" in parameters:
        settings["num_workers"] = workers
    if "num_ensembles" in parameters:
        settings["num_ensembles"] = workers
    if args.workers is not None and not {"num_workers", "num_ensembles"} & set(parameters):
        raise CommandError(f"{trainer_class.__name__} trains on one worker: --workers does "
                           "not apply (use a distributed trainer, such as ADAG)")
    if args.window is not None:
        if "communication_window" not in parameters:
            raise CommandError(f"{trainer_class.__name__} has no communication window")
        settings["communication_window"] = args.window
    for name in trainer_options(trainer_class):
        value = getattr(args, f"trainer_{name}")
        if value is not inspect.Parameter.empty and value is not None:
            settings[name] = value
    return trainer_class(**settings)


def write_status(path, state, **details):
    """Replaces the status file with ``{"state": ..., "time": ..., **details}``.

    Raises:
        CommandError: Naming ``--status`` and its path (not the temporary file's), when
            the file cannot be written.
    """
    from distkeras.storage import replacing_local_file

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
    from distkeras.session import warm_up_executors

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
    from distkeras.registry import get_trainer_class

    # --trainer decides which other options exist, so read it first.
    first, _ = _train_parser(add_help=False).parse_known_args(argv)
    try:
        trainer_class = get_trainer_class(first.trainer)
    except ValueError as error:
        raise CommandError(str(error)) from error
    args = _train_parser(trainer_class).parse_args(argv)
    _check_one_model(trainer_class)
    try:
        return _train(trainer_class, args)
    except Exception as error:
        write_status(args.status, "failed", error=f"{type(error).__name__}: {_message(error)}")
        raise
    except KeyboardInterrupt:
        # Ctrl-C or SIGINT: the status said "training" to whoever follows it, for good.
        write_status(args.status, "failed", error="KeyboardInterrupt: interrupted")
        raise


def _check_one_model(trainer_class):
    """Refuses, before Spark starts, a trainer whose result is several models: ``--output``
    holds one, and an ensemble trained for nothing would be lost."""
    from distkeras.trainers import EnsembleTrainer

    if issubclass(trainer_class, EnsembleTrainer):
        raise CommandError(f"{trainer_class.__name__} returns several models and --output "
                           "holds one: train an ensemble from Python (trainer.train(df) "
                           "returns the list, save each with distkeras.utils.save_model), or "
                           "choose another --trainer")


def _train_options(args):
    """The train options of ``--train-options`` and the flags, checked."""
    options = {}
    if args.train_options:
        try:
            with open(args.train_options, encoding="utf-8") as handle:
                options = json.load(handle)
        except ValueError as error:  # the decoder's message names a line, not the file
            raise CommandError(f"--train-options {args.train_options} is not JSON: "
                               f"{error}") from error
        except OSError as error:  # "[Errno 2] No such file or directory" named no option
            raise CommandError(f"--train-options {args.train_options}: "
                               f"{error.strerror or error}") from error
        if not isinstance(options, dict):
            raise CommandError(f"{args.train_options} must hold a JSON object")
    if args.shuffle:
        options["shuffle"] = True
    if args.validation is not None:
        try:
            options["validation"] = float(args.validation)
        except ValueError:
            options["validation"] = args.validation  # a Parquet path
    if args.sample_weight_col is not None:
        options["sample_weight_col"] = args.sample_weight_col
    if args.class_weight is not None:
        try:
            options["class_weight"] = json.loads(args.class_weight)
        except ValueError as error:
            raise CommandError(f"--class-weight is not JSON: {error}") from error
    try:
        return train_options.normalize(options)
    except ValueError as error:
        raise CommandError(str(error)) from error


def _output_flags(args):
    """``(flag, path)`` of each output file that ``train`` was given."""
    return [(flag, path) for flag, path in (("--output", args.output),
                                            ("--history", args.history),
                                            ("--validation-history", args.validation_history))
            if path is not None]


def _check_distinct_outputs(args):
    """Refuses two outputs at one path: the later write would replace the earlier one (a
    history written over the trained model)."""
    seen = {}
    for flag, path in _output_flags(args):
        key = os.path.abspath(path) if "://" not in path else path
        if key in seen:
            raise CommandError(f"{flag} {path} is also {seen[key]}: give each its own path")
        seen[key] = flag


def _check_outputs(args):
    """Refuses output paths that are folders, or under a file, before the training they
    would lose."""
    from distkeras import storage

    for flag, path in _output_flags(args):
        try:
            storage.check_writable(path)
        except IsADirectoryError as error:
            raise CommandError(f"{flag} {path} is a folder: give the path of the file to "
                               "write") from error
        except NotADirectoryError as error:
            raise CommandError(f"{flag}: {error}") from error


def _train(trainer_class, args):
    write_status(args.status, "starting")
    options = _train_options(args)  # the flags' mistakes, before Spark starts
    _check_distinct_outputs(args)
    if not args.trainer_config:  # a configuration file replaces the flags
        check_arguments(trainer_class, args)
    spark = _spark(args.master, args.spark_conf)
    # The executors' Python workers start (and import Keras) while the driver loads the
    # model and reads the data's schema: seconds saved on every job.
    warm_up = threading.Thread(target=_warm_up, args=(spark,), daemon=True)
    warm_up.start()
    from distkeras import utils

    try:
        _check_outputs(args)
        dataframe = _read_parquet(spark, args.data)
        model = _load_model(args.model)
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
    utils.save_model(trained, args.output)
    if args.history:
        utils.save_history(trainer.get_history(), args.history)
    if args.validation_history:
        utils.save_history(trainer.get_validation_history(), args.validation_history)
    history = trainer.get_history()
    samples = sum(record.get("batch_size", 0) for record in history)
    seconds = trainer.get_training_time()
    final_loss = history[-1].get("loss", float("nan")) if history else float("nan")
    sys.stdout.write(f"trained {trainer_class.__name__} in {seconds:.1f} s, "
                     f"{samples / seconds:.0f} samples/s, final loss {final_loss:.4f}; "
                     f"model written to {args.output}\n")
    write_status(args.status, "finished", training_time=seconds, samples=samples)
    return 0


def command_predict(argv):
    parser = argparse.ArgumentParser(
        prog="distkeras predict", formatter_class=_HelpFormatter,
        description="Predict with a Keras model over Parquet data, in parallel, to Parquet.")
    parser.add_argument("--data", required=True, help="Parquet path to predict on")
    parser.add_argument("--model", required=True, help="the model, a .keras archive")
    parser.add_argument("--output", required=True, help="Parquet path for the predictions")
    parser.add_argument("--features", default="features",
                        help="feature column(s), comma-separated for several inputs, as "
                             "for train")
    parser.add_argument("--prediction", default="prediction",
                        help="output column; for several outputs, comma-separated names "
                             "(one per output) or a prefix (prediction_<output name>)")
    parser.add_argument("--overwrite", action="store_true", help="replace --output if present")
    parser.add_argument("--master", default=None,
                        help="Spark master (default: spark-submit's, else local[*])")
    _add_conf_option(parser)
    args = parser.parse_args(argv)
    spark = _spark(args.master, args.spark_conf)
    from distkeras.predictors import ModelPredictor

    if not args.overwrite:
        from distkeras.data.datasets import check_not_there

        try:
            check_not_there(spark, args.output, "error")
        except FileExistsError:
            raise CommandError(f"{args.output} already exists: pass --overwrite to replace "
                               "it, or another --output") from None
    dataframe = _read_parquet(spark, args.data)
    features = _columns(args.features)
    for name in features if isinstance(features, list) else [features]:
        if name not in dataframe.columns:
            raise CommandError(f"column {name!r} is not in {args.data}; columns: "
                               f"{', '.join(dataframe.columns)}")
    model = _load_model(args.model)
    predictions = ModelPredictor(model, features_col=features,
                                 output_col=_columns(args.prediction)).predict(dataframe)
    started = time.time()
    _write_then_replace(spark, predictions, args.output)
    sys.stdout.write(f"predictions written to {args.output} in {time.time() - started:.1f} s\n")
    return 0


def _write_then_replace(spark, dataframe, path):
    """Writes ``dataframe`` as Parquet to ``path``, replacing what is there only once the
    write succeeded: a failed job leaves the old output as it was (and no new folder),
    and the output may be the data read (Spark refuses to overwrite a path it reads)."""
    import uuid

    from distkeras.storage import HadoopFS

    output = HadoopFS(spark, path)
    target = path
    if output.fs.exists(output.path):
        target = f"{output.path.getParent().toString()}/.{output.path.getName()}.tmp-" \
                 f"{uuid.uuid4().hex}"
    try:
        dataframe.write.mode("errorifexists").parquet(target)
    except Exception:
        _remove_quietly(spark, target)  # the folder Spark started
        raise
    if target != path:
        output.fs.delete(output.path, True)
        if not output.fs.rename(output.child(target), output.path):
            raise CommandError(f"The predictions are in {target}, but it could not be "
                               f"renamed to {path}: move it there yourself.")


COMMANDS = {
    "train": command_train,
    "predict": command_predict,
}


def _extra_commands():
    commands = dict(COMMANDS)
    try:
        from distkeras.punchcard.commands import CLI_COMMANDS
    except ImportError:
        return commands
    commands.update(CLI_COMMANDS)
    return commands


def _remove_quietly(spark, path):
    from distkeras.storage import HadoopFS

    try:
        filesystem = HadoopFS(spark, path)
        filesystem.fs.delete(filesystem.path, True)
    except Exception as error:  # py4j errors of every kind: the write's error matters more
        logger.warning("Could not remove %s: %s", path, error)


def _spark_errors():
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    return PySparkException, Py4JJavaError


# A Python exception's line in a traceback: "ValueError: ...", "keras.errors.X: ...".
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*: ")


def _message(error):
    """One line saying what went wrong: the Python worker's own exception for an error
    raised on an executor (Spark's first line only says that one was), the innermost
    cause of a Java one, else the error's first line."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PythonException

    if isinstance(error, Py4JJavaError):
        return _java_root_cause(error)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if isinstance(error, PythonException):
        causes = [line for line in lines if _EXCEPTION_LINE.match(line)]
        if causes:
            return causes[-1]
    return lines[0] if lines else repr(error)


def main(argv=None):
    """Entry point of the ``distkeras`` command."""
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = _extra_commands()
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in commands:
        usage = ("usage: distkeras {" + ",".join(commands) + "} [options]\n"
                 "  `distkeras COMMAND --help` shows the command's options and defaults.\n")
        if argv and argv[0] not in ("-h", "--help"):
            sys.stderr.write(f"distkeras: error: unknown command {argv[0]!r}\n{usage}")
            return 2
        sys.stdout.write(usage)
        return 0 if argv else 2
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        return commands[argv[0]](argv[1:])
    except CommandError as error:
        sys.stderr.write(f"distkeras {argv[0]}: error: {error}\n")
        return 1
    except (ValueError, TypeError, OSError, RuntimeError, *_spark_errors()) as error:
        sys.stderr.write(f"distkeras {argv[0]}: error: {_message(error)}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
