"""The Spark ML stages: what runs in a Pipeline on the driver and, as Spark's own column
expressions or a prediction UDF, on the executors.

- The preprocessing stages: `label_encoders` (one-hot, label indices), `scalers`
  (rescaling, standardizing) and `reshapers` (dense vectors, shapes, packed tensors), on
  the base class of `column_stage`.
- `estimators`: `KerasEstimator` and the `KerasModel` it fits.
- The evaluators: `accuracy_evaluator` and `loss_evaluator` (the losses read in
  `loss_specs`), which share the scoring of `scoring`.
- `predictors`: `ModelPredictor`; its tasks on the executors in `prediction_tasks`, its
  Arrow UDF in `prediction_udf`, its direct Parquet path in `parquet_predictions`.
- `params` and `columns`: the Param helpers and column expressions they share.

`distkeras.transformers`, `distkeras.evaluators` and `distkeras.predictors` are their
dist-keras import paths.
"""
