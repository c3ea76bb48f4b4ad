"""The trainers with several workers, and those with a parameter server.

`DistributedTrainer` (``num_workers`` replicas), `AsynchronousDistributedTrainer` (workers
against a parameter server: the escape hatch's base), `AlgorithmTrainer` (an
`algorithms.Algorithm`'s trainer) and `trainer_for`, which makes one. The parameter-server
plan (`parameter_server.ParameterServerPlan`) trains them.
"""

import logging

from distkeras import compat
from distkeras.executor.windowed import WindowedWorker
from distkeras.training.checks import check_communication_window, check_int, check_number, \
    uses_ema
from distkeras.training.parameter_server import ParameterServerPlan
from distkeras.training.trainer import Trainer
from distkeras.transport import parameter_servers

logger = logging.getLogger(__name__)


class DistributedTrainer(Trainer, compat.DistributedAccessors):
    """A trainer that runs ``num_workers`` replicas, one Spark task each.

    Takes `Trainer`'s arguments as well; the ones below are its own.

    Args:
        num_workers: Replicas trained in parallel.
        parallelism_factor: Partitions per worker (more, smaller tasks).
    """

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 num_workers=2, batch_size=32, features_col="features", label_col="label",
                 num_epoch=1, loss_weights=None, parallelism_factor=1):
        super().__init__(keras_model, worker_optimizer, loss, metrics, loss_weights,
                         features_col, label_col, batch_size, num_epoch)
        self.num_workers = num_workers
        self.parallelism_factor = parallelism_factor

    # Whether the workers' weights are combined (a center, a mean): an optimizer's moving
    # averages (use_ema=True), each worker's own, are then left out.
    exchanges_weights = True

    def get_config(self):
        config = super().get_config()
        config.update(num_workers=self.num_workers, parallelism_factor=self.parallelism_factor)
        return config

    def check_settings(self, settings):
        settings = super().check_settings(settings)
        check_int("num_workers", settings.num_workers)
        if uses_ema(settings.worker_optimizer) and self.exchanges_weights:
            logger.warning(
                "%s: the worker optimizer's use_ema=True keeps moving averages in each "
                "worker, which are not exchanged: the returned model holds the trained "
                "weights, not their moving averages (SingleTrainer, and each member of "
                "an EnsembleTrainer, return them, as fit does).", type(self).__name__)
        check_int("parallelism_factor", settings.parallelism_factor)
        return settings

    def num_partitions(self):
        return self.num_workers * self.parallelism_factor


class AsynchronousDistributedTrainer(DistributedTrainer, compat.AsynchronousAccessors):
    """Workers train asynchronously against a parameter server on the driver.

    An `algorithms.Algorithm`'s trainer is an `AlgorithmTrainer` (see `trainer_for`).
    Otherwise (the escape hatch), subclasses define `allocate_worker()` and may define
    `allocate_parameter_server()` (default: `DeltaParameterServer`, ``C += delta``).

    Takes `DistributedTrainer`'s arguments as well; the ones below are its own.

    Args:
        communication_window: Local steps between two commits.
        master_port: Parameter server port; 0 (default) lets the OS choose.
        learning_rate: Used by update rules that have one (AEASGD's elastic rate, ...).
            The classes whose rule has none and that set ``sets_worker_learning_rate``
            (DOWNPOUR, ADAG, DynSGD) give it to the workers' Keras optimizer instead, in
            place of its own rate (dist-keras's DOWNPOUR took a learning rate too).
        worker_timeout: Seconds a worker may stay silent between its steps before the
            training stops with an error naming it (None: wait forever). Before its first
            step and while it compiles a step (a short last batch's) a worker may take
            `TrainingMonitor.STARTUP_TIMEOUT` (120 s, or worker_timeout if longer).
        overlap_communication: Algorithms that commit, then pull (all built-ins but
            AEASGD, EAMSGD and Experimental): exchange with the server on a background
            thread while the next window trains, applying the worker's own update locally
            instead of waiting to pull it back (see `WindowedWorker`). The same path for
            one worker; with several, others' commits arrive a window later.
        reuse_server_buffers: Algorithms that add commits as sent (DOWNPOUR, ADAG, AEASGD,
            EAMSGD), opt-in: their parameter server reads commits into one buffer per
            worker and writes each new center into memory it used before
            (`AlgorithmServer`'s ``reuse_buffers``): the same centers bit for bit, for less
            server CPU per commit on large models (docs/scaling.md).
    """

    default_window = 5
    # Whether `learning_rate` is the workers' Keras optimizer's (for rules without one).
    sets_worker_learning_rate = False
    plan = ParameterServerPlan

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 num_workers=2, batch_size=32, features_col="features", label_col="label",
                 num_epoch=1, communication_window=None, master_port=0, loss_weights=None,
                 parallelism_factor=1, learning_rate=None, worker_timeout=None,
                 overlap_communication=False, reuse_server_buffers=False):
        super().__init__(keras_model, worker_optimizer, loss, metrics, num_workers,
                         batch_size, features_col, label_col, num_epoch, loss_weights,
                         parallelism_factor)
        self.communication_window = (self.default_window_for(num_workers)
                                     if communication_window is None else communication_window)
        self.master_port = master_port
        self.learning_rate = learning_rate
        self.worker_timeout = worker_timeout
        self.overlap_communication = overlap_communication
        self.reuse_server_buffers = reuse_server_buffers

    @classmethod
    def default_window_for(cls, num_workers):
        """The ``communication_window`` used when none is given, for ``num_workers``."""
        return cls.default_window

    def get_config(self):
        config = super().get_config()
        config.update(communication_window=self.communication_window,
                      master_port=self.master_port, learning_rate=self.learning_rate,
                      worker_timeout=self.worker_timeout,
                      overlap_communication=self.overlap_communication)
        if self.reuse_server_buffers:  # only DOWNPOUR's and ADAG's constructors take it
            config.update(reuse_server_buffers=True)
        return config

    def check_settings(self, settings):
        settings = super().check_settings(settings)
        check_communication_window(settings.communication_window)
        # A TCP port: 0 lets the OS pick one. A larger number would fail only when the
        # server binds, as an OverflowError naming no argument.
        check_int("master_port", settings.master_port, minimum=0, maximum=65535)
        if settings.learning_rate is not None:
            check_number("learning_rate", settings.learning_rate)
        if settings.worker_timeout is not None:
            check_number("worker_timeout", settings.worker_timeout)
        for name in ("overlap_communication", "reuse_server_buffers"):
            if not isinstance(getattr(settings, name), bool):
                raise ValueError(f"`{name}` must be True or False. Received: "
                                 f"{name}={getattr(settings, name)!r}")
        return settings

    def allocate_worker(self):
        """Returns the worker that every task runs; subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} must implement allocate_worker().")

    def allocate_parameter_server(self):
        """Returns the parameter server; `DeltaParameterServer` unless overridden."""
        return parameter_servers.DeltaParameterServer(
            self.master_model, self.master_port, reuse_buffers=self.reuse_server_buffers)

    def get_staleness(self):
        """Per commit, ``(worker_id, updates by others since that worker's pull)``."""
        return list(self._results.staleness)


def _algorithm_init(algorithm):
    """A trainer's ``__init__`` for ``algorithm``: `AsynchronousDistributedTrainer`'s
    arguments with the algorithm's hyperparameters after ``communication_window``, where
    AEASGD, EAMSGD and Experimental always had theirs (an inspectable signature: the
    command line's flags come from it)."""
    import inspect

    base = inspect.signature(AsynchronousDistributedTrainer.__init__).parameters
    hyper = {parameter.name: parameter for parameter in algorithm.hyperparameters}
    parameters = []
    for name, parameter in base.items():
        if name in hyper:
            continue  # the algorithm's own, with its default, after communication_window
        parameters.append(parameter)
        if name == "communication_window":
            parameters.extend(inspect.Parameter(name, parameter.kind, default=given.default)
                              for name, given in hyper.items())
    signature = inspect.Signature(parameters)

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        del values["self"]
        own = {name: values.pop(name) for name in hyper if name != "learning_rate"}
        AsynchronousDistributedTrainer.__init__(self, **values)
        for name, value in own.items():
            setattr(self, name, value)

    __init__.__signature__ = signature
    return __init__


class AlgorithmTrainer(AsynchronousDistributedTrainer):
    """The trainer of an `Algorithm` (``algorithm``, a class): its workers and server run it.

    Takes `AsynchronousDistributedTrainer`'s arguments and the algorithm's
    hyperparameters (after ``communication_window``); `trainer_for` makes one.
    """

    algorithm = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        algorithm = vars(cls).get("algorithm")
        if algorithm is None:
            return
        cls.default_window = algorithm.default_window
        cls.sets_worker_learning_rate = algorithm.sets_worker_learning_rate
        cls.averages_weights = algorithm.averages_weights
        if "__init__" not in vars(cls):
            cls.__init__ = _algorithm_init(algorithm)

    @classmethod
    def default_window_for(cls, num_workers):
        return cls.algorithm.default_window_for(num_workers)

    def hyperparameter_values(self):
        """The algorithm's hyperparameters as given to this trainer, by name."""
        return {parameter.name: getattr(self, parameter.name)
                for parameter in self.algorithm.hyperparameters}

    def make_algorithm(self):
        """The algorithm that the workers and the server run, with this trainer's
        hyperparameters."""
        return self.algorithm(**self.hyperparameter_values())

    def get_config(self):
        config = super().get_config()
        config.update(self.hyperparameter_values())
        return config

    def check_settings(self, settings):
        settings = super().check_settings(settings)
        self.algorithm(**{parameter.name: getattr(settings, parameter.name)
                          for parameter in self.algorithm.hyperparameters}).validate()
        if settings.reuse_server_buffers and not self.algorithm.adds_commits_as_sent:
            raise ValueError(
                f"`reuse_server_buffers` is for rules that add commits as sent; "
                f"{type(self).__name__}'s does not. Leave it False.")
        return settings

    def allocate_worker(self):
        return WindowedWorker(self.master_model, algorithm=self.make_algorithm())

    def allocate_parameter_server(self):
        return parameter_servers.AlgorithmServer(
            self.master_model, self.master_port, reuse_buffers=self.reuse_server_buffers,
            algorithm=self.make_algorithm())


def trainer_for(algorithm, name=None):
    """A trainer class (an `AlgorithmTrainer`) for an `Algorithm` class.

    Args:
        algorithm: The `algorithms.Algorithm` subclass.
        name: The class name (default: the algorithm's, plus ``Trainer``). Assign the
            class to that name in the algorithm's module, so that it pickles.

    Returns:
        The new trainer class, documented by the algorithm's docstring.
    """
    return type(name or f"{algorithm.__name__}Trainer", (AlgorithmTrainer,),
                {"algorithm": algorithm, "__doc__": algorithm.__doc__,
                 "__module__": algorithm.__module__})
