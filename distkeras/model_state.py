"""The state of a Keras model that its weights leave out, under its old import path.

A thin face: the names live in `distkeras.keras_io.model_state` (see there).
"""

from distkeras.keras_io.model_state import (seed_states, worker_seed, seed_worker_generators,
                                            get_optimizer_state, finalize_weights,
                                            set_optimizer_state)

__all__ = ["seed_states", "worker_seed", "seed_worker_generators", "get_optimizer_state",
           "finalize_weights", "set_optimizer_state"]
