"""Minibatches for a worker, built from the Arrow record batches of its partition.

Spark hands a worker its partition as Arrow record batches (``mapInArrow``); each column
becomes a numpy array in one vectorized conversion, and minibatches are views into it.
Memory stays bounded by one record batch plus one minibatch, whatever the partition size.
"""

import numpy as np
import pyarrow as pa

from distkeras.errors import InvalidDataError
from distkeras.data.sample_weights import per_row, row_weights
from distkeras.data.tensors import is_list_type, is_packed_type, unpack_column
from distkeras.data.vectors import VectorRows, is_vector_type

# The session's setting of the rows per Arrow record batch a worker gets.
ARROW_BATCH_KEY = "spark.sql.execution.arrow.maxRecordsPerBatch"
# Rows per Arrow record batch in the training job, unless the session sets its own. Spark's
# default (10,000) makes a worker wait for the JVM to convert 10,000 rows (0.17 s for
# Fashion-MNIST) before its first step; smaller batches reach the same throughput.
FEED_RECORDS_PER_BATCH = 2048


def arrow_name(name):
    """The name a training column travels under to the workers.

    PySpark's ``mapInArrow`` resolves each column by its name, and reads ``a.b`` as the
    field ``b`` of a struct ``a``: such names travel hex-encoded (one to one, so two
    columns never collide).
    """
    if "." not in name and "`" not in name:
        return name
    return "__distkeras_" + name.encode("utf-8").hex()


def integer_dtype(tensor):
    """The numpy dtype of a Keras input (or output) tensor when it is an integer one, else
    None: such an input is fed as it is typed (token ids above 2**24 are not exact in
    float32)."""
    dtype = np.dtype(getattr(tensor, "dtype", "float32") or "float32")
    return dtype if np.issubdtype(dtype, np.integer) else None


def column_rows(column, sample_shape, name, dtype=None, finite=False):
    """An Arrow column as `column_to_numpy` reads it, except that Spark ML vectors stay as
    they came (`vectors.VectorRows`): slicing it gives dense rows, so a sparse column is
    densified one minibatch at a time."""
    if is_vector_type(column.type):
        _check_no_nulls(column, name)
        rows = VectorRows(column, sample_shape, name, dtype)
        if finite:
            check_finite(rows.values, name, "array", rows.bounds)
        return rows
    return column_to_numpy(column, sample_shape, name, dtype, finite)


def _check_no_nulls(column, name):
    # `df.dropna()` without a subset would also drop the rows with a null in any other
    # column (a comment, an optional field): often most of a real table.
    if column.null_count:
        raise InvalidDataError(
            f"Column {name!r} has {column.null_count} null values in this partition; "
            f"drop or fill them first (for example `df.dropna(subset=[{name!r}])`)."
        )


def column_to_numpy(column, sample_shape, name, dtype=None, finite=False):
    """An Arrow column of numbers, (nested) lists, packed tensors or Spark ML vectors (as
    their struct, `vectors.VectorRows`) as a numpy array of ``(rows, *shape)``.

    Lists, vectors and packed (binary) rows become float32; scalar integer columns (sparse
    labels) become int32, or float32 where their values do not fit in int32. With an
    integer ``dtype`` (an input typed so, `integer_dtype`), numbers, vectors and lists
    become that dtype instead.

    With ``finite``, NaN and infinite values are refused (`check_finite`), before any cast
    to an integer ``dtype`` would turn them into arbitrary integers.

    Raises:
        InvalidDataError: Naming the column, for nulls or a number of values that does not fit
            (or, with ``finite``, NaN or infinite values).
    """
    rows = len(column)
    _check_no_nulls(column, name)
    if is_vector_type(column.type):
        vectors = VectorRows(column, sample_shape, name, dtype)
        if finite:
            check_finite(vectors.values, name, "array", vectors.bounds)
        return vectors.to_numpy()
    if is_packed_type(column.type):
        values = unpack_column(column, sample_shape, name)
        if finite:
            check_finite(values, name, "packed")
        return values
    if is_list_type(column.type):
        size = int(np.prod(sample_shape)) if sample_shape else 1
        values, counts = _flatten_rows(column, name, sample_shape)
        if len(values) != rows * size or (counts != size).any():
            row = int(np.flatnonzero(counts != size)[0])
            tokens = dtype is not None and np.issubdtype(dtype, np.integer)
            fix = padding_hint(name, size) if tokens and len(sample_shape) == 1 else ("Drop or fix those rows, for example "
                                             "`df.where(F.size(column) == expected)`.")
            raise InvalidDataError(
                f"Column {name!r} holds arrays of different lengths or of the wrong length: "
                f"a row of {int(counts[row])} values (row {row} of a batch of {rows}), but "
                f"the model expects {size} per row (shape {tuple(sample_shape)}). {fix}"
            )
        flat = values.to_numpy(zero_copy_only=False)
        if finite:
            check_finite(flat.reshape((rows, size)), name, "array")
        return flat.astype(dtype or np.float32, copy=False).reshape((rows, *sample_shape))
    size = int(np.prod(sample_shape)) if sample_shape else 1
    if size != 1:
        raise InvalidDataError(
            f"Column {name!r} holds one number per row, but the model expects {size} per row "
            f"(shape {tuple(sample_shape)}).")
    flat = column.to_numpy(zero_copy_only=False)
    if finite:
        check_finite(flat, name, "number")
    if sample_shape:
        flat = flat.reshape((rows, *sample_shape))
    if dtype is not None:
        return flat.astype(dtype, copy=False)
    if np.issubdtype(flat.dtype, np.integer):
        return _integers(flat)
    return flat.astype(np.float32, copy=False)


def check_finite(values, name, kind, bounds=None):
    """Raises a clear error for NaN or infinite values among a column's numbers.

    One of them in a minibatch makes its loss NaN, and every weight NaN after the step
    (and, through the parameter server, every worker's): Keras's ``fit`` trains on them
    without a word, so the training refuses them here, naming the column and the row.

    Args:
        values: The column's numbers (a batch's), any shape, its rows first: or, with
            ``bounds``, flat.
        name: The column's name, for the error.
        kind: ``"number"``, ``"array"`` (or Spark ML vector) or ``"packed"``: how to
            drop the rows in Spark differs.
        bounds: For flat ``values``, where each row's values start (and the last ends).

    Raises:
        InvalidDataError: Naming the column, the first such row and how to drop or fill them.
    """
    values = np.asarray(values)
    if values.dtype == object:  # decimals: finite by construction
        return
    if not np.issubdtype(values.dtype, np.floating):
        return
    bad = ~np.isfinite(values)
    if not bad.any():
        return
    first = int(np.flatnonzero(bad.reshape(-1))[0])
    if bounds is not None:
        rows = len(bounds) - 1
        row = int(np.searchsorted(bounds, first, side="right")) - 1
    else:
        rows = len(values)
        row = first // max(1, values[:1].size)
    what = "NaN" if np.isnan(values.reshape(-1)[first]) else "infinite"
    raise InvalidDataError(
        f"Column {name!r} holds {int(bad.sum())} NaN or infinite values (the first, "
        f"{what}, in row {row} of a batch of {rows} in this partition): one of them makes "
        "a step's loss NaN and every weight NaN after it. Drop or fill those rows first, "
        f"for example {_finite_hint(name, kind)}.")


def _finite_hint(name, kind):
    """How to keep only the rows of column ``name`` (of ``kind``) whose values are finite,
    in Spark."""
    if kind == "number":
        return (f"`df.na.drop(subset=[{name!r}])` (Spark drops NaN as null there) or "
                f"`df.na.fill(0.0, subset=[{name!r}])`; infinite values with "
                f"`df.where(F.abs({name!r}) != float('inf'))`")
    values = "F.col(<the array column packed>)" if kind == "packed" else f"F.col({name!r})"
    hint = (f"`df.where(F.forall({values}, lambda v: ~F.isnan(v) & "
            "(F.abs(v) != float('inf'))))`")
    if kind == "packed":
        return hint
    # Dense Spark ML vectors reach the workers as arrays: the kind cannot tell them apart.
    return (f"{hint} (for a Spark ML vector column, "
            f"`pyspark.ml.functions.vector_to_array(F.col({name!r}))` in place of "
            f"`F.col({name!r})`)")


def _integers(values):
    """Integer numbers as int32 (class indices), or as float32 where some do not fit in
    int32: a ``long`` regression target or feature (an amount in cents, a timestamp in
    milliseconds) would otherwise wrap around, silently."""
    bounds = np.iinfo(np.int32)
    if values.size and (values.min() < bounds.min or values.max() > bounds.max):
        return values.astype(np.float32)
    return values.astype(np.int32, copy=False)


def padding_hint(name, length):
    """How to pad or cut sequences of token ids (a column feeding an integer input) to the
    model's ``length``: dropping the rows that do not fit would drop most of a text set."""
    return (f"For token ids, pad or cut every row to {length} first, for example "
            f"`df.withColumn({name!r}, F.slice(F.concat(F.col({name!r}), "
            f"F.array_repeat(F.lit(0), {length})), 1, {length}))` (0 is the padding that "
            "Embedding(mask_zero=True) masks).")


def _flatten_rows(column, name, sample_shape):
    """The leaf values of a (nested) list column and the number of them in each row.

    Every row is checked, not only the total: rows of 4 and 6 values next to each other
    must not pass as two rows of 5. Where the lists nest as deep as ``sample_shape``, each
    level's lengths must be its dimension too.

    Raises:
        InvalidDataError: For null values inside the arrays (Arrow would make them NaN), or
            nested lengths that do not match ``sample_shape``.
    """
    levels = []
    values = column
    while is_list_type(values.type):
        if pa.types.is_fixed_size_list(values.type):
            offsets = np.arange(len(values) + 1) * values.type.list_size
        else:
            offsets = values.offsets.to_numpy()
            offsets = offsets - offsets[0]  # a sliced array's offsets start past zero
        levels.append(offsets)
        values = values.flatten()
        if values.null_count:
            raise InvalidDataError(
                f"Column {name!r} has {values.null_count} null values inside its arrays "
                "(in one Arrow batch of this partition); fill or drop those rows first "
                "(nulls would train as NaN).")
    if len(levels) == len(sample_shape) > 1:
        for depth, (offsets, expected) in enumerate(zip(levels, sample_shape)):
            if (np.diff(offsets) != expected).any():
                raise InvalidDataError(
                    f"Column {name!r} holds nested arrays whose level {depth + 1} has lengths "
                    f"other than {expected}; the model expects rows of shape "
                    f"{tuple(sample_shape)}.")
    bounds = levels[0]
    for offsets in levels[1:]:
        bounds = offsets[bounds]  # each row's bounds, one level further down
    return values, np.diff(bounds)


def check_class_indices(labels, num_classes, where):
    """Checks that class-index labels are whole numbers in ``[0, num_classes)``.

    JAX does not check indices: a label of 10 for a 10-class output would train on
    garbage, silently.

    Args:
        labels: The labels, a numpy array.
        num_classes: Units of the model's output.
        where: What holds them, for the error ("Column 'label'").

    Raises:
        InvalidDataError: Naming where, the first label that does not fit and its row.
    """
    if labels.size == 0:
        return
    low, high = labels.min(), labels.max()
    bad = None
    if low < 0 or high >= num_classes:
        bad = low if low < 0 else high
    elif np.issubdtype(labels.dtype, np.floating) and not np.array_equal(labels,
                                                                         np.floor(labels)):
        bad = labels[labels != np.floor(labels)][0]
    if bad is not None:
        # The first row that holds it (a row of a tagger's labels holds one per step).
        row = int(np.flatnonzero((labels == bad).reshape(len(labels), -1).any(axis=1))[0])
        raise InvalidDataError(
            f"{where} holds the class index {bad.item()!r}, but the model's output "
            f"has {num_classes} classes: labels must be whole numbers from 0 to "
            f"{num_classes - 1} (for string or 1-based labels, index them first, for "
            f"example with pyspark.ml.feature.StringIndexer). The first is in row {row} "
            f"of {len(labels)}.")


def _pick(arrays, single):
    return arrays[0] if single else arrays


def input_names(model):
    """The names of a model built on a dict of inputs (``keras.Model({"a": ..., ...},
    ...)``), in the order of ``model.inputs`` (Keras's: the names sorted); None for any
    other model."""
    import keras

    # Functional models keep the structure they were built on; others have none.
    structure = getattr(model, "_inputs_struct", None)
    if not isinstance(structure, dict):
        return None
    return keras.tree.flatten({name: name for name in structure})


def output_keys(model):
    """The keys of a model built on a dict of several outputs (``keras.Model(x, {"class":
    ..., "box": ...})``), in the order of ``model.outputs`` (Keras's: the keys sorted);
    None for any other model."""
    import keras

    # Functional models keep the structure they were built on; others have none.
    structure = getattr(model, "_outputs_struct", None)
    if not isinstance(structure, dict) or len(structure) != len(model.outputs):
        return None  # not a dict, or a nested one
    # The model's own flattening order (an OrderedDict's keys in their order).
    return [str(path[0]) for path, _ in keras.tree.flatten_with_path(structure)]


def output_names(model):
    """The names Keras gives a model's outputs, in the order of ``model.outputs``.

    For a model built on a dict of outputs these are the dict's keys (`output_keys`):
    `predict` returns its dict by them, and `fit` (``y``), ``compile`` (``loss``,
    ``metrics``) and the logs (``class_accuracy``) name the outputs by them, whatever the
    output layers are called. ``model.output_names`` names the layers, which may differ
    (or be another output's key). Other models' outputs are named as
    ``model.output_names`` (a Sequential model's, as its tensor).
    """
    return output_keys(model) or list(getattr(model, "output_names", None) or
                                      [tensor.name for tensor in model.outputs])


def model_outputs(arrays, keys, single):
    """Labels (one array per model output, in order) as the model is fit on them: a dict
    by key where ``keys`` is given (`output_keys`), else one array or the list.

    Keras pairs a list of labels with a dict model's outputs by ``model.output_names``
    when those are the dict's keys in another order (layers named as another output's
    key): its metrics then compared each output with another's labels. A dict is paired
    by key.
    """
    if keys is not None and not single:
        return dict(zip(keys, arrays))
    return _pick(arrays, single)


def model_inputs(arrays, names, single):
    """``arrays`` (one per model input, in order) as the model takes them: a dict by
    input name where ``names`` is given (Keras refuses a list for a dict of inputs whose
    names are not in sorted order), else one array or the list."""
    if names is not None:
        return dict(zip(names, arrays))
    return _pick(arrays, single)


class MinibatchFeed:
    """Iterates ``(x, y)`` minibatches over a stream of Arrow record batches.

    The last minibatch of the stream, and of each epoch where the stream marks epochs
    (`epochs.EPOCH_END`), may be smaller than ``batch_size``; it is yielded, not dropped. With sample or class weights, minibatches are ``(x, y, sample_weight)``.

    Args:
        record_batches: An iterator of `pyarrow.RecordBatch`.
        features_cols: Column names of the model's inputs, in order.
        label_cols: Column names of the model's outputs (targets), in order.
        batch_size: Rows per minibatch.
        feature_shapes: Per input, the shape of one sample (``()`` for a scalar).
        label_shapes: Per output, the shape of one target (``()`` for a scalar).
        single_input: Whether ``x`` is one array rather than a list.
        single_output: Whether ``y`` is one array rather than a list.
        weight_col: A column of per-row sample weights, or None.
        class_table: Per class index, its weight (`sample_weights.validate`), or None.
        num_classes: Per output, the number of classes where the labels are class indices
            (checked, see `check_class_indices`), else None.
        feature_dtypes: Per input, its integer dtype (`integer_dtype`) or None.
        output_shapes: The model's output shapes: row weights are shaped for a per-row
            loss of several values (`sample_weights.per_row`).
        input_names: For a model built on a dict of inputs (`input_names`), their names:
            ``x`` is then a dict by name.
        output_keys: For a model built on a dict of outputs (`output_keys`), its keys:
            ``y`` is then a dict by key.
    """

    def __init__(self, record_batches, features_cols, label_cols, batch_size,
                 feature_shapes, label_shapes, single_input=True, single_output=True,
                 weight_col=None, class_table=None, num_classes=None, feature_dtypes=None,
                 output_shapes=None, input_names=None, output_keys=None):
        self.record_batches = record_batches
        self.input_names = input_names
        self.output_keys = output_keys
        self.features_cols = list(features_cols)
        self.label_cols = list(label_cols)
        self.batch_size = batch_size
        self.feature_shapes = [tuple(shape) for shape in feature_shapes]
        self.label_shapes = [tuple(shape) for shape in label_shapes]
        self.single_input = single_input
        self.single_output = single_output
        self.weight_col = weight_col
        self.class_table = None if class_table is None else np.asarray(class_table, np.float32)
        self.weighted = weight_col is not None or class_table is not None
        self.num_classes = list(num_classes or [None] * len(self.label_cols))
        self.feature_dtypes = list(feature_dtypes or [None] * len(self.features_cols))
        self.output_shapes = [tuple(shape) for shape in output_shapes or ()]
        self.samples = 0
        self.epoch_ends = []  # samples yielded when each marked epoch ended
        self._iterator = self._minibatches()

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._iterator)

    def _convert(self, record_batch):
        # Features may be sparse vectors (1 MiB a row once dense for HashingTF's 2**18):
        # kept as they came, they are densified by the minibatch slice.
        # NaN or infinite numbers are refused: they would make every weight NaN.
        x = [column_rows(record_batch.column(arrow_name(name)), shape, name, dtype,
                         finite=True)
             for name, shape, dtype in zip(self.features_cols, self.feature_shapes,
                                           self.feature_dtypes)]
        y = [column_to_numpy(record_batch.column(arrow_name(name)), shape, name, finite=True)
             for name, shape in zip(self.label_cols, self.label_shapes)]
        for labels, num_classes, name in zip(y, self.num_classes, self.label_cols):
            if num_classes is not None:
                check_class_indices(labels, num_classes, f"Column {name!r}")
        if not self.weighted:
            return x + y
        weights = None if self.weight_col is None else \
            column_to_numpy(record_batch.column(arrow_name(self.weight_col)), (),
                            self.weight_col)
        return x + y + [per_row(row_weights(record_batch.num_rows, weights, y[0],
                                            self.class_table, self.weight_col),
                                self.output_shapes)]

    def _located(self, record_batch, first_row):
        """`_convert` of a record batch that starts at the partition's row ``first_row``.

        Its errors count rows within the batch: a later batch of a large partition says
        "row 5 of a batch of 1000" of a row that is the partition's 3005th, so they are
        told where the batch lies.
        """
        try:
            return self._convert(record_batch)
        except InvalidDataError as error:
            if first_row == 0:  # the batch starts the partition: its rows are the partition's
                raise
            last_row = first_row + record_batch.num_rows - 1
            raise InvalidDataError(f"{error} (That batch holds rows {first_row} to "
                                   f"{last_row} of this partition.)") from error

    def _minibatches(self):
        size = self.batch_size
        pending = None  # arrays holding fewer than `size` rows, carried to the next batch
        first_row = 0  # the partition's row (in this epoch) that the next batch starts at
        for record_batch in self.record_batches:
            if record_batch is None:  # an epoch ends (`epochs.EPOCH_END`): so does its batch
                if pending is not None and len(pending[0]):
                    yield self._split(pending)
                pending = None
                self.epoch_ends.append(self.samples)
                first_row = 0
                continue
            if record_batch.num_rows == 0:
                continue
            arrays = self._located(record_batch, first_row)
            first_row += record_batch.num_rows
            start = 0
            if pending is not None:
                start = min(size - len(pending[0]), len(arrays[0]))
                pending = [np.concatenate([p, a[:start]]) for p, a in zip(pending, arrays)]
                if len(pending[0]) < size:
                    continue
                yield self._split(pending)
                pending = None
            rows = len(arrays[0])
            end = start + (rows - start) // size * size
            for offset in range(start, end, size):
                yield self._split([a[offset:offset + size] for a in arrays])
            if end < rows:
                pending = [a[end:].copy() for a in arrays]
        if pending is not None and len(pending[0]):
            yield self._split(pending)

    def epoch_of(self, samples):
        """The epoch (from 0) of the sample after the first ``samples`` yielded; an array
        of them for an array of counts."""
        return np.searchsorted(self.epoch_ends, samples, side="right")

    def _split(self, arrays):
        inputs, outputs = len(self.features_cols), len(self.label_cols)
        self.samples += len(arrays[0])
        # No label columns (label_col=None): y is None, as for fit(x).
        batch = (model_inputs(arrays[:inputs], self.input_names, self.single_input),
                 model_outputs(arrays[inputs:inputs + outputs], self.output_keys,
                               self.single_output) if outputs else None)
        return (*batch, arrays[-1]) if self.weighted else batch
