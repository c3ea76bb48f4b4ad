"""Distributed inference: add a Keras model's predictions to a Spark DataFrame.

The model travels to the executors as the bytes of a ``.keras`` archive (no pickle), is
rebuilt once per Spark task with ``safe_mode=True``, and predicts whole Arrow record
batches at a time (``mapInArrow``), ``batch_size`` rows per call.

Example::

    predictor = ModelPredictor(keras_model=model, features_col="features")
    predicted = predictor.predict(dataframe)      # + "prediction": array<float>
"""

import logging

import numpy as np

from distkeras.transformers import _kind

logger = logging.getLogger(__name__)

_TEMPORARY = "__distkeras_input_{}"


def _check_batch_size(batch_size):
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or \
            batch_size < 1:
        raise ValueError(
            f"`batch_size` must be an integer >= 1. Received: batch_size={batch_size!r}")


def _column_to_numpy(column, sample_shape, name):
    """An Arrow feature column as float32 of shape ``(rows, *sample_shape)``."""
    from distkeras.feed import column_to_numpy

    return column_to_numpy(column, sample_shape, name).astype(np.float32, copy=False)


def _predict_in_chunks(model, inputs, batch_size):
    """Predicts ``batch_size`` rows per call; the last chunk is padded to ``batch_size`` rows,
    so a compiling backend (JAX) compiles one input shape only."""
    rows = len(inputs[0])
    outputs = []
    for start in range(0, rows, batch_size):
        chunk = [array[start:start + batch_size] for array in inputs]
        count = len(chunk[0])
        if count < batch_size:
            chunk = [np.concatenate([array, np.zeros((batch_size - count, *array.shape[1:]),
                                                     array.dtype)]) for array in chunk]
        prediction = model.predict_on_batch(chunk[0] if len(chunk) == 1 else chunk)
        outputs.append(np.asarray(prediction)[:count])
    return np.concatenate(outputs).reshape(rows, -1).astype(np.float32, copy=False)


def _prediction_job(model_bytes, backend, inputs, input_shapes, kept_columns, output_col,
                    batch_size):
    """The function each Spark task runs: rebuild the model once, predict every batch."""

    def predict_partition(record_batches):
        import pyarrow as pa

        from distkeras.workers import _ensure_backend

        _ensure_backend(backend)
        model = None
        for batch in record_batches:
            if batch.num_rows == 0:
                continue
            if model is None:  # once per task, and only for a partition with rows
                from distkeras.utils import deserialize_model

                model = deserialize_model(model_bytes)
            arrays = [_column_to_numpy(batch.column(column), shape, shown)
                      for (column, shown), shape in zip(inputs, input_shapes)]
            flat = _predict_in_chunks(model, arrays, batch_size)
            width = flat.shape[1]
            offsets = pa.array(np.arange(0, flat.size + 1, width, dtype=np.int32))
            prediction = pa.ListArray.from_arrays(offsets, pa.array(flat.reshape(-1)))
            yield pa.RecordBatch.from_arrays(
                [batch.column(name) for name in kept_columns] + [prediction],
                names=list(kept_columns) + [output_col])

    return predict_partition


class ModelPredictor:
    """Adds a Keras model's predictions to a DataFrame, on the executors.

    Features may be numbers, arrays (flat or nested) of numbers or Spark ML vectors; each
    row's values are reshaped to the model's input shape. The prediction of each row is
    flattened into an ``array<float>`` (a model with output shape ``(10,)`` gives 10 values).
    Every column of the input is kept.

    Args:
        keras_model: The `keras.Model` (one output; one input per ``features_col``).
        features_col: The input column, or a list of columns for a multi-input model.
        output_col: Name of the prediction column to add.
        batch_size: Rows per model call.
    """

    def __init__(self, keras_model, features_col="features", output_col="prediction",
                 batch_size=1024):
        self.model = keras_model
        self.features_col = features_col
        self.output_col = output_col
        self.batch_size = batch_size

    def _validate(self, dataframe):
        import keras

        if not isinstance(self.model, keras.Model):
            raise TypeError("`keras_model` must be a keras.Model. "
                            f"Received: keras_model={type(self.model).__name__}")
        _check_batch_size(self.batch_size)
        features = (list(self.features_col) if isinstance(self.features_col, (list, tuple))
                    else [self.features_col])
        if len(features) != len(self.model.inputs):
            raise ValueError(
                f"The model has {len(self.model.inputs)} inputs but features_col names "
                f"{len(features)} columns: {features}.")
        if len(self.model.outputs) != 1:
            raise ValueError(
                f"ModelPredictor predicts with single-output models; this one has "
                f"{len(self.model.outputs)} outputs.")
        if not isinstance(self.output_col, str) or not self.output_col:
            raise ValueError(f"`output_col` must be a column name. Received: {self.output_col!r}")
        if self.output_col in dataframe.columns:
            raise ValueError(
                f"Column {self.output_col!r} is already in the DataFrame; pick another "
                "output_col or drop that column first.")
        kinds = [_kind(dataframe, name, "features column", nested=True) for name in features]
        return features, kinds

    def predict(self, dataframe):
        """Returns ``dataframe`` with the prediction column (``array<float>``) added.

        Args:
            dataframe: A Spark DataFrame holding the feature column(s).

        Returns:
            A new DataFrame (lazy, like any Spark transformation).

        Raises:
            ValueError: For a missing column, an existing ``output_col`` or a model with
                several outputs (and, on the executors, rows of the wrong size).
            TypeError: For a feature column that is not numeric.
        """
        import keras
        from pyspark.ml.functions import vector_to_array
        from pyspark.sql import functions as F
        from pyspark.sql import types as T

        from distkeras.utils import serialize_model

        features, kinds = self._validate(dataframe)
        frame = dataframe
        inputs = []
        for position, (name, kind) in enumerate(zip(features, kinds)):
            if kind == "vector":
                column = _TEMPORARY.format(position)
                frame = frame.withColumn(column, vector_to_array(F.col(name), "float32"))
                inputs.append((column, name))
            else:
                inputs.append((name, name))
        input_shapes = [tuple(int(dim) for dim in tensor.shape[1:])
                        for tensor in self.model.inputs]
        schema = T.StructType(
            list(dataframe.schema.fields)
            + [T.StructField(self.output_col, T.ArrayType(T.FloatType()), True)])
        job = _prediction_job(serialize_model(self.model), keras.backend.backend(), inputs,
                              input_shapes, dataframe.columns, self.output_col,
                              int(self.batch_size))
        logger.debug("Predicting %r from %s with batch_size=%d", self.output_col, features,
                     self.batch_size)
        return frame.mapInArrow(job, schema)
