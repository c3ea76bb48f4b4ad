"""Tools a user runs by hand on the driver, around a training rather than inside it.

- `experiments`: sweeps of trainers, workers and windows (``python -m
  distkeras.tools.experiments``), measured and plotted.
- `plotting`: plots of a run's history and of a sweep (matplotlib, no display).
- `dataframes`: dist-keras's `shuffle` and `precache`.
- `schemes`: dist-keras's `Emperor`, training in rounds with a falling learning rate.
- `legacy_utils`: dist-keras's small helpers, for scripts written for it.

`distkeras.schemes` and `distkeras.utils` are dist-keras's import paths of some of them,
thin faces.
"""
