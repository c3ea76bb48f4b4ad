"""The Spark ML stages: what runs in a Pipeline on the driver and, as Spark's own column
expressions or a prediction UDF, on the executors.

- `transformers`: preprocessing stages (one-hot, rescaling, reshaping, label indices).
- `estimators`: `KerasEstimator` and the `KerasModel` it fits.
- `evaluators`: accuracy and loss of a prediction column.
- `params` and `columns`: the Param helpers and column expressions they share.

`distkeras.transformers`, `distkeras.estimators` and `distkeras.evaluators` are their
dist-keras import paths.
"""
