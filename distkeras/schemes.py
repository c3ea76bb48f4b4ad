"""dist-keras's optimization schemes (`Emperor`) under their dist-keras import path.

A thin face: the names live in `distkeras.tools.schemes` (see there).
"""

from distkeras.tools.schemes import Scheme, Emperor

__all__ = ["Scheme", "Emperor"]
