"""The driver's progress bar and stall watch, under its old import path.

A thin face: the names live in `distkeras.training.monitor` (see there).
"""

from distkeras.training.monitor import (VERBOSE_CHOICES, resolve_verbose, BarProgress,
                                        LineProgress, report_returned_validation,
                                        TrainingMonitor)

__all__ = ["VERBOSE_CHOICES", "resolve_verbose", "BarProgress", "LineProgress",
           "report_returned_validation", "TrainingMonitor"]
