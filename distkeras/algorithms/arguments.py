"""Checks of the numbers an algorithm or a trainer is given, each a ValueError that names
the argument and what it must be.

At the bottom of the stack, next to the algorithms that use them: the trainers (in
`distkeras.training`) check their own settings with them too.
"""

import numpy as np


def check_int(name, value, minimum=1, maximum=None):
    """A ValueError naming ``name`` unless ``value`` is an integer (not a bool) in
    ``[minimum, maximum]`` (no upper bound where ``maximum`` is None)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or \
            value < minimum or (maximum is not None and value > maximum):
        allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"`{name}` must be an integer {allowed}. Received: {name}={value!r}")


def check_communication_window(value):
    """`check_int` for ``communication_window``, naming dist-keras's README order when the
    value looks like a learning rate (its DOWNPOUR line put learning_rate before it)."""
    if isinstance(value, (float, np.floating)) and 0 < value < 1:
        raise ValueError(
            f"`communication_window` must be an integer >= 1. Received: "
            f"communication_window={value!r}, a learning rate? dist-keras's README lists "
            "DOWNPOUR(..., num_epoch, learning_rate, communication_window), an order its "
            "code did not take (nor does this one): pass learning_rate=... by name.")
    check_int("communication_window", value)


def check_number(name, value):
    """A ValueError naming ``name`` unless ``value`` is a finite number above 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or \
            not np.isfinite(value) or value <= 0:
        raise ValueError(f"`{name}` must be a positive number. Received: {name}={value!r}")


def check_fraction(name, value):
    """A ValueError naming ``name`` unless ``value`` is a number in [0, 1) (a momentum)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
            or not 0.0 <= value < 1.0:
        raise ValueError(f"`{name}` must be a number in [0, 1). Received: {name}={value!r}")
