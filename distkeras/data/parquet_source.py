"""Reads a plain Parquet scan's files in the Python workers, with pyarrow.

Spark hands a ``mapInArrow`` task its rows after its JVM converted them to Arrow: about one
CPU second per 60,000 rows of 784 floats. Where a DataFrame is nothing but a scan of
Parquet files (no filter, join, union, cache or computed column), the workers can read the
files themselves, as Petastorm and Ray Data do: each gets a list of (file, row group, rows)
pieces and reads only the columns it needs, as Arrow record batches for the same
`feed.MinibatchFeed`.

The partitions stay Spark's: where the scan already has as many partitions as asked for,
each worker reads the row groups of its Spark partition, in Spark's order (a row group
belongs to the file split holding its midpoint, as Spark's Parquet reader decides).
Otherwise the row groups, in Spark's order, are cut into that many runs of equal rows.

Everything else (and any scan the checks here are unsure of) keeps Spark's own path.
The Spark setting ``distkeras.parquetDirect=false`` turns this off for a session.
"""

import dataclasses
import logging
from urllib.parse import unquote, urlparse

from distkeras.errors import DataSourceError

logger = logging.getLogger(__name__)

# The Spark setting that turns the direct read off (``false``) for a session.
SETTING = "distkeras.parquetDirect"

# Spark types the workers read as Spark would give them (others keep Spark's path).
_SIMPLE_TYPES = ("BooleanType", "ByteType", "ShortType", "IntegerType", "LongType",
                 "FloatType", "DoubleType", "BinaryType", "StringType")


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rows ``start`` to ``start + rows`` of row group ``row_group`` of a local Parquet
    file."""

    path: str
    row_group: int
    start: int
    rows: int


def enabled(spark, setting=None):
    """Whether the direct read may be used: ``setting`` (True/False) when given, else the
    session's ``distkeras.parquetDirect`` (default true)."""
    if setting is not None:
        return bool(setting)
    return str(spark.conf.get(SETTING, "true")).strip().lower() != "false"


def _nodes(plan):
    """``plan`` and its descendants (py4j objects of a Spark plan), depth first."""
    stack = [plan]
    while stack:
        node = stack.pop()
        yield node
        children = node.children()
        stack.extend(children.apply(index) for index in range(children.size()))


def _kind(node):
    return node.getClass().getSimpleName()


def _column_sources(dataframe):
    """For a DataFrame that is a plain Parquet scan (projections of the files' columns,
    renamed or not, over one Parquet relation), ``{column: the file column it reads}``
    in the DataFrame's order; else None."""
    plan = dataframe._jdf.queryExecution().optimizedPlan()
    renames = None  # {output name: relation attribute}, through the Projects
    while _kind(plan) == "Project":
        projected = {}
        expressions = plan.projectList()
        for index in range(expressions.size()):
            expression = expressions.apply(index)
            if _kind(expression) == "Alias" and _kind(expression.child()) == \
                    "AttributeReference":
                source = expression.child().name()
            elif _kind(expression) == "AttributeReference":
                source = expression.name()
            else:
                return None  # a computed column
            projected[expression.name()] = source if renames is None else renames.get(source)
        renames = projected
        plan = plan.child()
    if _kind(plan) != "LogicalRelation":
        return None  # a filter, a join, a union, a cache, a limit, ...
    relation = plan.relation()
    if _kind(relation) != "HadoopFsRelation" or \
            _kind(relation.fileFormat()) != "ParquetFileFormat":
        return None
    names = dataframe.columns
    if renames is None:
        renames = {name: name for name in names}
    if len(set(names)) != len(names) or any(renames.get(name) is None for name in names):
        return None
    return {name: renames[name] for name in names}


def plain_scan(dataframe):
    """Whether ``dataframe`` is a plain scan of Parquet files: each of its columns one of
    the files', renamed or not (False where the plan cannot be read)."""
    try:
        return _column_sources(dataframe) is not None
    except Exception:  # py4j internals another Spark may lack
        return False


def _simple(data_type):
    """Whether a Spark type reaches Python alike from pyarrow and from Spark's Arrow."""
    while type(data_type).__name__ == "ArrayType":
        data_type = data_type.elementType
    return type(data_type).__name__ in _SIMPLE_TYPES


def _spark_partitions(dataframe):
    """The file splits of each partition of the DataFrame's scan, as ``[[(local path,
    start, length), ...], ...]``; None where they cannot be read or are not local
    files."""
    scans = [node for node in _nodes(dataframe._jdf.queryExecution().executedPlan())
             if _kind(node) == "FileSourceScanExec"]
    if len(scans) != 1:
        return None
    partitions = scans[0].inputRDD().filePartitions()
    layout = []
    for index in range(partitions.size()):
        files = partitions.apply(index).files()
        splits = []
        for position in range(len(files)):
            split = files[position]
            uri = urlparse(split.toPath().toUri().toString())
            if uri.scheme != "file":
                return None  # pyarrow would need the cluster's credentials: Spark reads it
            splits.append((unquote(uri.path), int(split.start()), int(split.length())))
        layout.append(splits)
    return layout


def _midpoint(row_group):
    """Where a row group's bytes are centred in its file (parquet-mr's rule for the file
    split that reads it)."""
    first = row_group.column(0)
    start = first.data_page_offset
    if first.has_dictionary_page and 0 < first.dictionary_page_offset < start:
        start = first.dictionary_page_offset
    size = sum(row_group.column(index).total_compressed_size
               for index in range(row_group.num_columns))
    return start + size // 2


def _metadata(path):
    """A Parquet file's footer, or a clear error where the file is gone."""
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path)
    except FileNotFoundError as error:
        raise missing_file_error(path) from error


def missing_file_error(path):
    """The error for a Parquet file of the DataFrame that is no longer there."""
    return DataSourceError(
        f"The Parquet file {path} that the DataFrame reads is gone (deleted or moved "
        "after the DataFrame was created). Read the data again (spark.read.parquet(...)) "
        "to see the files as they are now.")


def _pieces(splits, footers):
    """The row groups each of Spark's splits reads (by midpoint), as `Piece` lists;
    None where a file's row groups are not each read exactly once."""
    pieces, seen = [], set()
    for path, start, length in splits:
        metadata = footers[path]
        for group in range(metadata.num_row_groups):
            row_group = metadata.row_group(group)
            if start <= _midpoint(row_group) < start + length and row_group.num_rows:
                pieces.append(Piece(path, group, 0, row_group.num_rows))
                seen.add((path, group))
    return pieces, seen


def _balanced(pieces, count):
    """``pieces`` (in order) cut into ``count`` consecutive runs of equal rows (within
    one), a row group split between two runs where it must."""
    total = sum(piece.rows for piece in pieces)
    bounds = [total * index // count for index in range(count + 1)]
    runs = [[] for _ in range(count)]
    first = 0  # the first row of `piece`, counted over all pieces
    for piece in pieces:
        last = first + piece.rows
        for run in range(count):
            low, high = max(first, bounds[run]), min(last, bounds[run + 1])
            if low < high:
                runs[run].append(dataclasses.replace(
                    piece, start=piece.start + low - first, rows=high - low))
        first = last
    return runs


def _types_match(file_type, spark_type):
    """Whether pyarrow reads a file column as Spark's Arrow would give it, up to a cast
    that changes no value (the name of a list's items)."""
    import pyarrow as pa

    def is_list(arrow_type):
        return pa.types.is_list(arrow_type) or pa.types.is_fixed_size_list(arrow_type)

    while is_list(file_type) and is_list(spark_type):
        file_type, spark_type = file_type.value_type, spark_type.value_type
    return file_type.equals(spark_type)


def direct_source(dataframe, num_partitions=None, batch_rows=2048, setting=None):
    """A `ParquetSource` reading ``dataframe``'s rows in ``num_partitions`` partitions
    (default: the scan's own), or None where the DataFrame is not a plain Parquet scan
    of local files (or the direct read is turned off).

    Args:
        dataframe: The DataFrame, every column of which the workers need.
        num_partitions: Partitions wanted; where the scan has that many, each is Spark's.
        batch_rows: Rows per record batch the workers read.
        setting: True or False to force the choice; None: `enabled`.

    Raises:
        DataSourceError: A file of the scan is gone.
    """
    spark = dataframe.sparkSession
    if not enabled(spark, setting) or dataframe.isStreaming:
        return None
    if any(str(spark.conf.get(f"spark.sql.files.{name}", "false")).lower() == "true"
           for name in ("ignoreMissingFiles", "ignoreCorruptFiles")):
        return None  # Spark would skip what pyarrow fails on
    if not all(_simple(field.dataType) for field in dataframe.schema.fields):
        return None
    try:
        columns = _column_sources(dataframe)
        layout = None if columns is None else _spark_partitions(dataframe)
    except Exception as error:  # py4j internals another Spark may lack: Spark's path
        logger.debug("Not a plain Parquet scan (%s): Spark reads it.", error)
        return None
    if layout is None:
        return None
    schema = _arrow_schema(dataframe)
    footers = {path: _metadata(path) for splits in layout for path, _, _ in splits}
    for metadata in footers.values():
        file_schema = metadata.schema.to_arrow_schema()
        for name, source in columns.items():
            if file_schema.get_field_index(source) < 0 or \
                    not _types_match(file_schema.field(source).type, schema.field(name).type):
                return None  # a partition column, or a type Spark casts on read
    partitions, seen = [], set()
    for splits in layout:
        pieces, read = _pieces(splits, footers)
        partitions.append(pieces)
        seen |= read
    if len(seen) != sum(metadata.num_row_groups for metadata in footers.values()):
        return None  # a row group no split reads by our rule: let Spark read them
    if num_partitions is not None and num_partitions != len(partitions):
        partitions = _balanced([piece for pieces in partitions for piece in pieces],
                               num_partitions)
    return ParquetSource(spark, partitions, columns, schema, batch_rows)


def _arrow_schema(dataframe):
    """The Arrow schema Spark's ``mapInArrow`` gives ``dataframe``'s rows."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(dataframe.schema)


class ParquetSource:
    """A DataFrame's rows as lists of Parquet pieces, one list per partition, which Spark
    tasks read with pyarrow.

    It stands for the laid-out DataFrame where the trainers run their workers
    (``mapInArrow``): the tasks run over ``spark.range`` (one id per partition) and read
    their pieces themselves.

    Args:
        spark: The SparkSession.
        partitions: Per partition, its `Piece` list, in order.
        columns: ``{column name as the rows give it: the file column}``.
        schema: The Arrow schema of the rows (Spark's for the DataFrame).
        batch_rows: Rows per record batch.
    """

    def __init__(self, spark, partitions, columns, schema, batch_rows=2048):
        self.sparkSession = spark
        self.partitions = partitions
        self.columns = dict(columns)
        self.schema = schema
        self.batch_rows = int(batch_rows)

    def num_partitions(self):
        return len(self.partitions)

    def ids(self):
        """A DataFrame of one row per partition (the partition's index), in as many
        partitions."""
        count = self.num_partitions()
        return self.sparkSession.range(0, count, 1, count)

    @property
    def rdd(self):
        return self.ids().rdd

    def mapInArrow(self, function, schema, barrier=False):  # noqa: N802 (DataFrame's name)
        """As ``DataFrame.mapInArrow``: ``function`` gets each partition's record
        batches, read here from the files."""
        return self.ids().mapInArrow(self.reading(function), schema, barrier=barrier)

    def reading(self, function):
        """A ``mapInArrow`` function over the partition ids that calls ``function`` on
        the record batches of those partitions."""
        partitions, columns, schema, batch_rows = \
            self.partitions, self.columns, self.schema, self.batch_rows

        def run(id_batches):
            indices = [index for batch in id_batches
                       for index in batch.column(0).to_pylist()]
            pieces = [piece for index in indices for piece in partitions[index]]
            return function(read_pieces(pieces, columns, schema, batch_rows))

        return run


def read_pieces(pieces, columns, schema, batch_rows=2048):
    """Yields the record batches (of ``schema``, at most ``batch_rows`` rows each) of the
    ``columns`` (``{name: file column}``) of ``pieces``, in order.

    Raises:
        DataSourceError: A file is gone.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    names = list(columns)
    sources = list(dict.fromkeys(columns.values()))
    for piece in pieces:
        try:
            file = pq.ParquetFile(piece.path)
        except FileNotFoundError as error:
            raise missing_file_error(piece.path) from error
        skip, left = piece.start, piece.rows
        with file:
            for batch in file.iter_batches(batch_rows, row_groups=[piece.row_group],
                                           columns=sources, use_threads=False):
                if skip >= batch.num_rows:
                    skip -= batch.num_rows
                    continue
                batch = batch.slice(skip, min(left, batch.num_rows - skip))
                skip, left = 0, left - batch.num_rows
                yield pa.RecordBatch.from_arrays(
                    [_as_typed(batch.column(columns[name]), schema.field(name).type)
                     for name in names], schema=schema)
                if not left:
                    break


def _as_typed(array, arrow_type):
    return array if array.type.equals(arrow_type) else array.cast(arrow_type)
