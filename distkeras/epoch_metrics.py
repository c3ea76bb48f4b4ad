"""The exact epoch values of the training metrics, under its old import path.

A thin face: the names live in `distkeras.executor.metric_sums` and
`distkeras.training.epoch_metrics` (the worker's sums, and the driver's results; see
there).
"""

from distkeras.executor.metric_sums import (INDEX_FIELD, VALUES_FIELD, MAX_STATE_VALUES,
                                            additive, metric_slots, EpochMetricSums)
from distkeras.training.epoch_metrics import unpack, of_epoch, exact_logs

__all__ = ["INDEX_FIELD", "VALUES_FIELD", "MAX_STATE_VALUES", "additive", "metric_slots",
           "EpochMetricSums", "unpack", "of_epoch", "exact_logs"]
