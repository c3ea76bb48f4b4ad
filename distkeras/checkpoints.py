"""Checkpoints of a parameter-server training, under its old import path.

A thin face: the names live in `distkeras.training.checkpoints` (see there).
"""

from distkeras.training.checkpoints import (CHECKPOINT_NAME, checkpoint_path, save_checkpoint,
                                            load_checkpoint, restore)

__all__ = ["CHECKPOINT_NAME", "checkpoint_path", "save_checkpoint", "load_checkpoint",
           "restore"]
