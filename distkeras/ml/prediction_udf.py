"""The Spark path of `ModelPredictor`: an Arrow UDF (iterator form) that predicts the
feature columns on the executors, only those columns travelling to Python and only the
predictions back."""

import logging

from distkeras.ml.prediction_tasks import model_key

logger = logging.getLogger(__name__)

COLUMNAR_UDF_INPUT = "spark.sql.execution.arrow.pythonUDF.columnarInput.enabled"


def prediction_udf(model_bytes, backend, names, input_shapes, batch_size, objects=None,
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

    key = model_key(model_bytes)
    single = len(names) == 1
    prediction_type = T.ArrayType(T.FloatType())
    return_type = prediction_type if output_fields is None else T.StructType(
        [T.StructField(field, prediction_type) for field in output_fields])

    def predict(batches):
        # Imported here, not captured: cloudpickle would copy its model cache (_CACHE).
        from distkeras.ml import prediction_tasks

        yield from prediction_tasks.predict_batches(
            ((columns,) if single else tuple(columns) for columns in batches), key,
            model_bytes, backend, names, input_shapes, batch_size, objects, output_fields,
            dtypes)

    # Spark picks the UDF's form from these type hints.
    argument = pa.Array if single else typing.Tuple[pa.Array, ...]
    predict.__annotations__ = {"batches": typing.Iterator[argument],
                               "return": typing.Iterator[pa.Array]}
    return F.arrow_udf(predict, return_type)


COLUMNAR_UDF_INPUT = "spark.sql.execution.arrow.pythonUDF.columnarInput.enabled"


def avoid_columnar_udf_input(dataframe):
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
