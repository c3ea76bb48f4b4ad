"""The history sink of the parameter servers, under its old import path.

A thin face: the names live in `distkeras.transport.history_sink` (see there).
"""

from distkeras.transport.history_sink import HistorySink

__all__ = ["HistorySink"]
