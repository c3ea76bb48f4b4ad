"""Distributed inference, under dist-keras's import path: add a Keras model's predictions
to a Spark DataFrame.

A thin face: `ModelPredictor` lives in `distkeras.ml.predictors` (how it works: see
there).

Example::

    predictor = ModelPredictor(keras_model=model, features_col="features")
    predicted = predictor.predict(dataframe)      # + "prediction": array<float>
"""

from distkeras.ml.predictors import ModelPredictor

__all__ = ["ModelPredictor"]
