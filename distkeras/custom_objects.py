"""The custom Keras objects a model needs on the executors, under their old import path.

A thin face: the names live in `distkeras.keras_io.custom_objects` (see there).
"""

from distkeras.keras_io.custom_objects import (find, scope, holds_python_code,
                                               check_rebuildable)

__all__ = ["find", "scope", "holds_python_code", "check_rebuildable"]
