"""What the ``distkeras`` commands share: the one-line `CommandError`, the help layout, the
run's SparkSession, the model and the Parquet data read with errors that name them, and
the one line that says what went wrong."""

import argparse
import os
import re

from distkeras.errors import DistkerasError
from distkeras.session import local_spark_session


class CommandError(DistkerasError):
    """A failure to report in one line."""


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows each option's default, except where its help already says what it is."""

    def _get_help_string(self, action):
        if action.help and "(default" in action.help:  # "(default: x)", "(default x; ...)"
            return action.help
        return super()._get_help_string(action)


def column_names(text):
    """A comma-separated ``--features`` or ``--label`` value: one name, or a list of names."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    return names[0] if len(names) == 1 else names


def _spark_setting(text):
    """A ``--conf KEY=VALUE`` option's ``(key, value)``."""
    key, equals, value = text.partition("=")
    if not equals or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, as spark-submit's --conf "
                                         f"(spark.executor.cores=2). Received: {text!r}")
    return key.strip(), value


def add_conf_option(parser):
    """Adds spark-submit's repeatable ``--conf KEY=VALUE`` option to ``parser``."""
    parser.add_argument("--conf", dest="spark_conf", action="append", type=_spark_setting,
                        default=[], metavar="KEY=VALUE",
                        help="a Spark setting for this run's session, as spark-submit's "
                             "--conf (repeatable; spark.executor.instances=4, ...)")


def spark_session(master, conf=(), remote=None):
    """The run's SparkSession, with the ``(key, value)`` settings of ``conf``: a Spark
    Connect client of ``remote`` (``sc://host:port``) where given.

    Raises:
        CommandError: For a ``remote`` that is not an ``sc://`` address.
    """
    conf = dict(conf)
    if remote is not None:
        if not remote.startswith("sc://"):
            raise CommandError(f"--remote takes a Spark Connect address, sc://host:port. "
                               f"Received: {remote!r}")
        from pyspark.sql import SparkSession

        return _configured(SparkSession.builder.remote(remote), conf).getOrCreate()
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


def read_parquet(spark, path):
    """The Parquet data at ``path``, or a `CommandError` that says why it cannot be read."""
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
        cause = java_root_cause(error)
        if "is not a Parquet file" in cause or "CANNOT_READ_FILE_FOOTER" in str(error):
            raise CommandError(f"{path} is not a Parquet file or a folder of Parquet files "
                               f"({cause})") from error
        raise CommandError(f"cannot read Parquet data at {path}: {cause}") from error


def java_root_cause(error):
    """The first line of the innermost cause of a `Py4JJavaError`."""
    cause = error.java_exception
    while cause.getCause() is not None:
        cause = cause.getCause()
    message = str(cause.getMessage() or cause.toString()).strip()
    return message.splitlines()[0][:300] if message else str(cause.toString())


def load_model(path):
    """The compiled model of the ``.keras`` archive at ``path``, or a `CommandError`."""
    # numpy, pyarrow and pyspark wait for a command to run: `distkeras --help` and the
    # arguments' mistakes answer at once (the same below in this package).
    from distkeras.keras_io import archives

    try:
        return archives.load_model(path, compile=True)
    except FileNotFoundError as error:
        raise CommandError(f"model file not found: {path}") from error
    except (ValueError, OSError) as error:
        raise CommandError(f"cannot load the model {path}: {error}") from error


def spark_errors():
    """The classes of Spark's and Py4J's errors, reported in one line by `main`."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PySparkException

    return PySparkException, Py4JJavaError


# A Python exception's line in a traceback: "ValueError: ...", "keras.errors.X: ...".
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*: ")


def error_message(error):
    """One line saying what went wrong: the Python worker's own exception for an error
    raised on an executor (Spark's first line only says that one was), the innermost
    cause of a Java one, else the error's first line."""
    from py4j.protocol import Py4JJavaError
    from pyspark.errors import PythonException

    if isinstance(error, Py4JJavaError):
        return java_root_cause(error)
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if isinstance(error, PythonException):
        causes = [line for line in lines if _EXCEPTION_LINE.match(line)]
        if causes:
            return causes[-1]
    return lines[0] if lines else repr(error)
