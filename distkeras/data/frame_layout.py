"""Lays out a checked training DataFrame for the workers: its training columns, one
partition per worker task (or a plain Parquet scan read in the workers), whether Spark
can run them as a barrier stage, and the rows kept on disk across epochs."""

import contextlib
import logging

import numpy as np
from pyspark import StorageLevel
from pyspark.ml.linalg import SparseVector, VectorUDT
from pyspark.sql import functions as F

from distkeras.data import feed, parquet_source
from distkeras.data.feed import arrow_name
from distkeras.data.frame_columns import as_column_list, column, training_column
from distkeras.session import is_connect

logger = logging.getLogger(__name__)


def sparse_vector_columns(dataframe, names, first_row=None):
    """The Spark ML vector columns among ``names`` whose first row is a sparse vector
    (``HashingTF``, ``CountVectorizer``, ``IDF``, ``OneHotEncoder``); reads that row only
    where there are vector columns.

    Such a column is sent to Python as its struct and densified there a minibatch at a
    time (`feed.column_rows`): ``vector_to_array`` would write every zero into Arrow on
    the JVM (1 MiB per row for ``HashingTF``'s default 2**18 features). A column of dense
    vectors keeps ``vector_to_array``. A column that mixes both is read right either way.
    """
    vectors = [name for name in names
               if isinstance(dataframe.schema[name].dataType, VectorUDT)]
    if not vectors or dataframe.isStreaming:  # a stream's rows cannot be read before it runs
        return set()
    # ``first_row``: that row, already read by the caller (holding ``names``).
    row = first_row if first_row is not None else \
        dataframe.select(*map(column, vectors)).first()
    if row is None:
        return set()
    return {name for name in vectors if isinstance(row[name], SparseVector)}


def training_frame(dataframe, features_col, label_col, sample_weight_col=None,
                   sparse=True):
    """Selects the training columns, each named as the workers read it
    (`feed.arrow_name`): Spark ML vectors as arrays, or with ``sparse`` and sparse
    vectors (`sparse_vector_columns`), as their struct."""
    # Each once: a column may feed two outputs, or be both input and target (an
    # autoencoder); the workers read columns by name.
    columns = list(dict.fromkeys(as_column_list(features_col) + as_column_list(label_col)))
    as_sent = sparse_vector_columns(dataframe, columns) if sparse else set()
    selected = [(column(name) if name in as_sent else training_column(dataframe, name))
                .alias(arrow_name(name)) for name in columns]
    if sample_weight_col is not None and sample_weight_col not in columns:
        selected.append(column(sample_weight_col).cast("float").alias(
            arrow_name(sample_weight_col)))
    return dataframe.select(*selected)


def lay_out(dataframe, num_partitions, shuffle=False, seed=None):
    """Splits the data into ``num_partitions`` partitions, one per worker task.

    A DataFrame that already has ``num_partitions`` partitions is used as it is (so balance
    your partitions, or pass ``shuffle=True``); otherwise rows are spread round-robin.
    Later epochs are the workers' own (`epochs.Replay`), so this lays out one pass.

    Without ``shuffle``, a plain Parquet scan is laid out as a
    `parquet_source.ParquetSource`, whose workers read the files themselves: Spark's own
    partitions where it has ``num_partitions``, else consecutive runs of equal rows.

    Args:
        dataframe: The training columns.
        num_partitions: Number of worker tasks.
        shuffle: Whether to randomize the order of rows (and which worker gets which).
        seed: Seed for the shuffle. None: drawn from numpy's global generator, so
            ``keras.utils.set_random_seed(n)`` before training gives the same order at
            every run, as it does for ``fit(shuffle=True)``.

    Returns:
        A DataFrame with ``num_partitions`` partitions.

    Notes:
        Under Spark Connect the client cannot read a DataFrame's partition count, so an
        unshuffled DataFrame is always repartitioned (coalesced to one partition for one
        worker).
    """
    if not shuffle:
        source = parquet_source.direct_source(dataframe, num_partitions, _feed_batch_rows(
            dataframe.sparkSession))
        if source is not None:
            logger.info("Reading %d partitions of Parquet files in the workers (pyarrow); "
                        "%s=false turns this off.", source.num_partitions(),
                        parquet_source.SETTING)
            return source
        # Keep the DataFrame's own partitioning when it already fits: a shuffle of the
        # whole data set costs seconds before the first step.
        if num_partitions_of(dataframe) == num_partitions:
            return dataframe
        if num_partitions == 1:
            return dataframe.coalesce(1)
        return dataframe.repartition(num_partitions)
    if seed is None:
        seed = int(np.random.randint(0, 2 ** 31 - 1))
    return (dataframe.withColumn("__distkeras_order", F.rand(seed))
            .repartition(num_partitions)
            .sortWithinPartitions("__distkeras_order")
            .drop("__distkeras_order"))


def num_partitions_of(dataframe):
    """The DataFrame's number of partitions, or None where the session cannot say
    without a Spark job (Spark Connect has no RDD on the client)."""
    if is_connect(dataframe.sparkSession):
        return None
    return dataframe.rdd.getNumPartitions()


def _feed_batch_rows(spark):
    """Rows per record batch the workers get: the session's Arrow setting, else the
    trainers' (`feed.FEED_RECORDS_PER_BATCH`)."""
    return int(spark.conf.get(feed.ARROW_BATCH_KEY, None) or feed.FEED_RECORDS_PER_BATCH)


def barrier_compatible(dataframe, num_partitions):
    """Whether Spark can run ``dataframe``'s partitions as a barrier stage of
    ``num_partitions`` tasks: every RDD the stage computes (back to its shuffles) must have
    that many partitions, which a ``coalesce()`` or a ``union()`` breaks (Spark's check,
    SPARK-24820, done here on the driver: Spark 4 stops the SparkContext when it fails).
    False where the RDD chain cannot be read."""
    try:
        stack, seen = [dataframe.rdd._jrdd.rdd()], set()
        while stack:
            rdd = stack.pop()
            if rdd.id() in seen:
                continue
            seen.add(rdd.id())
            if rdd.getNumPartitions() != num_partitions:
                return False
            dependencies = rdd.dependencies()
            for index in range(dependencies.size()):
                dependency = dependencies.apply(index)
                if dependency.getClass().getName() != "org.apache.spark.ShuffleDependency":
                    stack.append(dependency.rdd())
        return True
    except Exception:  # py4j internals another Spark may lack: not a barrier stage then
        return False


@contextlib.contextmanager
def kept_for_epochs(frame, num_epoch):
    """Keeps ``frame`` on the executors' disks (``DISK_ONLY``) while a training reads it
    once per epoch in a Spark job per epoch, and unpersists it after.

    The one-job paths read each partition once and replay it from local disk
    (`distkeras.executor.epochs`); a job per epoch computes the frame again, and a nondeterministic
    upstream (a shuffle's row order, ``rand()``, a UDF) would give each epoch other rows,
    depending only on how many task slots the cluster has. A frame the user cached is
    read as it is, and so is one whose rows all come from a cache through steps that give
    the same rows each time (the training columns selected from the user's cached frame):
    a copy on disk would add nothing. So is a plain Parquet scan (`parquet_source`), whose
    files give the same rows each time.

    Yields:
        ``frame``.
    """
    if num_epoch < 2 or frame.is_cached or _read_from_cache(frame) or \
            parquet_source.plain_scan(frame):
        yield frame
        return
    logger.info(
        "Persisting the training rows (DISK_ONLY) so that each epoch's job reads the same.")
    frame.persist(StorageLevel.DISK_ONLY)
    try:
        yield frame
    finally:
        frame.unpersist()


def _read_from_cache(frame):
    """Whether every row of ``frame`` comes from a cache (``df.cache()``, ``persist()``,
    ``spark.catalog.cacheTable``) through deterministic steps without Python UDFs.

    ``frame.is_cached`` says only whether that Python object was cached: the training
    frame is a new ``select`` of the user's DataFrame, so it never was.
    """
    try:
        return _cached_leaves_only(frame._jdf.queryExecution().withCachedData())
    except Exception:  # py4j internals another Spark may lack: keep the frame on disk then
        return False


def _cached_leaves_only(plan):
    """Whether a logical plan reads only cached relations, deterministically."""
    if plan.getClass().getSimpleName() == "InMemoryRelation":
        return True
    children = plan.children()
    if children.size() == 0 or not plan.deterministic():
        return False
    expressions = plan.expressions()
    # A Python UDF counts as nondeterministic: few users mark one that draws random
    # numbers or reads the clock with asNondeterministic().
    if any(_holds_python_udf(expressions.apply(i)) for i in range(expressions.size())):
        return False
    return all(_cached_leaves_only(children.apply(i)) for i in range(children.size()))


def _holds_python_udf(expression):
    if expression.getClass().getSimpleName() == "PythonUDF":
        return True
    children = expression.children()
    return any(_holds_python_udf(children.apply(i)) for i in range(children.size()))