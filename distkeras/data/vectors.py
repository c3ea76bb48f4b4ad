"""Spark ML vector columns as Arrow brings them to Python, densified a minibatch at a time.

Spark sends a `VectorUDT` column through Arrow as its struct: ``type`` (0 sparse, 1
dense), ``size``, ``indices`` and ``values``. A sparse column such as ``HashingTF``'s
(``numFeatures=2**18``: 1 MiB per row once dense) travels as its few indices and values,
and `VectorRows` makes dense rows only for the slice a minibatch (or a model call) takes.
"""

import numpy as np
import pyarrow as pa

VECTOR_FIELDS = ("type", "size", "indices", "values")
SPARSE = 0  # the ``type`` of a sparse row (pyspark.ml.linalg.VectorUDT)


def is_vector_type(arrow_type):
    """Whether an Arrow type is the struct of a Spark ML vector."""
    return (pa.types.is_struct(arrow_type)
            and tuple(arrow_type.field(i).name for i in range(arrow_type.num_fields))
            == VECTOR_FIELDS)


def _list_parts(array):
    """The flat values of a list array and each row's bounds in them (from 0, for a
    sliced array too); a null row holds nothing."""
    offsets = array.offsets.to_numpy()
    return array.flatten().to_numpy(zero_copy_only=False), offsets - offsets[0]


class VectorRows:
    """The rows of one Arrow batch of a Spark ML vector column, dense on demand.

    ``rows[start:stop]`` is a dense ``(stop - start, *sample_shape)`` array; sparse and
    dense rows may mix (as `VectorAssembler` writes them). ``len(rows)`` is the number of
    rows.

    Args:
        column: A `pyarrow.StructArray` of vectors (`is_vector_type`), without nulls.
        sample_shape: The shape of one sample; each vector holds its values in C order.
        name: The column's name, for errors.
        dtype: The dtype of the dense rows (default float32).

    Raises:
        ValueError: Naming the column, for a vector whose size does not fit the shape.
    """

    def __init__(self, column, sample_shape, name, dtype=None):
        kinds, sizes, indices, values = column.flatten()
        self.sample_shape = tuple(sample_shape)
        self.dtype = np.dtype(dtype or np.float32)
        self.sparse = kinds.to_numpy(zero_copy_only=False) == SPARSE
        self.values, self.bounds = _list_parts(values)
        self.indices, _ = _list_parts(indices)  # dense rows have none
        counts = np.diff(self.bounds)
        # A sparse row's size is its `size`; a dense row's, its number of values.
        row_sizes = np.where(self.sparse, sizes.fill_null(0).to_numpy(zero_copy_only=False),
                             counts)
        self.width = int(np.prod(self.sample_shape)) if self.sample_shape else 1
        if (row_sizes != self.width).any():
            row = int(np.flatnonzero(row_sizes != self.width)[0])
            raise ValueError(
                f"Column {name!r} holds vectors of different sizes or of the wrong size: a "
                f"vector of size {int(row_sizes[row])} (row {row} of a batch of "
                f"{len(column)}), but the model expects {self.width} values per row (shape "
                f"{self.sample_shape}). Drop or fix those rows (for HashingTF or "
                "CountVectorizer, the model's input size is numFeatures or the vocabulary "
                "size).")
        # Where each row's indices start, for the sparse rows (dense rows add none).
        self.index_bounds = np.concatenate([[0], np.cumsum(np.where(self.sparse, counts, 0))])

    def __len__(self):
        return len(self.sparse)

    def __getitem__(self, key):
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("VectorRows takes a slice of consecutive rows, "
                            f"rows[start:stop]. Received: {key!r}")
        start, stop, _ = key.indices(len(self))
        return self.dense(start, max(start, stop))

    def to_numpy(self):
        """All the rows, dense."""
        return self.dense(0, len(self))

    def dense(self, start, stop):
        """Rows ``start`` to ``stop`` (excluded) as one dense array."""
        rows = stop - start
        out = np.zeros((rows, self.width), self.dtype)
        first, last = self.bounds[start], self.bounds[stop]
        counts = np.diff(self.bounds[start:stop + 1])
        row_of = np.repeat(np.arange(rows), counts)
        # A dense row's values go to positions 0, 1, ...; a sparse row's to its indices.
        column_of = np.arange(last - first) - np.repeat(self.bounds[start:stop] - first,
                                                        counts)
        sparse = np.repeat(self.sparse[start:stop], counts)
        column_of[sparse] = self.indices[self.index_bounds[start]:self.index_bounds[stop]]
        out[row_of, column_of] = self.values[first:last]
        return out.reshape((rows, *self.sample_shape))
