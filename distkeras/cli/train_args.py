"""The ``train`` command's arguments: its parser (the chosen trainer's own constructor
arguments become options too), the checks done before Spark starts, and the trainer and
train options they describe."""

import argparse
import inspect
import json
import os

from distkeras.cli.common import CommandError, HelpFormatter, add_conf_option, column_names
from distkeras.data import storage
from distkeras.training import options as train_options


# Trainer arguments that have their own options below; every other constructor argument of
# the chosen trainer becomes an option of its own (--rho, --momentum, --learning-rate, ...).
COMMON_ARGUMENTS = {"keras_model", "worker_optimizer", "loss", "metrics", "num_workers",
                    "num_ensembles", "batch_size", "features_col", "label_col", "num_epoch",
                    "communication_window"}


def _option_value(text):
    """An option's value: JSON where it parses (numbers, lists, null), else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def trainer_options(trainer_class):
    """The trainer's own constructor arguments: ``{name: default}``, its algorithm's
    hyperparameters among them (`algorithms.Hyperparameter`)."""
    signature = inspect.signature(trainer_class.__init__)
    options = {name: parameter.default for name, parameter in signature.parameters.items()
               if name != "self" and name not in COMMON_ARGUMENTS
               and parameter.kind in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY)}
    for parameter in getattr(getattr(trainer_class, "algorithm", None), "hyperparameters", ()):
        options.setdefault(parameter.name, parameter.default)
    return options


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


def train_parser(trainer_class=None, add_help=True):
    """The ``train`` command's parser, with ``trainer_class``'s own options (if given);
    without ``add_help``, one that reads ``--trainer`` before the others are known."""
    parser = argparse.ArgumentParser(
        prog="distkeras train", formatter_class=HelpFormatter,
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
    session = parser.add_mutually_exclusive_group()
    session.add_argument("--master", default=None,
                         help="Spark master (default: spark-submit's, else local[*])")
    session.add_argument("--remote", default=None,
                         help="a Spark Connect server to train through, sc://host:port "
                              "(parameter-server trainers need their server in the job)")
    add_conf_option(parser)
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
                "features_col": column_names(args.features),
                "label_col": column_names(args.label) or None}  # --label "": none
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


def options_from_args(args):
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


def check_distinct_outputs(args):
    """Refuses two outputs at one path: the later write would replace the earlier one (a
    history written over the trained model)."""
    seen = {}
    for flag, path in _output_flags(args):
        key = os.path.abspath(path) if "://" not in path else path
        if key in seen:
            raise CommandError(f"{flag} {path} is also {seen[key]}: give each its own path")
        seen[key] = flag


def check_outputs(args):
    """Refuses output paths that are folders, or under a file, before the training they
    would lose."""
    for flag, path in _output_flags(args):
        try:
            storage.check_writable(path)
        except IsADirectoryError as error:
            raise CommandError(f"{flag} {path} is a folder: give the path of the file to "
                               "write") from error
        except NotADirectoryError as error:
            raise CommandError(f"{flag}: {error}") from error
