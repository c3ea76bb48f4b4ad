"""What a prediction task runs on an executor: the model rebuilt once per Python worker
process (and kept for its next tasks), the batches of feature columns predicted in
chunks of one shape, and the rows no retry can predict remembered for the task's retries.
"""

import gc
import hashlib
import io
import logging
import os
import zipfile

import numpy as np

from distkeras import errors
from distkeras.data.datasets import float_lists
from distkeras.data.feed import column_rows, input_names, model_inputs
from distkeras.executor.backend import ensure_backend
from distkeras.executor.devices import task_devices
from distkeras.keras_io import custom_objects
from distkeras.keras_io.archives import deserialize_model

logger = logging.getLogger(__name__)

# Per Python worker process: the last model rebuilt there ("key", "model", and "settled":
# whether `settle` has frozen it), and how many models this process has rebuilt
# ("builds", kept across models).
_CACHE = {}


def model_key(model_bytes):
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


def cached_model(key, model_bytes, objects=None):
    """The model of ``model_bytes``, rebuilt only when this process holds another one.

    Replacing the model unfreezes what `settle` froze first, so the old model's reference
    cycles are collected rather than kept for the life of the worker.

    Args:
        key: `model_key` of the archive.
        model_bytes: The `.keras` archive.
        objects: The custom objects the model names (`keras_io.custom_objects.find`).
    """
    if _CACHE.get("key") == key:
        return _CACHE["model"]

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


def settle():
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


def call_size(rows, batch_size):
    """The rows of each model call for a batch of ``rows``: ``batch_size``, or for a batch
    with fewer rows, the smallest power of two that holds them.

    Padding such a batch to ``batch_size`` ran the model on, and allocated, up to
    ``batch_size`` rows for a few (a million for 37 with ``batch_size=10**6``); powers of
    two keep the shapes a compiling backend sees to a few.
    """
    return min(batch_size, 1 << max(rows - 1, 0).bit_length())


def predict_in_chunks(model, inputs, batch_size):
    """Predicts ``batch_size`` rows per call; the last chunk is padded to ``batch_size`` rows,
    so a compiling backend (JAX) compiles one input shape only (a batch of fewer rows: to
    `call_size`'s).

    Returns:
        One ``(rows, values)`` float32 matrix per model output.
    """
    import keras

    rows = len(inputs[0])
    batch_size = call_size(rows, batch_size)
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


def input_arrays(columns, names, input_shapes, dtypes):
    """One Arrow batch of feature columns as the model's inputs, checked (nulls, sizes)
    before any model is loaded: inputs typed as integers (token ids, ``dtypes``) are fed as
    such, others as float32. Sparse vectors stay sparse here: `predict_in_chunks`
    densifies a chunk at a time."""
    return [column_rows(column, shape, name, dtype or np.float32)
            for column, name, shape, dtype in zip(columns, names, input_shapes, dtypes)]


def predict_arrays(model, arrays, batch_size, output_fields=None):
    """Predictions for one batch of `input_arrays`: a ``list<float>`` array, or for
    several outputs a struct of them named ``output_fields``."""
    import pyarrow as pa

    outputs = [float_lists(matrix) for matrix in predict_in_chunks(model, arrays, batch_size)]
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


def predict_batches(batches, key, model_bytes, backend, names, input_shapes, batch_size,
                    objects=None, output_fields=None, dtypes=None):
    """Yields, on an executor, the predictions of each batch of feature columns (a tuple
    of Arrow arrays, one per input): a ``list<float>`` array, or for several outputs a
    struct of them named ``output_fields``.

    Rows that no retry can predict (`errors.UnretryableError`: nulls, arrays of the wrong
    size) are remembered for the task's retries (`_remember_failure`).
    """
    import pyarrow as pa

    _raise_remembered_failure(key)
    with task_devices() as task:  # the task's GPUs, before Keras loads
        task.refuse_if_needs_child()  # the model stays in this process for later tasks
        model = None
        try:
            for columns in batches:
                if not len(columns[0]):
                    empty = pa.array([], pa.list_(pa.float32()))
                    yield empty if output_fields is None else pa.StructArray.from_arrays(
                        [empty] * len(output_fields), names=list(output_fields))
                    continue
                arrays = input_arrays(columns, names, input_shapes,
                                       dtypes or [None] * len(names))
                if model is None:  # not for an empty partition, nor for bad first rows
                    ensure_backend(backend)
                    model = cached_model(key, model_bytes, objects)
                yield predict_arrays(model, arrays, batch_size, output_fields)
                settle()
        except errors.UnretryableError as error:
            _remember_failure(key, error)
            raise
