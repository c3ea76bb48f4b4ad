"""The update rules of every optimizer, under its old import path.

A thin face: the names live in `distkeras.algorithms.update_rules` (see there).
"""

from distkeras.algorithms.update_rules import (trainable_flags, downpour_delta, adag_residual,
                                               add_update, elastic_difference,
                                               momentum_velocity, lookahead, dynsgd_update,
                                               experimental_update, average_weights,
                                               nesterov_outer_step, adam_outer_step)

__all__ = ["trainable_flags", "downpour_delta", "adag_residual", "add_update",
           "elastic_difference", "momentum_velocity", "lookahead", "dynsgd_update",
           "experimental_update", "average_weights", "nesterov_outer_step", "adam_outer_step"]
