"""The epoch barrier of the parameter servers, under its old import path.

A thin face: the names live in `distkeras.transport.epoch_barrier` (see there).
"""

from distkeras.transport.epoch_barrier import EpochBarrier

__all__ = ["EpochBarrier"]
