"""A worker's per-step training records, under its old import path.

A thin face: the names live in `distkeras.executor.step_history` and
`distkeras.transport.history_messages` (see there).
"""

from distkeras.executor.step_history import (HistoryLog, to_float,
                                             HISTORY_VALUES_PER_FRAME, send_history_columns,
                                             ProgressReporter)
from distkeras.transport.history_messages import pack_history, unpack_history, history_records

__all__ = ["HistoryLog", "to_float", "pack_history", "unpack_history", "history_records",
           "HISTORY_VALUES_PER_FRAME", "send_history_columns", "ProgressReporter"]
