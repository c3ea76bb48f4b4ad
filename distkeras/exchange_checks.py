"""The checks of what a worker exchanges with the parameter server, under their old
import path.

A thin face: the names live in `distkeras.transport.exchange_checks` (see there).
"""

from distkeras.transport.exchange_checks import learning_rate_field, checked_update

__all__ = ["learning_rate_field", "checked_update"]
