"""The original dist-keras's trainer getters and setters, for scripts written for it.

dist-keras configured its trainers through methods (``trainer.set_parallelism_factor(2)``)
as well as through constructor arguments. The trainers keep those methods, each derived
here from the setting it reads or writes (`getter`, `setter`) and declared in the class
that holds that setting. Like the constructors, the setters only store: `train()` checks
the values (a bad one is refused there, with the argument's name).
"""

import logging

logger = logging.getLogger(__name__)


def getter(setting):
    """dist-keras's ``get_<name>()``: returns the trainer's ``setting``."""
    def get(self):
        return getattr(self, setting)

    get.__doc__ = f"``{setting}``."
    return get


def setter(setting, doc):
    """dist-keras's ``set_<name>(value)``: stores ``value`` as the trainer's ``setting``.

    Args:
        setting: The attribute (the constructor argument) it sets.
        doc: What the setting is, for the method's docstring.
    """
    def set_(self, value):
        setattr(self, setting, value)

    set_.__doc__ = f"Sets ``{setting}``, {doc}."
    return set_


def set_max_prefetch(self, max_mini_batches):
    """Accepted for dist-keras scripts; it changes nothing here.

    dist-keras's workers read up to this many minibatches ahead into memory; these
    workers stream Arrow batches of bounded size instead, whatever the partition's.
    """
    logger.warning(
        "%s.set_max_prefetch(%r) has no effect: the workers stream their rows in Arrow "
        "batches of bounded size, with no prefetch buffer to size.", type(self).__name__,
        max_mini_batches)
