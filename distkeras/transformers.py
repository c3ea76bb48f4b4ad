"""The DataFrame transformers under their dist-keras import path.

A thin face: the stages live in `distkeras.ml.transformers` (see there).
"""

from distkeras.ml.transformers import (BinaryLabelTransformer, DenseTransformer,
                                       LabelIndexTransformer, MinMaxTransformer,
                                       OneHotTransformer, PackedTensorTransformer,
                                       ReshapeTransformer, StandardEstimator,
                                       StandardTransformer)

__all__ = ["BinaryLabelTransformer", "DenseTransformer", "LabelIndexTransformer",
           "MinMaxTransformer", "OneHotTransformer", "PackedTensorTransformer",
           "ReshapeTransformer", "StandardEstimator", "StandardTransformer"]
