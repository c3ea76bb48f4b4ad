"""Distributed inference, under dist-keras's import path: add a Keras model's predictions
to a Spark DataFrame (how it works: `distkeras.ml.predictors`).

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
