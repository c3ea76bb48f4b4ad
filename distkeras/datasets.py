"""Real datasets as Spark DataFrames."""

import gzip
import logging
import os

import numpy as np

logger = logging.getLogger(__name__)

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
_FILES = {
    "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
    "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
}
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
                         "Shirt", "Sneaker", "Bag", "Ankle boot")


def read_idx(path):
    """Reads an IDX file (the MNIST format), gzipped or not, into a numpy array."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as handle:
        data = handle.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path} is not an IDX file (bad magic number).")
    dtype_code, ndim = data[2], data[3]
    dtypes = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
    if dtype_code not in dtypes:
        raise ValueError(f"{path}: unknown IDX element type 0x{dtype_code:02x}.")
    shape = tuple(int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim))
    array = np.frombuffer(data, dtype=dtypes[dtype_code], offset=4 + 4 * ndim)
    if array.size != int(np.prod(shape)):
        raise ValueError(f"{path}: holds {array.size} values, its header says {shape}.")
    return array.reshape(shape).astype(dtypes[dtype_code][1:])


def load_fashion_mnist_numpy(split="train", data_dir=None):
    """Fashion-MNIST as numpy arrays ``(images, labels)``.

    Reads the IDX files of Debian's ``dataset-fashion-mnist`` (or ``data_dir``); where they
    are missing, falls back to Keras's downloader, as a user with internet would.

    Args:
        split: ``"train"`` (60,000 images) or ``"test"`` (10,000).
        data_dir: Folder holding the four IDX files.

    Returns:
        ``images`` uint8 of shape (n, 28, 28) and ``labels`` uint8 of shape (n,).
    """
    if split not in _FILES:
        raise ValueError(f"`split` must be 'train' or 'test'. Received: split={split!r}")
    folder = data_dir or os.environ.get("DISTKERAS_FASHION_MNIST_DIR", FASHION_MNIST_DIR)
    images_file, labels_file = _FILES[split]
    images_path = os.path.join(folder, images_file)
    if os.path.exists(images_path):
        return read_idx(images_path), read_idx(os.path.join(folder, labels_file))
    logger.info("No Fashion-MNIST files in %s; using keras.datasets.fashion_mnist", folder)
    import keras

    (x_train, y_train), (x_test, y_test) = keras.datasets.fashion_mnist.load_data()
    return (x_train, y_train) if split == "train" else (x_test, y_test)


def to_arrow_table(images, labels, num_classes=10):
    """Images and integer labels as an Arrow table.

    Columns: ``features`` (784 floats in [0, 1]), ``label`` (one-hot, ``num_classes``
    floats) and ``label_index`` (the integer class).
    """
    import pyarrow as pa

    count = len(images)
    features = images.reshape(count, -1).astype(np.float32) / 255.0
    one_hot = np.zeros((count, num_classes), dtype=np.float32)
    one_hot[np.arange(count), labels.astype(np.int64)] = 1.0
    width = features.shape[1]
    return pa.table({
        "features": pa.ListArray.from_arrays(
            pa.array(np.arange(0, count * width + 1, width, dtype=np.int32)),
            pa.array(features.reshape(-1))),
        "label": pa.ListArray.from_arrays(
            pa.array(np.arange(0, count * num_classes + 1, num_classes, dtype=np.int32)),
            pa.array(one_hot.reshape(-1))),
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
    temporary = f"{path}.tmp-{os.getpid()}"
    pq.write_table(table, temporary, row_group_size=row_group_size, compression=compression)
    os.replace(temporary, path)


def load_fashion_mnist(spark, split="train", limit=None, num_partitions=None, data_dir=None,
                       cache_dir=None):
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

    Returns:
        A DataFrame with ``features`` (array<float>, 784 values in [0, 1]), ``label``
        (array<float>, one-hot over 10 classes) and ``label_index`` (bigint).
    """
    name = f"fashion_mnist_{split}" + ("" if limit is None else f"_{int(limit)}") + "_v1.parquet"
    path = os.path.join(cache_dir or default_cache_dir(), name)
    if not os.path.exists(path):
        images, labels = load_fashion_mnist_numpy(split, data_dir)
        if limit is not None:
            images, labels = images[:limit], labels[:limit]
        write_parquet(to_arrow_table(images, labels), path)
    dataframe = spark.read.parquet(path)
    return dataframe.repartition(num_partitions) if num_partitions else dataframe
