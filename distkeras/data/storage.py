"""Bytes to and from any path the cluster's filesystem understands.

``hdfs://``, ``s3a://``, ``gs://``, ``abfs://``, ``file://`` and plain paths are resolved by
the active SparkSession's Hadoop filesystem, so the cluster's own configuration and
credentials apply; local files are then read and written directly. Without a SparkSession,
and from a Spark Connect client (which has no JVM), plain and ``file://`` paths are this
machine's files, and other file systems are refused with a clear error. Writes go to a
temporary name first and are renamed into place, so a reader never sees half a file.
"""

import contextlib
import logging
import os
import uuid
from urllib.parse import urlparse

from distkeras.session import is_connect

logger = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20


def _active_spark():
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def _is_local(path):
    scheme = urlparse(path).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")


def _require_local(path, spark=None):
    if _is_local(path):
        return
    if spark is not None:  # a Spark Connect session
        raise RuntimeError(
            f"Reaching {path} needs the cluster's Hadoop filesystem, which a Spark Connect "
            "client does not have (no JVM on the client). Use a path on this machine, or "
            "a classic SparkSession (SparkSession.builder.master(...).getOrCreate()).")
    raise RuntimeError(
        f"Reaching {path} needs the cluster's Hadoop filesystem: start a SparkSession "
        "first (its configuration and credentials are used).")


def _local_path(path):
    return urlparse(path).path if path.startswith("file:") else path


class HadoopFS:
    """The Hadoop FileSystem of ``path``, reached through the SparkSession's JVM.

    Args:
        spark: The active SparkSession (its Hadoop configuration and credentials are used).
        path: A path or URI; relative ones resolve as Spark resolves them.
    """

    def __init__(self, spark, path):
        if is_connect(spark):
            _require_local(path, spark)
            raise RuntimeError(
                f"{path}: Hadoop's FileSystem needs a classic SparkSession; this is a "
                "Spark Connect one.")
        self.jvm = spark.sparkContext._jvm
        self.conf = spark.sparkContext._jsc.hadoopConfiguration()
        path = self.jvm.org.apache.hadoop.fs.Path(path)
        self.fs = path.getFileSystem(self.conf)
        # Qualified (scheme and absolute path): a relative path's parent would otherwise be
        # "", and the temporary file of a write would go to the filesystem's root.
        self.path = self.fs.makeQualified(path)

    def is_directory(self):
        return self.fs.exists(self.path) and self.fs.getFileStatus(self.path).isDirectory()

    def child(self, path):
        return self.jvm.org.apache.hadoop.fs.Path(path)

    def rename_over(self, source, target):
        """Renames, replacing ``target``; atomic where the filesystem supports it."""
        fs_class = self.jvm.org.apache.hadoop.fs
        context = fs_class.FileContext.getFileContext(self.fs.getUri(), self.conf)
        gateway = _active_spark().sparkContext._gateway
        renames = gateway.new_array(fs_class.Options.Rename, 1)
        renames[0] = fs_class.Options.Rename.OVERWRITE
        context.rename(source, target, renames)


def _local_file(path, spark):
    """The local file that ``path`` names, or None when it is on another filesystem.

    With a classic SparkSession, a plain path is resolved as Spark resolves it (against
    the cluster's default filesystem, HDFS on many clusters); under Spark Connect it is
    a path on this machine, and other schemes are refused. Local files are then read and
    written directly: Hadoop's local filesystem would leave a hidden ``.crc`` checksum
    file beside each file written.
    """
    if spark is None or is_connect(spark):
        _require_local(path, spark)
        return _local_path(path)
    uri = HadoopFS(spark, path).path.toUri()
    return uri.getPath() if uri.getScheme() == "file" else None


def is_directory(path):
    """Whether ``path`` is an existing folder."""
    spark = _active_spark()
    local = _local_file(path, spark)
    if local is not None:
        return os.path.isdir(local)
    return HadoopFS(spark, path).is_directory()


def _folder_error(path):
    return IsADirectoryError(f"{path} is a folder: give the path of a file.")


def read_bytes(path):
    """Reads a whole file.

    Raises:
        FileNotFoundError: Naming the path, when it does not exist.
        IsADirectoryError: Naming the path, when it is a folder.
    """
    spark = _active_spark()
    local = _local_file(path, spark)
    if local is not None:
        if not os.path.exists(local):
            raise FileNotFoundError(f"No such file: {path}")
        if os.path.isdir(local):
            raise _folder_error(path)
        with open(local, "rb") as handle:
            return handle.read()
    hadoop = HadoopFS(spark, path)
    if not hadoop.fs.exists(hadoop.path):
        raise FileNotFoundError(f"No such file: {path}")
    if hadoop.is_directory():
        raise _folder_error(path)
    stream = hadoop.fs.open(hadoop.path)
    try:
        return bytes(stream.readAllBytes())
    finally:
        stream.close()


def check_writable(path):
    """Refuses, before any work, a path that a write could not create.

    Local paths only are checked for a file in the way: a Hadoop filesystem's write finds
    that itself.

    Raises:
        IsADirectoryError: Naming the path, when it is a folder.
        NotADirectoryError: Naming the file that stands where a folder of the path goes
            (``notes.txt/model.keras``), which ``os.makedirs`` reported as "File exists".
    """
    if is_directory(path):
        raise _folder_error(path)
    local = _local_file(path, _active_spark())
    if local is None:
        return
    folder = os.path.dirname(os.path.abspath(local))
    while not os.path.exists(folder):  # the folders that the write would make
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise NotADirectoryError(f"cannot write {path}: {folder} is a file, not a folder.")


@contextlib.contextmanager
def replacing_local_file(path):
    """A temporary path next to the local file ``path``, for a writer that needs a path
    (pyarrow, csv): it replaces ``path`` when the block succeeds and is removed when it
    fails (a full disk, a value that cannot be written), so nothing is left behind.

    Yields:
        The temporary path to write.
    """
    temporary = f"{path}.tmp-{os.getpid()}"
    try:
        yield temporary
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.remove(temporary)


@contextlib.contextmanager
def atomic_writer(path):
    """A writable stream whose content replaces ``path`` only when the block succeeds.

    Yields:
        An object with ``write(bytes)``. On an exception inside the block the temporary
        file is removed and ``path`` is left as it was.

    Raises:
        IsADirectoryError: Naming the path, when it is a folder (before anything is written).
        NotADirectoryError: Naming the file in the way, when the path is under a file.
    """
    check_writable(path)
    spark = _active_spark()
    local = _local_file(path, spark)
    if local is not None:
        folder = os.path.dirname(os.path.abspath(local))
        os.makedirs(folder, exist_ok=True)
        temporary = os.path.join(folder, f".{os.path.basename(local)}.tmp-{uuid.uuid4().hex}")
        try:
            with open(temporary, "wb") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(temporary, local)
        finally:
            if os.path.exists(temporary):
                os.remove(temporary)
        return
    hadoop = HadoopFS(spark, path)
    parent = hadoop.path.getParent()
    temporary = hadoop.child(f"{parent.toString()}/.{hadoop.path.getName()}.tmp-{uuid.uuid4().hex}")
    stream = hadoop.fs.create(temporary, True)
    done = False
    try:
        yield _JavaStreamWriter(stream)
        stream.close()
        hadoop.rename_over(temporary, hadoop.path)
        done = True
    finally:
        if not done:
            with contextlib.suppress(Exception):  # py4j errors of every kind: clean up only
                stream.close()
            hadoop.fs.delete(temporary, False)


class _JavaStreamWriter:
    def __init__(self, stream):
        self.stream = stream

    def write(self, data):
        view = memoryview(data)
        for start in range(0, len(view), CHUNK_BYTES):
            self.stream.write(bytearray(view[start:start + CHUNK_BYTES]))


def write_bytes(path, data):
    """Writes ``data`` to ``path`` atomically (temporary name, then rename)."""
    with atomic_writer(path) as out:
        out.write(data)
