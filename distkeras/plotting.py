"""Plots of a training run and of a sweep of runs, under their old import path.

A thin face: the names live in `distkeras.tools.plotting` (see there).
"""

from distkeras.tools.plotting import plot_history, plot_comparison, rolling_mean

__all__ = ["plot_history", "plot_comparison", "rolling_mean"]
