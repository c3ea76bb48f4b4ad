"""Sweeps of trainers, workers and windows, under their old import path (also
``python -m distkeras.experiments``).

A thin face: the names live in `distkeras.tools.experiments` (see there).
"""

import sys

from distkeras.tools.experiments import (COLUMNS, DEFAULT_SEED, build_mlp, DATASETS,
                                         resolve_trainers, uses_workers, uses_window, plan,
                                         build_trainer, test_accuracy, mean_staleness,
                                         run_one, write_csv, read_csv, format_table,
                                         plot_results, sweep, main)

__all__ = ["COLUMNS", "DEFAULT_SEED", "build_mlp", "DATASETS", "resolve_trainers",
           "uses_workers", "uses_window", "plan", "build_trainer", "test_accuracy",
           "mean_staleness", "run_one", "write_csv", "read_csv", "format_table",
           "plot_results", "sweep", "main"]

if __name__ == "__main__":
    sys.exit(main())
