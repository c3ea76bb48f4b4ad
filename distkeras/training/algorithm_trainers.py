"""The trainers of the built-in algorithms, derived from their registration.

Every algorithm registered in `distkeras.algorithms` (`algorithms.register`) gets its
trainer here, named as the algorithm: an `AsynchronousDistributedTrainer` whose class
names it, documented from it (`derive`). The trainers whose hyperparameters dist-keras
(or the docs) passed by position keep an explicit constructor below, with those
hyperparameters after ``communication_window``; a new built-in needs none (its
hyperparameters are keyword arguments of the generic constructor).

`distkeras.trainers` is their public face.
"""

import functools
import inspect
import sys
import textwrap

from distkeras import algorithms
from distkeras.training.asynchronous import AsynchronousDistributedTrainer, trainer_for


def _window_doc(algorithm):
    many = algorithm.default_window_for(10**6)
    if algorithm.default_window_for(1) != many:
        return f"the number of workers, at most {many},"
    return str(many)


def trainer_doc(algorithm):
    """The docstring of ``algorithm``'s trainer: the algorithm's summary, the arguments,
    the default window, where the rule is and the rule's own docstring."""
    module = sys.modules[algorithm.__module__]
    summary = (module.__doc__ or algorithm.__doc__ or algorithm.__name__).strip()
    own = "".join(f", ``{parameter.name}`` ({parameter.default!r})"
                  for parameter in algorithm.hyperparameters)
    rule = f"{algorithm.__module__.replace('distkeras.', '')}.{algorithm.__name__}"
    body = textwrap.indent(inspect.cleandoc(algorithm.__doc__ or ""), "    ")
    takes = textwrap.fill(
        f"Takes `AsynchronousDistributedTrainer`'s arguments{own}; ``communication_window`` "
        f"is {_window_doc(algorithm)} by default. The rule: `{rule}`:", 88,
        initial_indent="    ", subsequent_indent="    ")
    return f"{summary.splitlines()[0]}\n\n{takes}\n\n{body}\n    "


class AEASGD(AsynchronousDistributedTrainer):
    __doc__ = trainer_doc(algorithms.AEASGD)
    algorithm = algorithms.AEASGD

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 num_workers=2, batch_size=32, features_col="features", label_col="label",
                 num_epoch=1, communication_window=None, rho=5.0, learning_rate=0.1,
                 master_port=0, loss_weights=None, parallelism_factor=1, worker_timeout=None,
                 overlap_communication=False, reuse_server_buffers=False,
                 compression=None, parameter_server_location=None, num_server_shards=1):
        super().__init__(keras_model, worker_optimizer, loss, metrics, num_workers,
                         batch_size, features_col, label_col, num_epoch, communication_window,
                         master_port, loss_weights, parallelism_factor, learning_rate,
                         worker_timeout, overlap_communication, reuse_server_buffers, compression,
                         rho=rho,
                         parameter_server_location=parameter_server_location,
                         num_server_shards=num_server_shards)


class EAMSGD(AsynchronousDistributedTrainer):
    __doc__ = trainer_doc(algorithms.EAMSGD)
    algorithm = algorithms.EAMSGD

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 num_workers=2, batch_size=32, features_col="features", label_col="label",
                 num_epoch=1, communication_window=None, rho=5.0, learning_rate=0.1,
                 momentum=None, master_port=0, loss_weights=None, parallelism_factor=1,
                 worker_timeout=None, overlap_communication=False,
                 reuse_server_buffers=False, compression=None, parameter_server_location=None,
                 num_server_shards=1):
        super().__init__(keras_model, worker_optimizer, loss, metrics, num_workers,
                         batch_size, features_col, label_col, num_epoch, communication_window,
                         master_port, loss_weights, parallelism_factor, learning_rate,
                         worker_timeout, overlap_communication, reuse_server_buffers, compression,
                         rho=rho,
                         momentum=momentum,
                         parameter_server_location=parameter_server_location,
                         num_server_shards=num_server_shards)


class Experimental(AsynchronousDistributedTrainer):
    __doc__ = trainer_doc(algorithms.Experimental)
    algorithm = algorithms.Experimental

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 num_workers=2, batch_size=32, features_col="features", label_col="label",
                 num_epoch=1, communication_window=None, learning_rate=1.0, master_port=0,
                 loss_weights=None, parallelism_factor=1, worker_timeout=None,
                 overlap_communication=False, reuse_server_buffers=False,
                 compression=None, parameter_server_location=None, num_server_shards=1):
        super().__init__(keras_model, worker_optimizer, loss, metrics, num_workers,
                         batch_size, features_col, label_col, num_epoch, communication_window,
                         master_port, loss_weights, parallelism_factor, learning_rate,
                         worker_timeout, overlap_communication, reuse_server_buffers, compression,
                         parameter_server_location=parameter_server_location,
                         num_server_shards=num_server_shards)


class DiLoCo(AsynchronousDistributedTrainer):
    __doc__ = trainer_doc(algorithms.DiLoCo)
    algorithm = algorithms.DiLoCo

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 num_workers=2, batch_size=32, features_col="features", label_col="label",
                 num_epoch=1, communication_window=None, outer_learning_rate=0.5,
                 outer_momentum=0.5, master_port=0, loss_weights=None, parallelism_factor=1,
                 learning_rate=None, worker_timeout=None, overlap_communication=False,
                 reuse_server_buffers=False, compression=None, parameter_server_location=None,
                 num_server_shards=1):
        super().__init__(keras_model, worker_optimizer, loss, metrics, num_workers,
                         batch_size, features_col, label_col, num_epoch, communication_window,
                         master_port, loss_weights, parallelism_factor, learning_rate,
                         worker_timeout, overlap_communication, reuse_server_buffers, compression,
                         parameter_server_location=parameter_server_location,
                         num_server_shards=num_server_shards,
                         outer_learning_rate=outer_learning_rate,
                         outer_momentum=outer_momentum)


class FedAdam(AsynchronousDistributedTrainer):
    __doc__ = trainer_doc(algorithms.FedAdam)
    algorithm = algorithms.FedAdam

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 num_workers=2, batch_size=32, features_col="features", label_col="label",
                 num_epoch=1, communication_window=None, server_learning_rate=0.01,
                 beta_1=0.0, beta_2=0.99, epsilon=0.01, master_port=0, loss_weights=None,
                 parallelism_factor=1, learning_rate=None, worker_timeout=None,
                 overlap_communication=False, reuse_server_buffers=False,
                 compression=None, parameter_server_location=None, num_server_shards=1):
        super().__init__(keras_model, worker_optimizer, loss, metrics, num_workers,
                         batch_size, features_col, label_col, num_epoch, communication_window,
                         master_port, loss_weights, parallelism_factor, learning_rate,
                         worker_timeout, overlap_communication, reuse_server_buffers, compression,
                         parameter_server_location=parameter_server_location,
                         num_server_shards=num_server_shards,
                         server_learning_rate=server_learning_rate, beta_1=beta_1,
                         beta_2=beta_2, epsilon=epsilon)


# Trainers with a constructor of their own (above), by their algorithm.
_EXPLICIT = {cls.algorithm: cls for cls in (AEASGD, EAMSGD, Experimental, DiLoCo, FedAdam)}


@functools.lru_cache(maxsize=None)
def derive(algorithm, name):
    """The trainer class of a registered ``algorithm``, under ``name`` (one class per
    algorithm, made once)."""
    if algorithm in _EXPLICIT:
        return _EXPLICIT[algorithm]
    cls = trainer_for(algorithm, name, module=__name__)
    cls.__doc__ = trainer_doc(algorithm)
    return cls


def builtin_trainers():
    """The trainers of the registered algorithms, by name, in registration order."""
    return {name: derive(algorithm, name)
            for name, algorithm in algorithms.registered().items()}


# The built-ins registered at import, as this module's names (so that they pickle).
globals().update(builtin_trainers())
