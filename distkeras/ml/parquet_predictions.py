"""The direct Parquet path of `ModelPredictor`: a plain Parquet scan's files read by the
Python workers with pyarrow (`distkeras.data.parquet_source`), which send back every
column with the predictions; Spark's row-to-Arrow conversion was most of the cost
(docs/parquet-feed.md)."""

import logging

from distkeras.data import parquet_source
from distkeras.ml.prediction_tasks import model_key

logger = logging.getLogger(__name__)


def direct_source(dataframe):
    """A `parquet_source.ParquetSource` of ``dataframe`` over its scan's own partitions,
    in Arrow batches of ``spark.sql.execution.arrow.maxRecordsPerBatch`` rows; None where
    it is not a plain Parquet scan (or a stream)."""
    if dataframe.isStreaming:
        return None
    batch_rows = int(dataframe.sparkSession.conf.get(
        "spark.sql.execution.arrow.maxRecordsPerBatch", None) or 10000)
    return parquet_source.direct_source(dataframe, batch_rows=batch_rows)


def first_parquet_row(source, names):
    """The first row of `direct_source` ``source`` (the first of its first partition
    that has rows), columns ``names`` only, read here with pyarrow: no Spark job. None
    where there are no rows."""
    import dataclasses

    import pyarrow as pa

    pieces = [pieces[0] for pieces in source.partitions if pieces]
    if not pieces:
        return None
    columns = {name: source.columns[name] for name in names}
    schema = pa.schema([source.schema.field(name) for name in names])
    first = dataclasses.replace(pieces[0], rows=1)
    batch = next(parquet_source.read_pieces([first], columns, schema, batch_rows=1))
    return batch.to_pylist()[0]


def read_in_workers(source, dataframe, outputs, settings):
    """``dataframe`` with the prediction columns ``outputs`` added, its Parquet files read
    in the Python workers (``source``, `direct_source`).

    Each task reads the row groups of one of the scan's partitions, in Spark's order, and
    yields them with their predictions: the result has the scan's partitions and, within
    each, its rows in the same order as the Arrow UDF's.

    Args:
        source: `direct_source` of ``dataframe``.
        dataframe: The DataFrame to predict on.
        outputs: The prediction columns' names.
        settings: `prediction_udf`'s arguments.
    """
    from pyspark.sql import types as T

    model_bytes, backend, names, input_shapes, batch_size, objects, fields, dtypes = settings
    key = model_key(model_bytes)

    def predict(record_batches):
        import pyarrow as pa

        # Imported here, not captured: cloudpickle would copy its model cache (_CACHE).
        from distkeras.ml import prediction_tasks

        held = []  # the batches whose predictions are being made, in order

        def columns():
            for batch in record_batches:
                held.append(batch)
                yield tuple(batch.column(name) for name in names)

        for predicted in prediction_tasks.predict_batches(
                columns(), key, model_bytes, backend, names, input_shapes, batch_size,
                objects, fields, dtypes):
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
