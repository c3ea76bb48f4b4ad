"""The center variable and its pull and commit exchanges, under their old import path.

A thin face: the names live in `distkeras.transport.center` (see there).
"""

from distkeras.transport.center import (RefusedUpdate, CenterVariable, CenterExchange,
                                        refusing_nonfinite)

__all__ = ["RefusedUpdate", "CenterVariable", "CenterExchange", "refusing_nonfinite"]
