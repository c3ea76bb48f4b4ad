"""`distkeras.executor.backend` under its former import path.

A thin face: Keras prepared on an executor before a worker or a predictor builds its
model. The underscored names are the former spellings of the public ones.
"""

from distkeras.executor.backend import enable_compilation_cache, ensure_backend

# The names before they were public (`distkeras.predictors` and scripts import them).
_ensure_backend = ensure_backend
_enable_compilation_cache = enable_compilation_cache

__all__ = ["enable_compilation_cache", "ensure_backend"]
