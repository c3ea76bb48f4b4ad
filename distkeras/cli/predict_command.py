"""The ``predict`` command: a ``.keras`` model's predictions over Parquet data, in
parallel, written to Parquet (replacing the output only once the write succeeded)."""

import argparse
import logging
import sys
import time

from distkeras.cli import common
from distkeras.cli.common import (CommandError, HelpFormatter, add_conf_option,
                                  column_names, load_model, read_parquet)
from distkeras.data.storage import HadoopFS

logger = logging.getLogger(__name__)


def command_predict(argv):
    """Runs ``distkeras predict`` with the arguments ``argv``; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="distkeras predict", formatter_class=HelpFormatter,
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
    add_conf_option(parser)
    args = parser.parse_args(argv)
    spark = common.spark_session(args.master, args.spark_conf)
    # Here, not above: pyspark.ml and pyarrow wait for the arguments to be read.
    from distkeras.ml.predictors import ModelPredictor

    if not args.overwrite:
        from distkeras.data.datasets import check_not_there  # pyarrow: as above

        try:
            check_not_there(spark, args.output, "error")
        except FileExistsError:
            raise CommandError(f"{args.output} already exists: pass --overwrite to replace "
                               "it, or another --output") from None
    dataframe = read_parquet(spark, args.data)
    features = column_names(args.features)
    for name in features if isinstance(features, list) else [features]:
        if name not in dataframe.columns:
            raise CommandError(f"column {name!r} is not in {args.data}; columns: "
                               f"{', '.join(dataframe.columns)}")
    model = load_model(args.model)
    predictions = ModelPredictor(model, features_col=features,
                                 output_col=column_names(args.prediction)).predict(dataframe)
    started = time.time()
    _write_then_replace(spark, predictions, args.output)
    sys.stdout.write(f"predictions written to {args.output} in {time.time() - started:.1f} s\n")
    return 0


def _write_then_replace(spark, dataframe, path):
    """Writes ``dataframe`` as Parquet to ``path``, replacing what is there only once the
    write succeeded: a failed job leaves the old output as it was (and no new folder),
    and the output may be the data read (Spark refuses to overwrite a path it reads)."""
    import uuid

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


def _remove_quietly(spark, path):
    try:
        filesystem = HadoopFS(spark, path)
        filesystem.fs.delete(filesystem.path, True)
    except Exception as error:  # py4j errors of every kind: the write's error matters more
        logger.warning("Could not remove %s: %s", path, error)
