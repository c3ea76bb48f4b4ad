"""Checks of a trainer's settings, under its old import path.

A thin face: the names live in `distkeras.training.checks` (see there).
"""

from distkeras.training.checks import (check_int, check_communication_window, check_number,
                                       is_classification_loss, compiled_with,
                                       compiled_without_loss, binary_loss_logits,
                                       default_metrics, uses_ema, steps_taken,
                                       check_optimizer_tracks_trainable, check_columns,
                                       check_fraction)

# The names an earlier docs/writing-an-algorithm.md imported: plug-ins written from it keep
# working.
_check_int, _check_number, _check_fraction = check_int, check_number, check_fraction

__all__ = ["check_int", "check_communication_window", "check_number", "is_classification_loss",
           "compiled_with", "compiled_without_loss", "binary_loss_logits", "default_metrics",
           "uses_ema", "steps_taken", "check_optimizer_tracks_trainable", "check_columns",
           "check_fraction"]
