"""The exact epoch values of the training metrics, under its old import path.

A thin face: the names live in `distkeras.executor.metric_sums`,
`distkeras.training.epoch_metrics` and `distkeras.transport.history_messages` (the
worker's sums, the driver's results, the messages; see there).
"""

from distkeras.executor.metric_sums import (MAX_STATE_VALUES, additive, metric_slots,
                                            EpochMetricSums)
from distkeras.training.epoch_metrics import of_epoch, exact_logs
from distkeras.transport.history_messages import INDEX_FIELD, VALUES_FIELD
from distkeras.transport.history_messages import unpack_metric_states as unpack

__all__ = ["INDEX_FIELD", "VALUES_FIELD", "MAX_STATE_VALUES", "additive", "metric_slots",
           "EpochMetricSums", "unpack", "of_epoch", "exact_logs"]
