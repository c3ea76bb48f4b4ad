"""Trainer classes by name, under its old import path.

A thin face: the names live in `distkeras.training.registry` (see there).
"""

from distkeras.training.registry import (ENTRY_POINT_GROUP, BUILTIN_TRAINERS, trainer_classes,
                                         get_trainer_class)

__all__ = ["ENTRY_POINT_GROUP", "BUILTIN_TRAINERS", "trainer_classes", "get_trainer_class"]
