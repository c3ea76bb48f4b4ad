"""The options of ``Trainer.train()`` that travel as JSON, under its old import path.

A thin face: the names live in `distkeras.training.options` (see there).
"""

from distkeras.training.options import KEYS, normalize, train_arguments

__all__ = ["KEYS", "normalize", "train_arguments"]
