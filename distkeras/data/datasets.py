"""Real datasets as Spark DataFrames, and datasets written to Parquet through Spark."""

import gzip
import hashlib
import logging
import os
import zlib

import numpy as np

from distkeras.data.storage import HadoopFS, replacing_local_file
from distkeras.data.tensors import pack_rows
from distkeras.session import default_parallelism, is_connect

logger = logging.getLogger(__name__)

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot")


# Said of every damaged IDX file: most are an interrupted copy or download.
_RESTORE = ("copy it again (Debian's files: apt-get install --reinstall "
            "dataset-fashion-mnist)")


def read_idx(path):
    """Reads an IDX file (the MNIST format), gzipped or not, into a numpy array.

    Raises:
        ValueError: Naming the path, when the file is damaged: not gzip where it should
            be, cut short, or not an IDX file.
    """
    data = _read_idx_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path} is not an IDX file (bad magic number): {_RESTORE}.")
    dtype_code, ndim = data[2], data[3]
    dtypes = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if dtype_code not in dtypes:
        raise ValueError(f"{path}: unknown IDX element type 0x{dtype_code:02x}: {_RESTORE}.")
    offset = 4 + 4 * ndim
    if len(data) < offset:  # numpy's own error would name neither the file nor the cause
        raise ValueError(f"{path} ends inside its header ({len(data)} bytes): {_RESTORE}.")
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    array = np.frombuffer(data, dtype=dtypes[dtype_code], offset=offset)
    if array.size != int(np.prod(shape)):
        raise ValueError(f"{path}: holds {array.size} values, its header says {shape}: "
                         f"{_RESTORE}.")
    return array.reshape(shape).astype(dtypes[dtype_code][1:])


def _read_idx_bytes(path):
    """The bytes of an IDX file, unzipped where its name ends in ``.gz``."""
    if not path.endswith(".gz"):
        with open(path, "rb") as handle:
            return handle.read()
    try:
        with gzip.open(path, "rb") as handle:
            return handle.read()
    # gzip's errors name no file: BadGzipFile (an OSError) for another format, EOFError
    # for a file cut short, zlib.error for corrupt bytes.
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise ValueError(f"{path} is not a whole gzip file ({error}): {_RESTORE}.") \
            from error


def _idx_file(folder, name):
    """The path of IDX file ``name`` in ``folder``, gzipped or not; None if neither is there.

    Debian's package ships ``.gz`` files; the same files unpacked (``gunzip``, or a copy taken
    from elsewhere) are the same data and are read as well.
    """
    for candidate in (name, name[:-len(".gz")]):
        path = os.path.join(folder, candidate)
        if os.path.exists(path):
            return path
    return None


def load_fashion_mnist_numpy(split="train", data_dir=None):
    """Fashion-MNIST as numpy arrays ``(images, labels)``.

    Reads the IDX files of Debian's ``dataset-fashion-mnist`` (or ``data_dir``), gzipped or
    not; where the default folder lacks them, falls back to Keras's downloader, as a user
    with internet would.

    Args:
        split: ``"train"`` (60,000 images) or ``"test"`` (10,000).
        data_dir: Folder holding the IDX files. A folder given here must hold them: it is
            never replaced by a download.

    Returns:
        ``images`` uint8 of shape (n, 28, 28) and ``labels`` uint8 of shape (n,).

    Raises:
        FileNotFoundError: ``data_dir`` lacks the split's IDX files, or the default folder
            lacks them and the download failed.
        ValueError: An IDX file is damaged, or the images and labels do not pair up.
    """
    if split not in _FILES:
        raise ValueError(f"`split` must be 'train' or 'test'. Received: split={split!r}")
    folder = _source_folder(data_dir)
    paths = [_idx_file(folder, name) for name in _FILES[split]]
    if None not in paths:
        return _checked_pairs(paths, read_idx(paths[0]), read_idx(paths[1]))
    if data_dir:
        # A folder the user named is what they mean to read: a download in its place would
        # train on other files (or fail on a URL error that names neither folder nor file).
        raise FileNotFoundError(
            f"`data_dir` lacks Fashion-MNIST's {split} files. Received: data_dir={data_dir!r}; "
            f"expected {' and '.join(_FILES[split])} (gzipped or not) in it.")
    logger.info("No Fashion-MNIST files in %s; using keras.datasets.fashion_mnist", folder)
    (x_train, y_train), (x_test, y_test) = _download_fashion_mnist(folder)
    return (x_train, y_train) if split == "train" else (x_test, y_test)


def _source_folder(data_dir):
    """The folder the IDX files are read from: ``data_dir``, else
    ``$DISTKERAS_FASHION_MNIST_DIR``, else Debian's."""
    return data_dir or os.environ.get("DISTKERAS_FASHION_MNIST_DIR", FASHION_MNIST_DIR)


def _checked_pairs(paths, images, labels):
    """``(images, labels)`` once they are known to pair up: n 28x28 images, n labels.

    Raises:
        ValueError: Naming the file that holds the wrong shape or count.
    """
    if images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(f"{paths[0]} holds an array of shape {images.shape}, not images of "
                         f"28x28: is it another data set's file? {_RESTORE}.")
    if labels.shape != (len(images),):
        raise ValueError(f"{paths[0]} holds {len(images)} images of 28x28 but {paths[1]} holds "
                         f"{labels.shape[0] if labels.ndim else 0} labels"
                         f"{'' if labels.ndim == 1 else f' of shape {labels.shape}'}: the two "
                         f"files are from different splits or data sets; {_RESTORE}.")
    return images, labels


def _download_fashion_mnist(folder):
    """Keras's download of Fashion-MNIST: ``((x_train, y_train), (x_test, y_test))``.

    Raises:
        FileNotFoundError: Naming ``folder`` and the package that fills it, when the
            download fails.
    """
    import keras

    try:
        return keras.datasets.fashion_mnist.load_data()
    # keras.utils.get_file raises a plain Exception ("URL fetch failure on ...") for every
    # network error, with nothing about the local files that would have made it needless.
    except Exception as error:  # re-raised, with its cause, as the error it should be
        raise FileNotFoundError(
            f"No Fashion-MNIST files in {folder}, and Keras's download failed ({error}). "
            "Install them with apt-get install dataset-fashion-mnist, or point "
            "DISTKERAS_FASHION_MNIST_DIR (or data_dir) at a folder holding the IDX files.") \
            from error


def float_lists(matrix):
    """A 2-D array as an Arrow ``list<float>`` array, one row per list (float32 values; no
    copy when ``matrix`` is already contiguous float32).

    Raises:
        ValueError: For 2**31 values or more (Arrow's list offsets are 32-bit).
    """
    import pyarrow as pa

    values = np.ascontiguousarray(matrix, dtype=np.float32)
    rows, width = values.shape
    if values.size >= 2 ** 31:
        raise ValueError(f"{values.size} values do not fit one Arrow list array (32-bit "
                         "offsets); convert fewer rows at a time.")
    offsets = pa.array(np.arange(0, rows * width + 1, width, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, pa.array(values.reshape(-1)))


def to_arrow_table(images, labels, num_classes=10, packed=False):
    """Images and integer labels as an Arrow table.

    Columns: ``features`` (784 floats in [0, 1]; packed float32 bytes with ``packed=True``,
    see `distkeras.data.tensors`), ``label`` (one-hot, ``num_classes`` floats) and
    ``label_index`` (the integer class).
    """
    import pyarrow as pa

    count = len(images)
    features = images.reshape(count, -1).astype(np.float32) / 255.0
    one_hot = np.zeros((count, num_classes), dtype=np.float32)
    one_hot[np.arange(count), labels.astype(np.int64)] = 1.0
    return pa.table({
        "features": pack_rows(features) if packed else float_lists(features),
        "label": float_lists(one_hot),
        "label_index": pa.array(labels.astype(np.int64)),
    })


def default_cache_dir():
    """Where datasets are written as Parquet: ``$DISTKERAS_CACHE`` or ``~/.cache/distkeras``."""
    return os.environ.get("DISTKERAS_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "distkeras"))


def write_parquet(table, path, row_group_size=2048, compression="none"):
    """Writes an Arrow table to a Parquet file atomically (temporary name, then rename).

    Uncompressed by default: every row then takes the same bytes, so Spark's byte-based
    file splits hold the same number of rows (balanced workers).
    """
    import pyarrow.parquet as pq

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with replacing_local_file(path) as temporary:
        pq.write_table(table, temporary, row_group_size=row_group_size,
                       compression=compression)


def load_fashion_mnist(spark, split="train", limit=None, num_partitions=None, data_dir=None,
                       cache_dir=None, packed=False):
    """Fashion-MNIST as a Spark DataFrame, read from Parquet.

    The images are written once to a Parquet file under ``cache_dir`` and read back by
    Spark, so tasks read files rather than carrying the data (on a cluster, give a
    ``cache_dir`` that every executor can read).

    Args:
        spark: The SparkSession.
        split: ``"train"`` or ``"test"``.
        limit: Keep only the first ``limit`` images (for quick runs and tests).
        num_partitions: Partitions of the returned DataFrame (default: Spark's choice).
        data_dir: Folder holding the IDX files (default: Debian's location).
        cache_dir: Folder for the Parquet files (default: `default_cache_dir()`).
        packed: Store ``features`` as packed float32 tensors (``binary``), which Spark hands
            to the workers and `ModelPredictor` faster than an ``array<float>``.

    Returns:
        A DataFrame with ``features`` (array<float>, 784 values in [0, 1], or their packed
        bytes), ``label`` (array<float>, one-hot over 10 classes) and ``label_index``
        (bigint).

    Raises:
        ValueError: For a ``limit`` that is not None or an integer >= 1, and as
            `load_fashion_mnist_numpy`.
    """
    if limit is not None and (isinstance(limit, bool) or not isinstance(
            limit, (int, np.integer)) or limit < 1):
        # images[:-5] would keep all but 5 images, images[:0] none, images[:True] one.
        raise ValueError(f"`limit` must be None or an integer >= 1. Received: limit={limit!r}")
    path = os.path.join(cache_dir or default_cache_dir(),
                        _cache_name(split, limit, packed, data_dir))
    if not os.path.exists(path):
        images, labels = load_fashion_mnist_numpy(split, data_dir)
        if limit is not None:
            images, labels = images[:limit], labels[:limit]
        write_parquet(to_arrow_table(images, labels, packed=packed), path)
    dataframe = spark.read.parquet(path)
    return dataframe.repartition(num_partitions) if num_partitions else dataframe


def _cache_name(split, limit, packed, data_dir):
    """The Parquet file name of a split, as `load_fashion_mnist` caches it.

    Files from another folder than the default one get a name of their own (a hash of the
    folder): under the default name, they would be served the default folder's images.
    """
    source = os.path.abspath(_source_folder(data_dir))
    origin = "" if source == FASHION_MNIST_DIR else \
        "_" + hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]
    return (f"fashion_mnist_{split}" + ("" if limit is None else f"_{int(limit)}")
            + ("_packed" if packed else "") + origin + "_v1.parquet")


# -- writing datasets through Spark --------------------------------------------------------

PARQUET_MODES = ("error", "errorifexists", "overwrite", "append", "ignore")
_ROWS_PER_BATCH = 65536


def _check_write_arguments(path, num_partitions, mode):
    if not isinstance(path, str) or not path:
        raise ValueError(f"`path` must be a non-empty string. Received: path={path!r}")
    if mode not in PARQUET_MODES:
        raise ValueError(f"`mode` must be one of {PARQUET_MODES}. Received: mode={mode!r}")
    if num_partitions is not None and (isinstance(num_partitions, bool) or not isinstance(
            num_partitions, (int, np.integer)) or num_partitions < 1):
        raise ValueError("`num_partitions` must be an integer >= 1 or None. "
                         f"Received: num_partitions={num_partitions!r}")


def check_not_there(spark, path, mode):
    """Refuses an existing ``path`` when ``mode`` is a write mode that refuses one.

    Checked before any work, through the cluster's Hadoop filesystem.

    Args:
        spark: The active SparkSession.
        path: Where the write goes.
        mode: A Spark save mode (``"error"`` and ``"errorifexists"`` refuse a path there).

    Raises:
        FileExistsError: ``path`` exists and ``mode`` refuses that.
    """
    if mode not in ("error", "errorifexists") or is_connect(spark):
        return  # under Spark Connect, Spark's own write refuses a path that exists
    filesystem = HadoopFS(spark, path)
    if filesystem.fs.exists(filesystem.path):
        raise FileExistsError(
            f"{path} already exists. Pass mode='overwrite' to replace it, mode='append' to "
            "add files to it, or another path.")


def save_parquet(dataframe, path, num_partitions=None, mode="error", compression=None):
    """Writes a DataFrame to Parquet through Spark, as ``num_partitions`` files.

    The rows are spread round-robin over the files (a shuffle), so every file holds about
    the same number of rows and a trainer or `ModelPredictor` reading them back gets
    balanced partitions. Row order is not kept.

    Args:
        dataframe: The Spark DataFrame to write.
        path: A folder, on any filesystem the cluster's Hadoop configuration reaches
            (``hdfs://``, ``s3a://``, ``file://`` or a plain local path).
        num_partitions: Files to write (default: the session's default parallelism, so
            reading the folder back gives every core a file).
        mode: ``"error"`` (refuse an existing path), ``"overwrite"``, ``"append"`` or
            ``"ignore"`` (write nothing if the path exists), as Spark's writer.
        compression: Parquet codec (``"snappy"``, ``"zstd"``, ``"none"``...; default:
            Spark's ``spark.sql.parquet.compression.codec``).

    Raises:
        ValueError: For a bad ``mode``, ``num_partitions`` or ``path``.
        FileExistsError: When ``path`` exists and ``mode`` is ``"error"``.
    """
    _check_write_arguments(path, num_partitions, mode)
    spark = dataframe.sparkSession
    check_not_there(spark, path, mode)
    count = int(num_partitions or default_parallelism(spark))
    writer = dataframe.repartition(count).write.mode(mode)
    if compression is not None:
        writer = writer.option("compression", compression)
    logger.info("Writing %d Parquet files to %s (mode %s)", count, path, mode)
    writer.parquet(path)


def _label_array(labels):
    """Labels as an Arrow array: class indices (bigint) for integers, floats for real
    targets, ``list<float>`` per row for 2-D or higher (one-hot, several targets)."""
    import pyarrow as pa

    if labels.ndim > 1:
        return float_lists(labels.reshape(len(labels), -1))
    if labels.dtype == np.bool_ or np.issubdtype(labels.dtype, np.integer):
        return pa.array(labels.astype(np.int64))
    return pa.array(labels.astype(np.float32))


def _numeric(name, array):
    array = np.asarray(array)
    if not (array.dtype == np.bool_ or np.issubdtype(array.dtype, np.number)) or \
            np.issubdtype(array.dtype, np.complexfloating):
        raise TypeError(f"`{name}` must hold real numbers. Received dtype {array.dtype}.")
    if array.ndim < 1:
        raise ValueError(f"`{name}` must have one row per sample. Received a scalar.")
    return array


def save_numpy_parquet(spark, x, y, path, num_partitions=None, mode="error",
                       features_col="features", label_col="label", packed=False):
    """Writes features ``x`` and labels ``y`` as a Parquet dataset in the trainers' layout.

    Columns: ``features_col`` as ``array<float>``, or packed float32 bytes (``binary``) with
    ``packed=True`` (each sample flattened; the trainers and `ModelPredictor` reshape rows
    to the model's input shape) and ``label_col``: ``bigint``
    class indices for a 1-D integer ``y``, ``float`` for a 1-D real ``y``, ``array<float>``
    for a 2-D ``y`` (one-hot). The arrays pass through the driver on their way to Spark,
    so they must fit in its memory; larger data is better written from a DataFrame with
    `save_parquet`.

    Args:
        spark: The SparkSession.
        x: Features, shape ``(samples, ...)``.
        y: Labels, shape ``(samples,)`` or ``(samples, ...)``.
        path: The folder to write (any filesystem the cluster reaches).
        num_partitions: Files to write (default: the session's default parallelism, at
            most one per sample).
        mode: As in `save_parquet`.
        features_col: Name of the features column.
        label_col: Name of the label column.
        packed: Write the features as packed float32 tensors (see `distkeras.data.tensors`),
            which Spark hands to the workers faster.

    Raises:
        ValueError: For ``x`` and ``y`` of different lengths, no samples or features,
            equal column names, or a bad ``mode``, ``num_partitions`` or ``path``.
        TypeError: For arrays that do not hold real numbers.
        FileExistsError: When ``path`` exists and ``mode`` is ``"error"``.
    """
    import pyarrow as pa

    x, y = _numeric("x", x), _numeric("y", y)
    if len(x) != len(y):
        raise ValueError(f"`x` and `y` must have one row per sample each; x has {len(x)} "
                         f"rows but y has {len(y)}.")
    if not len(x) or not x[0].size:
        raise ValueError(f"`x` holds no samples or no features (shape {x.shape}); there is "
                         "nothing to write.")
    if features_col == label_col:
        raise ValueError(f"`features_col` and `label_col` must differ. Both are "
                         f"{features_col!r}.")
    _check_write_arguments(path, num_partitions, mode)
    # Converted a slice at a time: float32 copies of one slice, and list offsets that fit
    # in 32 bits however large x is.
    to_column = pack_rows if packed else float_lists
    batches = [pa.RecordBatch.from_pydict({
        features_col: to_column(x[start:start + _ROWS_PER_BATCH].reshape(-1, x[0].size)),
        label_col: _label_array(y[start:start + _ROWS_PER_BATCH])})
        for start in range(0, len(x), _ROWS_PER_BATCH)]
    table = pa.Table.from_batches(batches)
    count = min(int(num_partitions or default_parallelism(spark)), len(x))
    save_parquet(spark.createDataFrame(table), path, count, mode)
