"""DataFrame transformers: preprocessing steps that fit in a `pyspark.ml.Pipeline`.

Every class here is a `pyspark.ml.Transformer` (or, for `StandardEstimator`, an
`Estimator`) with Spark ML Params, so it can stand in a Pipeline and be saved and loaded
with it (``Pipeline.save(path)`` / ``PipelineModel.load(path)``). Each one is built from
Spark's own column functions (``transform``, ``aggregate``, ``array_max``, ...): no Python
runs per row, and the work stays in the JVM.

Arrays come out as ``array<float>`` (what the trainers read without a conversion); Spark
ML vectors are accepted wherever an array of numbers is. The element-wise rescalers
(`MinMaxTransformer`, `StandardTransformer`) give a column of the input's kind: dense
vectors for vectors, as Spark's own scalers and dist-keras did, arrays for arrays.
`DenseTransformer` outputs vectors; the others arrays (or numbers).

Example::

    from pyspark.ml import Pipeline
    pipeline = Pipeline(stages=[
        MinMaxTransformer(0.0, 255.0, 0.0, 1.0, input_col="pixels", output_col="features"),
        OneHotTransformer(10, input_col="digit", output_col="label"),
    ])
    prepared = pipeline.fit(dataframe).transform(dataframe)

A thin face: the label stages live in `distkeras.ml.label_encoders`, the rescalers in
`distkeras.ml.scalers`, the layout stages in `distkeras.ml.reshapers`, and their base in
`distkeras.ml.column_stage`.
"""

from distkeras.ml.columns import FLOAT_ARRAY
from distkeras.ml.label_encoders import (BinaryLabelTransformer, LabelIndexTransformer,
                                         OneHotTransformer)
from distkeras.ml.reshapers import (DenseTransformer, PackedTensorTransformer,
                                    ReshapeTransformer)
from distkeras.ml.scalers import MinMaxTransformer, StandardEstimator, StandardTransformer

__all__ = ["OneHotTransformer", "LabelIndexTransformer", "BinaryLabelTransformer",
           "MinMaxTransformer", "StandardTransformer", "StandardEstimator",
           "DenseTransformer", "ReshapeTransformer", "PackedTensorTransformer", "FLOAT_ARRAY"]
