"""The data side: what turns DataFrames and files into a worker's minibatches.

- `frame_columns` (column expressions), `frame_checks` (a training DataFrame checked
  against the model) and `frame_layout` (its layout for the workers; driver).
- `feed`: minibatches built from the Arrow record batches of a partition (executor).
- `tensors` and `vectors`: packed float32 columns and Spark ML vector columns, as Arrow
  brings them (executor; packing on the driver too).
- `sample_weights`: per-row and per-class weights (checked on the driver, computed on the
  executor).
- `parquet_source`: a plain Parquet scan's files read in the workers with pyarrow.
- `datasets`: Fashion-MNIST as DataFrames, and datasets written to Parquet through Spark.
- `storage`: bytes to and from any path the cluster's filesystem understands (models,
  histories, checkpoints; driver).

`distkeras.datasets` is its dist-keras import path.
"""
