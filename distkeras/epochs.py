"""A worker's later epochs, replayed from the executor's disk, under its old import path.

A thin face: the names live in `distkeras.executor.epochs` (see there).
"""

from distkeras.executor.epochs import EPOCH_END, Replay, PREFIX, LOCK_NAME, remove_abandoned

__all__ = ["EPOCH_END", "Replay", "PREFIX", "LOCK_NAME", "remove_abandoned"]
