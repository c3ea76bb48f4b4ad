"""BatchNormalization statistics measured again, under its old import path.

A thin face: the names live in `distkeras.training.batch_statistics` (see there).
"""

from distkeras.training.batch_statistics import (SAMPLE_ROWS, batch_normalizations, recompute,
                                                 sample_inputs, measure_again)

__all__ = ["SAMPLE_ROWS", "batch_normalizations", "recompute", "sample_inputs",
           "measure_again"]
