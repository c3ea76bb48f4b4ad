"""Distributed inference: add a Keras model's predictions to a Spark DataFrame.

The model travels to the executors as the bytes of a ``.keras`` archive (no pickle) and is
rebuilt with ``safe_mode=True`` once per Python worker process: Spark reuses its Python
workers, and each keeps the last model it rebuilt (with its compiled predict function),
keyed by a hash of the archive. Predictions come from an Arrow UDF (``arrow_udf``,
iterator form): only the feature columns travel to Python and only the prediction comes
back, while Spark carries every other column of the row itself. A plain Parquet scan is
read by the Python workers themselves instead (`distkeras.data.parquet_source`), which send
back every column with the predictions: Spark's row-to-Arrow conversion was most of the
cost (docs/parquet-feed.md).

Example::

    predictor = ModelPredictor(keras_model=model, features_col="features")
    predicted = predictor.predict(dataframe)      # + "prediction": array<float>
"""

import gc
import hashlib
import io
import logging
import os
import zipfile

import numpy as np

from distkeras import errors
from distkeras.data.dataframes import (check_column_order, check_first_row,
                                       check_input_count, check_known_inputs,
                                       check_output_column_free, check_spark_dataframe,
                                       column, columns_by_name, sparse_vector_columns,
                                       vector_values)
from distkeras.data.feed import integer_dtype, output_names
from distkeras.training_jobs import check_executor_python
from distkeras.ml.columns import as_output_type, column_kind
from distkeras.ml.params import OUTPUT_TYPES

logger = logging.getLogger(__name__)

# Per Python worker process: the last model rebuilt there ("key", "model", and "settled":
# whether `_settle` has frozen it), and how many models this process has rebuilt
# ("builds", kept across models).
_CACHE = {}


def check_batch_size(batch_size):
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or \
            batch_size < 1:
        raise ValueError(
            f"`batch_size` must be an integer >= 1. Received: batch_size={batch_size!r}")


def _model_key(model_bytes):
    """A hash of a ``.keras`` archive's architecture and weights.

    The archive's save date (``metadata.json``, the zip entries' times) is left out, so
    saving the same model twice gives the same key and the executors keep their copy.
    """
    digest = hashlib.sha256()
    with zipfile.ZipFile(io.BytesIO(model_bytes)) as archive:
        for name in sorted(archive.namelist()):
            if name != "metadata.json":
                data = archive.read(name)
                digest.update(f"{name}\0{len(data)}\0".encode())
                digest.update(data)
    return digest.hexdigest()


def _cached_model(key, model_bytes, objects=None):
    """The model of ``model_bytes``, rebuilt only when this process holds another one.

    Replacing the model unfreezes what `_settle` froze first, so the old model's reference
    cycles are collected rather than kept for the life of the worker.

    Args:
        key: `_model_key` of the archive.
        model_bytes: The `.keras` archive.
        objects: The custom objects the model names (`distkeras.custom_objects.find`).
    """
    if _CACHE.get("key") == key:
        return _CACHE["model"]
    from distkeras import custom_objects
    from distkeras.utils import deserialize_model

    builds = _CACHE.get("builds", 0)
    if _CACHE:
        _CACHE.clear()
        gc.unfreeze()
        gc.collect()
    with custom_objects.scope(objects):
        model = deserialize_model(model_bytes)
    _CACHE.update(key=key, model=model, settled=False, builds=builds + 1)
    logger.debug("Rebuilt the model to predict with (%d rebuilt in this process).",
                 builds + 1)
    return model


def _settle():
    """Freezes the objects alive after the model's first prediction (imports, model,
    compiled function).

    Spark's Python worker runs ``gc.collect()`` after every task; with Keras and JAX loaded
    that full collection walks ~250,000 objects (0.1 s a task measured, on the critical path
    of back-to-back jobs). Frozen objects are skipped.
    """
    if not _CACHE.get("settled", True):
        gc.collect()
        gc.freeze()
        _CACHE["settled"] = True


def _call_size(rows, batch_size):
    """The rows of each model call for a batch of ``rows``: ``batch_size``, or for a batch
    with fewer rows, the smallest power of two that holds them.

    Padding such a batch to ``batch_size`` ran the model on, and allocated, up to
    ``batch_size`` rows for a few (a million for 37 with ``batch_size=10**6``); powers of
    two keep the shapes a compiling backend sees to a few.
    """
    return min(batch_size, 1 << max(rows - 1, 0).bit_length())


def _predict_in_chunks(model, inputs, batch_size):
    """Predicts ``batch_size`` rows per call; the last chunk is padded to ``batch_size`` rows,
    so a compiling backend (JAX) compiles one input shape only (a batch of fewer rows: to
    `_call_size`'s).

    Returns:
        One ``(rows, values)`` float32 matrix per model output.
    """
    import keras

    from distkeras.data.feed import input_names, model_inputs

    rows = len(inputs[0])
    batch_size = _call_size(rows, batch_size)
    chunks = []  # per call, the list of its outputs
    for start in range(0, rows, batch_size):
        chunk = [array[start:start + batch_size] for array in inputs]
        count = len(chunk[0])
        if count < batch_size:
            chunk = [np.concatenate([array, np.zeros((batch_size - count, *array.shape[1:]),
                                                     array.dtype)]) for array in chunk]
        prediction = model.predict_on_batch(
            model_inputs(chunk, input_names(model), len(chunk) == 1))
        # A list, a tuple or a dict by output name (flattened in the order of
        # `model.output_names`, the keys sorted) for several outputs; else one array.
        outputs = keras.tree.flatten(prediction)
        chunks.append([np.asarray(output)[:count] for output in outputs])
    return [np.concatenate(parts).reshape(rows, -1).astype(np.float32, copy=False)
            for parts in zip(*chunks)]


def _input_arrays(columns, names, input_shapes, dtypes):
    """One Arrow batch of feature columns as the model's inputs, checked (nulls, sizes)
    before any model is loaded: inputs typed as integers (token ids, ``dtypes``) are fed as
    such, others as float32. Sparse vectors stay sparse here: `_predict_in_chunks`
    densifies a chunk at a time."""
    from distkeras.data.feed import column_rows

    return [column_rows(column, shape, name, dtype or np.float32)
            for column, name, shape, dtype in zip(columns, names, input_shapes, dtypes)]


def _predict_arrays(model, arrays, batch_size, output_fields=None):
    """Predictions for one batch of `_input_arrays`: a ``list<float>`` array, or for
    several outputs a struct of them named ``output_fields``."""
    import pyarrow as pa

    from distkeras.data.datasets import float_lists

    outputs = [float_lists(matrix) for matrix in _predict_in_chunks(model, arrays, batch_size)]
    if output_fields is None:
        return outputs[0]
    return pa.StructArray.from_arrays(outputs, names=list(output_fields))


def _failure_path(key):
    """Where the executor keeps the error of this task's partition, for its retries: a
    file in the application's own folder there (`SparkFiles`, deleted with the
    application), named by the model and the task's stage and partition. None outside a
    Spark task."""
    from pyspark import SparkFiles, TaskContext

    context = TaskContext.get()
    if context is None:
        return None
    return os.path.join(SparkFiles.getRootDirectory(), f"distkeras-predict-{key[:16]}-"
                        f"{context.stageId()}-{context.partitionId()}.error")


def _remember_failure(key, error):
    """Keeps ``error`` (an `UnretryableError`) for the retries of this task on this
    executor (`_raise_remembered_failure`)."""
    path = _failure_path(key)
    if path is None:
        return
    try:
        with open(path, "w", encoding="utf-8") as file:
            file.write(f"{type(error).__name__}\n{error}")
    except OSError as problem:  # the retries then predict up to the same rows again
        logger.debug("Could not keep the prediction error in %s: %s", path, problem)


def _raise_remembered_failure(key):
    """On a retry of a task (Spark runs a failed task up to ``spark.task.maxFailures``
    times, 4 by default), raises at once the error an earlier attempt on this executor
    met: the same rows would fail again, after predicting every batch before them (and,
    in a new Python worker, rebuilding and compiling the model) once more."""
    from pyspark import TaskContext

    context = TaskContext.get()
    if context is None or context.attemptNumber() == 0:  # the first attempt: no file read
        return
    try:
        with open(_failure_path(key), encoding="utf-8") as file:
            kind, _, message = file.read().partition("\n")
    except OSError:  # none kept: an attempt on another executor, or another failure
        return
    error = getattr(errors, kind, None)
    if not (isinstance(error, type) and issubclass(error, errors.UnretryableError)):
        error = errors.UnretryableError
    raise error(f"{message} (This retry, attempt {context.attemptNumber() + 1} of the task, "
                "stopped without predicting: an earlier attempt on this executor met these "
                "rows.)")


def _predictions(batches, key, model_bytes, backend, names, input_shapes, batch_size,
                 objects=None, output_fields=None, dtypes=None):
    """Yields, on an executor, the predictions of each batch of feature columns (a tuple
    of Arrow arrays, one per input): a ``list<float>`` array, or for several outputs a
    struct of them named ``output_fields``.

    Rows that no retry can predict (`errors.UnretryableError`: nulls, arrays of the wrong
    size) are remembered for the task's retries (`_remember_failure`).
    """
    import pyarrow as pa

    from distkeras.executor.backend import ensure_backend

    _raise_remembered_failure(key)
    model = None
    try:
        for columns in batches:
            if not len(columns[0]):
                empty = pa.array([], pa.list_(pa.float32()))
                yield empty if output_fields is None else pa.StructArray.from_arrays(
                    [empty] * len(output_fields), names=list(output_fields))
                continue
            arrays = _input_arrays(columns, names, input_shapes,
                                   dtypes or [None] * len(names))
            if model is None:  # not for an empty partition, nor for bad first rows
                ensure_backend(backend)
                model = _cached_model(key, model_bytes, objects)
            yield _predict_arrays(model, arrays, batch_size, output_fields)
            _settle()
    except errors.UnretryableError as error:
        _remember_failure(key, error)
        raise


def _prediction_udf(model_bytes, backend, names, input_shapes, batch_size, objects=None,
                    output_fields=None, dtypes=None):
    """The Arrow UDF (iterator form) that predicts on the executors: one ``array<float>``
    per row, or for several outputs a struct of them named ``output_fields``.

    Rows that no retry can predict (`errors.UnretryableError`: nulls, arrays of the wrong
    size) still fail the task, and so the user's Spark action with that error, but a retry
    of the task on the same executor fails at once (`_raise_remembered_failure`).
    """
    import typing

    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    key = _model_key(model_bytes)
    single = len(names) == 1
    prediction_type = T.ArrayType(T.FloatType())
    return_type = prediction_type if output_fields is None else T.StructType(
        [T.StructField(field, prediction_type) for field in output_fields])

    def predict(batches):
        # Imported here, not captured: cloudpickle would copy the module's _CACHE.
        from distkeras import predictors

        yield from predictors._predictions(
            ((columns,) if single else tuple(columns) for columns in batches), key,
            model_bytes, backend, names, input_shapes, batch_size, objects, output_fields,
            dtypes)

    # Spark picks the UDF's form from these type hints.
    argument = pa.Array if single else typing.Tuple[pa.Array, ...]
    predict.__annotations__ = {"batches": typing.Iterator[argument],
                               "return": typing.Iterator[pa.Array]}
    return F.arrow_udf(predict, return_type)


def _direct_source(dataframe):
    """A `parquet_source.ParquetSource` of ``dataframe`` over its scan's own partitions,
    in Arrow batches of ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows; None where
    it is not a plain Parquet scan (or a stream)."""
    from distkeras.data import parquet_source

    if dataframe.isStreaming:
        return None
    batch_rows = int(dataframe.sparkSession.conf.get(
        "spark.sql.execution.arrow.maxRecordsPerBatch", None) or 10000)
    return parquet_source.direct_source(dataframe, batch_rows=batch_rows)


def _first_row(source, names):
    """The first row of `_direct_source` ``source`` (the first of its first partition
    that has rows), columns ``names`` only, read here with pyarrow: no Spark job. None
    where there are no rows."""
    import dataclasses

    import pyarrow as pa

    from distkeras.data import parquet_source

    pieces = [pieces[0] for pieces in source.partitions if pieces]
    if not pieces:
        return None
    columns = {name: source.columns[name] for name in names}
    schema = pa.schema([source.schema.field(name) for name in names])
    first = dataclasses.replace(pieces[0], rows=1)
    batch = next(parquet_source.read_pieces([first], columns, schema, batch_rows=1))
    return batch.to_pylist()[0]


def _read_in_workers(source, dataframe, outputs, settings):
    """``dataframe`` with the prediction columns ``outputs`` added, its Parquet files read
    in the Python workers (``source``, `_direct_source`).

    Each task reads the row groups of one of the scan's partitions, in Spark's order, and
    yields them with their predictions: the result has the scan's partitions and, within
    each, its rows in the same order as the Arrow UDF's.

    Args:
        source: `_direct_source` of ``dataframe``.
        dataframe: The DataFrame to predict on.
        outputs: The prediction columns' names.
        settings: `_prediction_udf`'s arguments.
    """
    from pyspark.sql import types as T

    from distkeras.data import parquet_source

    model_bytes, backend, names, input_shapes, batch_size, objects, fields, dtypes = settings
    key = _model_key(model_bytes)

    def predict(record_batches):
        import pyarrow as pa

        # Imported here, not captured: cloudpickle would copy the module's _CACHE.
        from distkeras import predictors

        held = []  # the batches whose predictions are being made, in order

        def columns():
            for batch in record_batches:
                held.append(batch)
                yield tuple(batch.column(name) for name in names)

        for predicted in predictors._predictions(columns(), key, model_bytes, backend,
                                                 names, input_shapes, batch_size, objects,
                                                 fields, dtypes):
            batch = held.pop(0)
            added = [predicted] if fields is None else \
                [predicted.field(index) for index in range(len(fields))]
            yield pa.RecordBatch.from_arrays(batch.columns + added,
                                             names=batch.schema.names + list(outputs))

    schema = T.StructType(dataframe.schema.fields + [
        T.StructField(name, T.ArrayType(T.FloatType())) for name in outputs])
    logger.info("Predicting on %d partitions of Parquet files read in the workers "
                "(pyarrow); %s=false turns this off.", source.num_partitions(),
                parquet_source.SETTING)
    return source.mapInArrow(predict, schema)


COLUMNAR_UDF_INPUT = "spark.sql.execution.arrow.pythonUDF.columnarInput.enabled"


def _avoid_columnar_udf_input(dataframe):
    """Turns off Spark's columnar input to Arrow UDFs when ``dataframe`` holds a
    user-defined type (a Spark ML vector), in any column.

    With it on, Spark 4.3 hands the UDF's whole input batch, every column, to Arrow
    straight from a columnar scan (Parquet's vectorized reader), and Arrow has no type for
    a UDT: predicting on Parquet that holds `VectorAssembler`'s output fails with
    UNSUPPORTED_DATATYPE. The setting is read when the job runs, not when `predict`
    returns, so it is changed for the session (it only skips a conversion).
    """
    from pyspark.sql import types as T

    def has_udt(data_type):
        if isinstance(data_type, T.UserDefinedType):
            return True
        if isinstance(data_type, T.StructType):
            return any(has_udt(field.dataType) for field in data_type.fields)
        if isinstance(data_type, T.ArrayType):
            return has_udt(data_type.elementType)
        if isinstance(data_type, T.MapType):
            return has_udt(data_type.keyType) or has_udt(data_type.valueType)
        return False

    conf = dataframe.sparkSession.conf
    if not has_udt(dataframe.schema) or conf.get(COLUMNAR_UDF_INPUT, "true") != "true":
        return
    conf.set(COLUMNAR_UDF_INPUT, "false")
    logger.info("Set %s=false for this session: Spark's columnar input to Arrow UDFs "
                "fails on Spark ML vector columns.", COLUMNAR_UDF_INPUT)


class ModelPredictor:
    """Adds a Keras model's predictions to a DataFrame, on the executors.

    Features may be numbers, arrays (flat or nested) of numbers, Spark ML vectors or packed
    float32 tensors (`PackedTensorTransformer`, the fastest to read); each row's values are
    reshaped to the model's input shape. The prediction of each row is
    flattened into an ``array<float>`` (a model with output shape ``(10,)`` gives 10 values).
    Every column of the input is kept. A model with several outputs adds one such column
    per output, from one model call per batch: ``output_col`` names them as a list, or as a
    prefix (``prediction`` gives ``prediction_<output name>``).

    Only the feature columns are sent to Python (in Arrow record batches of
    ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows) and only the prediction comes
    back. Each Python worker keeps the model it rebuilt for its next tasks, and for later
    ``predict`` calls with the same architecture and weights.

    Args:
        keras_model: The `keras.Model` (one input per ``features_col``).
        features_col: The input column, or a list of columns for a multi-input model (or a
            dict keyed by the inputs' names).
        output_col: Name of the prediction column to add; for a multi-output model, a list
            of names (one per output, in order) or a prefix.
        batch_size: Rows per model call.
        output_type: ``"array"`` (``array<float>``) or ``"vector"`` (Spark ML
            ``DenseVector``s, as dist-keras's predictor wrote: ``row[col].toArray()``
            works).

    Notes:
        On a plain Parquet scan of local files (`distkeras.data.parquet_source`), the tasks
        read the files with pyarrow, over the scan's own partitions and in its row order,
        and the result is their ``mapInArrow``; the Spark setting
        ``distkeras.parquetDirect=false`` turns that off.
    """

    def __init__(self, keras_model, features_col="features", output_col="prediction",
                 batch_size=1024, output_type="array"):
        self.model = keras_model
        self.features_col = features_col
        self.output_col = output_col
        self.batch_size = batch_size
        self.output_type = output_type

    def _validate(self, dataframe):
        import keras

        if not isinstance(self.model, keras.Model):
            raise TypeError("`keras_model` must be a keras.Model. "
                            f"Received: keras_model={type(self.model).__name__}")
        check_batch_size(self.batch_size)
        if self.output_type not in OUTPUT_TYPES:
            raise ValueError(f"`output_type` must be one of {OUTPUT_TYPES}. Received: "
                             f"output_type={self.output_type!r}")
        check_spark_dataframe(dataframe, "DataFrame to predict on")
        check_known_inputs(self.model)
        self.features_col = columns_by_name(self.features_col, self.model, "inputs",
                                            "features_col")
        features = (list(self.features_col) if isinstance(self.features_col, (list, tuple))
                    else [self.features_col])
        check_input_count(self.model, features)
        check_column_order(features, [tensor.name for tensor in self.model.inputs], "inputs",
                           "features_col")
        outputs = self._output_columns()
        for name in outputs:
            check_output_column_free(dataframe, name)
        kinds = [column_kind(dataframe, name, "features column", nested=True, packed=True)
                 for name in features]
        # What would fail every task is refused here, from the first row (None: no rows).
        # A stream has none to read before it runs (Spark refuses `first()` on it): its
        # tasks check every row, as they check a DataFrame's rows after the first.
        # A plain Parquet scan's first row is read from its files, without a Spark job.
        source = _direct_source(dataframe)
        if source is not None:
            row = _first_row(source, features)
        elif dataframe.isStreaming:
            row = None
        else:
            row = dataframe.select(*map(column, features)).first()
        if row is not None:
            check_first_row(row, self.model, features)
        return features, kinds, outputs, row, source

    def _output_columns(self):
        """The prediction columns, one per model output."""
        count = len(self.model.outputs)
        names = self.output_col
        if isinstance(names, (list, tuple)):
            names = list(names)
            if len(names) != count or len(set(names)) != count:
                raise ValueError(f"The model has {count} outputs: `output_col` must name "
                                 f"{count} different columns. Received: {names!r}")
        elif count == 1:
            names = [names]
        else:
            # Named as `predict` keys them (a dict model's keys, not its layers' names).
            names = [f"{names}_{output}" for output in output_names(self.model)]
        if not all(isinstance(name, str) and name for name in names):
            raise ValueError("`output_col` must be a column name (or, for a multi-output "
                             f"model, a list of names). Received: {self.output_col!r}")
        return names

    def predict(self, dataframe):
        """Returns ``dataframe`` with the prediction column (``array<float>``) added.

        Args:
            dataframe: A Spark DataFrame holding the feature column(s); a streaming one
                too, whose rows are all checked by its tasks (none is read here).

        Returns:
            A new DataFrame (lazy, like any Spark transformation).

        Raises:
            ValueError: For a missing column, an existing output column, or a first row
                that is null or of the wrong size for the model (read here, one row). A
                later such row fails the Spark action on the result with that error
                (`distkeras.errors.InvalidDataError`); Spark's retries of its task on the
                same executor raise it again at once, without predicting.
            TypeError: For a feature column that is not numeric.
            distkeras.errors.DataSourceError: A file of a plain Parquet scan is gone
                (deleted or moved after the DataFrame was created).
        """
        import keras
        from pyspark.sql import functions as F

        from distkeras import custom_objects
        from distkeras.utils import serialize_model

        features, kinds, outputs, first_row, source = self._validate(dataframe)
        check_executor_python(dataframe.sparkSession.sparkContext)
        _avoid_columnar_udf_input(dataframe)
        sparse = sparse_vector_columns(dataframe, features, first_row)
        columns = [vector_values(name) if kind == "vector" and name not in sparse
                   else column(name) for name, kind in zip(features, kinds)]
        input_shapes = [tuple(int(dim) for dim in tensor.shape[1:])
                        for tensor in self.model.inputs]
        model_bytes = serialize_model(self.model)
        objects, unresolved = custom_objects.find(self.model)
        if objects or unresolved or custom_objects.holds_python_code(self.model):
            custom_objects.check_rebuildable(model_bytes, None, objects, unresolved)
        # Several outputs: one struct column from one UDF call, then a column per field.
        fields = None if len(outputs) == 1 else [f"output_{index}"
                                                 for index in range(len(outputs))]
        settings = (model_bytes, keras.backend.backend(), features, input_shapes,
                    int(self.batch_size), objects, fields,
                    [integer_dtype(tensor) for tensor in self.model.inputs])
        if source is not None:
            direct = _read_in_workers(source, dataframe, outputs, settings)
            if self.output_type == "array":
                return direct
            return direct.withColumns({name: as_output_type(F.col(name), self.output_type)
                                       for name in outputs})
        udf = _prediction_udf(*settings)
        logger.debug("Predicting %s from %s with batch_size=%d", outputs, features,
                     self.batch_size)
        if fields is None:
            return dataframe.withColumn(outputs[0],
                                        as_output_type(udf(*columns), self.output_type))
        struct = "__distkeras_predictions"
        predicted = dataframe.withColumn(struct, udf(*columns))
        return predicted.withColumns(
            {name: as_output_type(F.col(struct)[field], self.output_type)
             for name, field in zip(outputs, fields)}).drop(struct)
