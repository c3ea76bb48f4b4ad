"""Packed tensor columns: each row's values as one binary of little-endian float32.

Spark hands an ``array<float>`` column to Python by writing every float into Arrow one at a
time; a binary column is copied whole. A DataFrame whose features are packed once (then
cached or saved to Parquet) reaches the workers and `ModelPredictor` faster in every
later epoch and call. Each row's bytes are the float32 values of one sample in C order; the
sample's shape comes from the model's input, as for a flat ``array<float>``.

Example::

    packed = PackedTensorTransformer(input_col="features", output_col="features").transform(df)
    packed = packed.cache()        # then train or predict on it as on `df`
"""

import typing

import numpy as np
import pyarrow as pa

from distkeras.errors import InvalidDataError

PACKED_DTYPE = np.dtype("<f4")
_MAX_BYTES = 2 ** 31 - 1  # Arrow's binary offsets are 32-bit


def is_list_type(arrow_type):
    """Whether an Arrow type is a list (variable, large or fixed-size)."""
    return (pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
            or pa.types.is_fixed_size_list(arrow_type))


def is_packed_type(arrow_type):
    """Whether an Arrow type holds packed tensors (a binary type)."""
    return (pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type)
            or pa.types.is_fixed_size_binary(arrow_type))


def pack_rows(matrix):
    """Rows of a 2-D array (or more: each row is flattened) as an Arrow binary array.

    Args:
        matrix: An array of shape ``(rows, ...)``; values are converted to float32.

    Returns:
        A `pyarrow.BinaryArray`, one value of ``4 * values_per_row`` bytes per row.

    Raises:
        ValueError: For 2 GiB of values or more in one array (convert fewer rows at a time).
    """
    values = np.ascontiguousarray(matrix, dtype=PACKED_DTYPE)
    rows = len(values)
    width = values.nbytes // rows if rows else 0
    return _binary_array(values.reshape(-1), np.arange(rows + 1, dtype=np.int64) * width)


def _binary_array(flat_values, byte_offsets):
    if byte_offsets[-1] > _MAX_BYTES:
        raise ValueError(f"{byte_offsets[-1]} bytes of values do not fit one Arrow binary "
                         "array (32-bit offsets); convert fewer rows at a time.")
    return pa.Array.from_buffers(
        pa.binary(), len(byte_offsets) - 1,
        [None, pa.py_buffer(byte_offsets.astype(np.int32)), pa.py_buffer(flat_values)])


def _null_error(name, what, fix):
    """The error for nulls met while packing: naming the column when known, as the feed
    does, and an `InvalidDataError` (a ValueError), which Spark's retries would meet again."""
    column_name = "The column" if name is None else f"Column {name!r}"
    return InvalidDataError(f"{column_name} holds {what}; {fix}")


def _row_bounds(column, name=None):
    """The flat values of a (nested) list array and each row's ``[start, end)`` into them."""
    bounds = np.arange(len(column) + 1, dtype=np.int64)
    values = column
    while True:
        if pa.types.is_fixed_size_list(values.type):
            size = values.type.list_size
            offsets = (np.arange(len(values) + 1, dtype=np.int64) + values.offset) * size
        elif pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
            offsets = values.offsets.to_numpy().astype(np.int64)
        else:
            return values, bounds
        if values.null_count:
            subset = "" if name is None else f" (for example `df.dropna(subset=[{name!r}])`)"
            raise _null_error(name, "null arrays", f"drop or fill them before packing{subset}.")
        bounds = offsets[bounds]
        values = values.values  # the whole child array: `offsets` index into it


def pack_arrow_column(column, name=None):
    """An Arrow column of (nested) lists of numbers as packed float32 rows.

    Rows may differ in length; training and prediction check each row's length against the
    model's input.

    Args:
        column: The Arrow list array.
        name: The Spark column it holds, named in the errors (None: not named).

    Raises:
        ValueError: For a column that is not lists; `InvalidDataError` (a ValueError) for
            null arrays or null values.
    """
    if not is_list_type(column.type):
        raise ValueError(f"Only arrays of numbers can be packed; got Arrow type {column.type}.")
    values, bounds = _row_bounds(column, name)
    if values.null_count:
        raise _null_error(name, "null values inside its arrays", "fill them first.")
    flat = values.to_numpy(zero_copy_only=False)[bounds[0]:bounds[-1]]
    flat = np.ascontiguousarray(flat, dtype=PACKED_DTYPE)
    return _binary_array(flat, (bounds - bounds[0]) * PACKED_DTYPE.itemsize)


def unpack_column(column, sample_shape, name):
    """A binary Arrow column of packed float32 rows as a ``(rows, *sample_shape)`` array.

    No copy on little-endian machines: the array is a read-only view of the Arrow buffer.

    Raises:
        ValueError: Naming the column, for a row whose byte length is not the model's
            ``4 * prod(sample_shape)``.
    """
    rows = len(column)
    size = int(np.prod(sample_shape)) if sample_shape else 1
    width = size * PACKED_DTYPE.itemsize
    if pa.types.is_fixed_size_binary(column.type):
        lengths_ok = column.type.byte_width == width
        data = column.buffers()[1]
        start = column.offset * column.type.byte_width
        found = f"every row has {column.type.byte_width} bytes"
    else:
        data = column.buffers()[2]
        offset_type = np.int64 if pa.types.is_large_binary(column.type) else np.int32
        offsets = np.frombuffer(column.buffers()[1], offset_type)[
            column.offset:column.offset + rows + 1]
        lengths = np.diff(offsets)
        lengths_ok = bool(np.all(lengths == width))
        start = int(offsets[0]) if rows else 0
        found = "" if lengths_ok else f"a row has {int(lengths[lengths != width][0])} bytes"
    if not lengths_ok:
        raise InvalidDataError(
            f"Column {name!r} holds packed float32 rows of the wrong length: {found}, but the "
            f"model expects {size} values per row ({width} bytes, shape "
            f"{tuple(sample_shape)}). Pack the right column, or reshape the model's input.")
    if not rows:
        return np.zeros((0, *sample_shape), np.float32)
    flat = np.frombuffer(data, PACKED_DTYPE, count=rows * size, offset=start)
    return flat.astype(np.float32, copy=False).reshape((rows, *sample_shape))


def packed_size(value):
    """The number of float32 values in one packed row (``bytes``), or a ValueError."""
    if len(value) % PACKED_DTYPE.itemsize:
        raise ValueError(
            f"A packed row has {len(value)} bytes, not a whole number of float32 values; "
            "a binary features column must hold float32 values (PackedTensorTransformer "
            "writes them).")
    return len(value) // PACKED_DTYPE.itemsize


def pack_udf(name=None):
    """A Spark Arrow UDF that packs an array column (``array<...<number>>``) into binary.

    Args:
        name: The column it packs, named in its errors (None: not named).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    def pack(batches: typing.Iterator[pa.Array]) -> typing.Iterator[pa.Array]:
        # Spark pickles this closure: it imports the packing where the task runs.
        from distkeras.data.tensors import pack_arrow_column

        for column in batches:
            yield pack_arrow_column(column, name)

    return F.arrow_udf(pack, T.BinaryType())
