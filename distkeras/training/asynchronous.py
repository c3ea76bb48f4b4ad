"""The trainers with several workers, and those with a parameter server.

`DistributedTrainer` (``num_workers`` replicas) and `AsynchronousDistributedTrainer`:
workers against a parameter server, running an `algorithms.Algorithm` (its class's
``algorithm``) or, without one, the worker and server its subclass allocates (the escape
hatch). `trainer_for` makes the trainer class of an algorithm. The parameter-server plan
(`parameter_server.ParameterServerPlan`) trains them.
"""

import inspect
import logging

from distkeras.executor.windowed import WindowedWorker
from distkeras.training import compat
from distkeras.algorithms.arguments import check_communication_window, check_int, check_number
from distkeras.training.checks import uses_ema
from distkeras.training.parameter_server import ParameterServerPlan
from distkeras.training.server_placement import check_location
from distkeras.training.trainer import Trainer
from distkeras.transport import compression as codecs
from distkeras.transport.server_shards import sharded_server
from distkeras.transport import parameter_servers

logger = logging.getLogger(__name__)


class DistributedTrainer(Trainer):
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

    get_num_workers = compat.getter("num_workers")
    set_num_workers = compat.setter("num_workers", "the replicas trained in parallel")
    get_parallelism_factor = compat.getter("parallelism_factor")
    set_parallelism_factor = compat.setter("parallelism_factor",
                                           "the partitions (Spark tasks) per worker")


class _FromAlgorithm:
    """A class attribute of a trainer read from its ``algorithm`` (``default`` without
    one); a subclass may still set its own."""

    def __init__(self, default):
        self.default = default

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, instance, owner):
        algorithm = owner.algorithm
        return self.default if algorithm is None else getattr(algorithm, self.name)


class AsynchronousDistributedTrainer(DistributedTrainer):
    """Workers train asynchronously against a parameter server on the driver.

    A trainer whose class names an ``algorithm`` (an `algorithms.Algorithm` class; see
    `trainer_for`) runs it: its workers and server are the framework's, and its
    hyperparameters are constructor arguments too. Otherwise (the escape hatch),
    subclasses define `allocate_worker()` and may define `allocate_parameter_server()`
    (default: `DeltaParameterServer`, ``C += delta``).

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
        compression: None (float32 both ways), ``"bfloat16"`` (commits and pulls in
            bfloat16) or ``"topk"`` (each commit sends the largest 1% of each layer's
            entries; ``"topk:0.05"`` another share; pulls float32, or the other workers'
            top-k commits only). The center stays float32, and each worker adds what a
            commit left out to its next one (docs/guide/compression.md). Not for
            Experimental, whose commits carry the center they pulled, nor for a trainer
            without an algorithm (the escape hatch).
        parameter_server_location: Where the parameter server runs: ``"driver"`` (in this
            process), ``"executor"`` (in a task of the training's Spark job, beside worker
            0: for a client the executors cannot reach, as under Spark Connect), or None:
            ``"executor"`` under Spark Connect, ``"driver"`` otherwise. See
            docs/parameter-server-placement.md for what each shows while it trains.
        num_server_shards: Processes that serve the center on the driver (1: one server,
            in this process). With S > 1 the weights split into S key ranges balanced by
            bytes, each served by its own process with the same rule, and every worker
            exchanges with all of them at once (docs/scaling.md). Needs an algorithm
            and the server on the driver.
        **hyperparameters: The algorithm's (`Algorithm.hyperparameters`), by name; those
            not given take their declared defaults. The built-ins' trainers take theirs
            by position too, after ``communication_window`` (`distkeras.trainers`).
    """

    # The algorithm the workers and the server run (an `Algorithm` class), or None.
    algorithm = None
    # The window when none is given: the algorithm's (`Algorithm.default_window_for`),
    # else this (a subclass of the escape hatch may set its own).
    default_window = _FromAlgorithm(5)
    # Whether `learning_rate` is the workers' Keras optimizer's (for rules without one).
    sets_worker_learning_rate = _FromAlgorithm(False)
    averages_weights = _FromAlgorithm(False)
    plan = ParameterServerPlan

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 num_workers=2, batch_size=32, features_col="features", label_col="label",
                 num_epoch=1, communication_window=None, master_port=0, loss_weights=None,
                 parallelism_factor=1, learning_rate=None, worker_timeout=None,
                 overlap_communication=False, reuse_server_buffers=False, compression=None,
                 parameter_server_location=None, num_server_shards=1, **hyperparameters):
        super().__init__(keras_model, worker_optimizer, loss, metrics, num_workers,
                         batch_size, features_col, label_col, num_epoch, loss_weights,
                         parallelism_factor)
        self.communication_window = (self.default_window_for(num_workers)
                                     if communication_window is None else communication_window)
        self.master_port = master_port
        self.worker_timeout = worker_timeout
        self.overlap_communication = overlap_communication
        self.reuse_server_buffers = reuse_server_buffers
        self.compression = compression
        self.parameter_server_location = parameter_server_location
        self.num_server_shards = num_server_shards
        declared = {parameter.name: parameter.default for parameter in
                    (self.algorithm.hyperparameters if self.algorithm else ())}
        for name in hyperparameters:
            if name not in declared or name == "learning_rate":
                raise TypeError(f"{type(self).__name__}.__init__() got an unexpected "
                                f"keyword argument {name!r}")
        if "learning_rate" in declared and learning_rate is None:
            learning_rate = declared["learning_rate"]
        self.learning_rate = learning_rate
        for name, default in declared.items():
            if name != "learning_rate":
                setattr(self, name, hyperparameters.get(name, default))

    @classmethod
    def default_window_for(cls, num_workers):
        """The ``communication_window`` used when none is given, for ``num_workers``."""
        if cls.algorithm is None:
            return cls.default_window
        return cls.algorithm.default_window_for(num_workers)

    def hyperparameter_values(self):
        """The algorithm's hyperparameters as given to this trainer, by name."""
        return {parameter.name: getattr(self, parameter.name)
                for parameter in (self.algorithm.hyperparameters if self.algorithm else ())}

    def make_algorithm(self):
        """The algorithm that the workers and the server run, with this trainer's
        hyperparameters, those left to the run chosen for the workers' optimizer."""
        algorithm = self.algorithm(**self.hyperparameter_values())
        return algorithm.for_optimizer(self.compiled_settings()["worker_optimizer"])

    def get_config(self):
        config = super().get_config()
        config.update(communication_window=self.communication_window,
                      master_port=self.master_port, learning_rate=self.learning_rate,
                      worker_timeout=self.worker_timeout,
                      overlap_communication=self.overlap_communication)
        if self.reuse_server_buffers:
            config.update(reuse_server_buffers=True)
        if self.compression is not None:
            config.update(compression=self.compression)
        if self.parameter_server_location is not None:
            config.update(parameter_server_location=self.parameter_server_location)
        if self.num_server_shards != 1:
            config.update(num_server_shards=self.num_server_shards)
        config.update(self.hyperparameter_values())
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
        check_location(settings.parameter_server_location)
        for name in ("overlap_communication", "reuse_server_buffers"):
            if not isinstance(getattr(settings, name), bool):
                raise ValueError(f"`{name}` must be True or False. Received: "
                                 f"{name}={getattr(settings, name)!r}")
        if self.algorithm is not None:
            self.algorithm(**{parameter.name: getattr(settings, parameter.name)
                              for parameter in self.algorithm.hyperparameters}).validate()
            if settings.reuse_server_buffers and not self.algorithm.adds_commits_as_sent:
                raise ValueError(
                    f"`reuse_server_buffers` is for rules that add commits as sent; "
                    f"{type(self).__name__}'s does not. Leave it False.")
        compression = codecs.parse(settings.compression)
        if compression is not None and self.algorithm is None:
            raise ValueError(
                f"{type(self).__name__} has no algorithm: its worker and server (the "
                "escape hatch) exchange float32 weights. Use compression=None.")
        self._check_shards(settings)
        return settings

    def _check_shards(self, settings):
        """Raises a ValueError, saying what to do, for a ``num_server_shards`` that is
        no positive int or that this run cannot shard."""
        shards = getattr(settings, "num_server_shards", 1)
        check_int("num_server_shards", shards, minimum=1)
        if shards == 1:
            return
        if self.algorithm is None:
            raise ValueError(
                f"{type(self).__name__} has no algorithm: its server (the escape hatch's "
                "handle_commit) reads whole-model commits and cannot be sharded. Use "
                "num_server_shards=1.")
        if settings.parameter_server_location == "executor":
            raise ValueError(
                "num_server_shards > 1 serves the shards in processes on the driver; "
                "parameter_server_location='executor' serves one server in a task of the "
                "Spark job. Use parameter_server_location='driver' to keep the shards, or "
                "num_server_shards=1 to keep the server in the Spark job.")

    def make_plan(self, run):
        return self.plan(run, self.allocate_worker, self.checked_parameter_server)

    def checked_parameter_server(self):
        """`allocate_parameter_server`'s server, checked to serve the run's compression
        (a subclass's own server reads float32 commits)."""
        server = self.allocate_parameter_server()
        wanted = codecs.parse(self.compression)
        if wanted != getattr(server, "compression", None):
            raise ValueError(
                f"{type(self).__name__}.allocate_parameter_server() returned a "
                f"{type(server).__name__}, which does not serve compression="
                f"{self.compression!r}. Use compression=None, or return the algorithm's "
                "AlgorithmServer with that compression.")
        return server

    def allocate_worker(self):
        """Returns the worker that every task runs: the algorithm's, or the subclass's."""
        if self.algorithm is None:
            raise NotImplementedError(
                f"{type(self).__name__} must implement allocate_worker().")
        return WindowedWorker(self.master_model, algorithm=self.make_algorithm())

    def allocate_parameter_server(self):
        """Returns the parameter server: the algorithm's `AlgorithmServer`, else
        `DeltaParameterServer` (``C += delta``) unless overridden."""
        if self.algorithm is None:
            return parameter_servers.DeltaParameterServer(
                self.master_model, self.master_port, reuse_buffers=self.reuse_server_buffers)
        if getattr(self, "num_server_shards", 1) > 1:
            return sharded_server(parameter_servers.AlgorithmServer, self.master_model,
                                  self.num_server_shards, self.master_port,
                                  reuse_buffers=self.reuse_server_buffers,
                                  algorithm=self.make_algorithm(),
                                  compression=self.compression)
        return parameter_servers.AlgorithmServer(
            self.master_model, self.master_port, reuse_buffers=self.reuse_server_buffers,
            algorithm=self.make_algorithm(), compression=self.compression)

    def get_staleness(self):
        """Per commit, ``(worker_id, updates by others since that worker's pull)``."""
        return list(self._results.staleness)

    def num_updates(self):
        """The commits the parameter server applied in the last `train()` (0 before)."""
        return self._results.num_updates

    get_learning_rate = compat.getter("learning_rate")
    set_learning_rate = compat.setter(
        "learning_rate", "the update rule's (AEASGD, EAMSGD, Experimental), or the "
        "workers' Keras optimizer's (DOWNPOUR, ADAG, DynSGD)")


# The trainer of an `Algorithm`: an `AsynchronousDistributedTrainer` whose class names one.
AlgorithmTrainer = AsynchronousDistributedTrainer


def trainer_for(algorithm, name=None, module=None):
    """A trainer class (an `AsynchronousDistributedTrainer`) for an `Algorithm` class.

    Args:
        algorithm: The `algorithms.Algorithm` subclass.
        name: The class name (default: the algorithm's, plus ``Trainer``).
        module: The module the class is assigned in, under ``name``, so that it pickles
            (default: the algorithm's).

    Returns:
        The new trainer class, documented by the algorithm's docstring. Its constructor
        is `AsynchronousDistributedTrainer`'s, which takes the algorithm's
        hyperparameters by name.
    """
    return type(name or f"{algorithm.__name__}Trainer", (AsynchronousDistributedTrainer,),
                {"algorithm": algorithm, "__doc__": algorithm.__doc__,
                 "__module__": module or algorithm.__module__,
                 "__signature__": _constructor_signature(algorithm)})


def _constructor_signature(algorithm):
    """The signature of ``algorithm``'s trainer class: `AsynchronousDistributedTrainer`'s
    arguments, then the algorithm's hyperparameters by name (what `help` shows)."""
    base = inspect.signature(AsynchronousDistributedTrainer.__init__)
    parameters = [parameter for name, parameter in base.parameters.items()
                  if name != "self" and parameter.kind is not parameter.VAR_KEYWORD]
    parameters += [inspect.Parameter(hyperparameter.name, inspect.Parameter.KEYWORD_ONLY,
                                     default=hyperparameter.default)
                   for hyperparameter in algorithm.hyperparameters]
    return base.replace(parameters=parameters)
