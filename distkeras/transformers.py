"""The DataFrame transformers under their dist-keras import path.

A thin face: the label stages live in `distkeras.ml.label_encoders`, the rescalers in
`distkeras.ml.scalers`, the layout stages in `distkeras.ml.reshapers` (see there).
"""

from distkeras.ml.label_encoders import (BinaryLabelTransformer, LabelIndexTransformer,
                                         OneHotTransformer)
from distkeras.ml.reshapers import (DenseTransformer, PackedTensorTransformer,
                                    ReshapeTransformer)
from distkeras.ml.scalers import MinMaxTransformer, StandardEstimator, StandardTransformer

__all__ = ["BinaryLabelTransformer", "DenseTransformer", "LabelIndexTransformer",
           "MinMaxTransformer", "OneHotTransformer", "PackedTensorTransformer",
           "ReshapeTransformer", "StandardEstimator", "StandardTransformer"]
