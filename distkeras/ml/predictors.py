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

What its tasks run on the executors lives in `distkeras.ml.prediction_tasks`, the Arrow
UDF in `distkeras.ml.prediction_udf` and the direct Parquet path in
`distkeras.ml.parquet_predictions`.

Example::

    predictor = ModelPredictor(keras_model=model, features_col="features")
    predicted = predictor.predict(dataframe)      # + "prediction": array<float>
"""

import logging

import numpy as np

from distkeras.data.feed import integer_dtype, output_names
from distkeras.data.frame_checks import (check_column_order, check_first_row,
                                         check_input_count, check_known_inputs,
                                         check_spark_dataframe, columns_by_name)
from distkeras.data.frame_columns import check_output_column_free, column, vector_values
from distkeras.data.frame_layout import sparse_vector_columns
from distkeras.keras_io import custom_objects
from distkeras.keras_io.archives import serialize_model
from distkeras.ml.columns import as_output_type, column_kind
from distkeras.ml.params import OUTPUT_TYPES
from distkeras.ml.parquet_predictions import (direct_source, first_parquet_row,
                                              read_in_workers)
from distkeras.ml.prediction_udf import avoid_columnar_udf_input, prediction_udf
from distkeras.training.spark_jobs import check_executor_python

logger = logging.getLogger(__name__)


def check_batch_size(batch_size):
    """Refuses a ``batch_size`` that is not an integer >= 1 (a ValueError)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or \
            batch_size < 1:
        raise ValueError(
            f"`batch_size` must be an integer >= 1. Received: batch_size={batch_size!r}")


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
        source = direct_source(dataframe)
        if source is not None:
            row = first_parquet_row(source, features)
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

        features, kinds, outputs, first_row, source = self._validate(dataframe)
        check_executor_python(dataframe.sparkSession)
        avoid_columnar_udf_input(dataframe)
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
            direct = read_in_workers(source, dataframe, outputs, settings)
            if self.output_type == "array":
                return direct
            return direct.withColumns({name: as_output_type(F.col(name), self.output_type)
                                       for name in outputs})
        udf = prediction_udf(*settings)
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
