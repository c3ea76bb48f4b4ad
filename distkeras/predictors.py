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

A thin face: `ModelPredictor` lives in `distkeras.ml.predictors`; what its tasks run on
the executors in `distkeras.ml.prediction_tasks`, the Arrow UDF in
`distkeras.ml.prediction_udf` and the direct Parquet path in
`distkeras.ml.parquet_predictions`.

Example::

    predictor = ModelPredictor(keras_model=model, features_col="features")
    predicted = predictor.predict(dataframe)      # + "prediction": array<float>
"""

from distkeras.ml.prediction_udf import COLUMNAR_UDF_INPUT
from distkeras.ml.predictors import OUTPUT_TYPES, ModelPredictor, check_batch_size

__all__ = ["ModelPredictor", "check_batch_size", "OUTPUT_TYPES", "COLUMNAR_UDF_INPUT"]
