"""The Algorithm API: an asynchronous optimizer as one small object.

An `Algorithm` says what a worker commits at the end of each window of local steps and
how the parameter server applies a commit to the center variable; everything else (the
sockets and the lock, the checks of every commit, update counting and staleness, the JAX
window path, overlap, the last partial window) is the framework's. Its hyperparameters are
declared once, as `Hyperparameter` entries: the trainer's constructor arguments, its
`get_config`, the command line's flags and the registry's entry come from them.

Example, a rule that adds half of each worker's change (the whole algorithm)::

    class HalfStep(Algorithm):
        def commit(self, weights, pulled, context):
            return 0.5 * (weights - pulled)

    HalfStepTrainer = distkeras.trainers.trainer_for(HalfStep)

A built-in is one file of this package whose class is decorated with `register`: its
trainer (`distkeras.trainers`), the trainers' ``__all__``, the registry of trainers by
name, the command line's ``--trainer`` and the package's exports all derive from it.
"""

from typing import Any, Callable, NamedTuple, Optional

# The built-in algorithms by name, in the order they registered (`register`).
_REGISTERED = {}


def register(algorithm):
    """Registers ``algorithm`` (an `Algorithm` class) as a built-in, under its class name.

    Returns:
        ``algorithm`` itself: use it as a class decorator.

    Raises:
        ValueError: Another class is registered under that name.
    """
    name = algorithm.__name__
    if _REGISTERED.get(name, algorithm) is not algorithm:
        raise ValueError(f"An algorithm named {name!r} is registered already "
                         f"({_REGISTERED[name].__module__}). Rename the class.")
    _REGISTERED[name] = algorithm
    return algorithm


def registered():
    """The registered built-in algorithms, by name (a new dict, in registration order)."""
    return dict(_REGISTERED)


def unregister(name):
    """Removes the algorithm registered under ``name`` (tests that register a toy one)."""
    _REGISTERED.pop(name, None)


def window_up_to_workers(num_workers, most):
    """The number of workers, at most ``most``: the default window of rules that divide a
    commit by the window, so that each commit moves the center about one step's worth
    (``most`` itself for a bad ``num_workers``, which `train()` refuses)."""
    if isinstance(num_workers, int) and not isinstance(num_workers, bool) and num_workers >= 1:
        return min(num_workers, most)
    return most


class _AppliesAsSent:
    """`Algorithm.adds_commits_as_sent`, derived: whether the class keeps the base `apply`
    (``center + update``). Read on the class or an instance."""

    def __get__(self, instance, owner):
        return owner.apply is Algorithm.apply


class Hyperparameter(NamedTuple):
    """One setting of an algorithm, declared once.

    Attributes:
        name: The constructor argument (and `get_config` key, and ``--flag``).
        default: Its value when not given.
        check: ``check(name, value)`` raising ValueError for a bad value, or None.
        doc: One line for the docs and ``--help``.
    """

    name: str
    default: Any
    check: Optional[Callable[[str, Any], None]] = None
    doc: str = ""


class WorkerContext(NamedTuple):
    """What `Algorithm.commit` knows besides the weights.

    Attributes:
        window: The trainer's ``communication_window`` (the last window may be shorter).
        trainable: One flag per weight; False for state such as BatchNormalization's
            moving statistics (see `update_rules`).
    """

    window: int
    trainable: list


class ServerContext(NamedTuple):
    """What `Algorithm.apply` knows besides the center and the update.

    Attributes:
        staleness: Updates applied by others since the committing worker's pull.
        pulled: The center that worker pulled (only where ``sends_pulled``), else None.
        trainable: One flag per weight (see `WorkerContext`).
        state: The algorithm's own server-side state, a dict it may fill (momentum, ...).
            Assign to it last: a commit refused for overflow must leave it unchanged.
        num_updates: Updates applied so far, before this one.
    """

    staleness: int
    pulled: Any
    trainable: list
    state: dict
    num_updates: int


def staleness_discount_factor(num_workers):
    """The workers' learning-rate factor of a rule that divides each commit by its
    staleness + 1 (DynSGD, DiLoCo, FedAdam): 2 from 2 workers on, else 1.

    Args:
        num_workers: The run's number of workers.

    Returns:
        2.0 or 1.0.

    Notes:
        With k workers in step a commit is overtaken by about k - 1 others, so the
        center keeps about 1/k of their summed progress. Twice, not k times: only 2
        workers could be measured here.
    """
    return 2.0 if isinstance(num_workers, int) and num_workers >= 2 else 1.0


class Algorithm:
    """An asynchronous data-parallel optimizer: what workers send, how the center moves.

    Subclasses define `commit` and, unless the center adds commits as sent, `apply`.
    Weights are numpy object arrays of per-layer arrays, so ``weights - pulled`` works
    layer by layer. Neither method may modify its arguments.

    Class attributes (declarations the framework reads):
        hyperparameters: A tuple of `Hyperparameter`.
        default_window: The ``communication_window`` when the trainer is given none
            (what `default_window_for` returns unless a rule overrides it).
        adds_commits_as_sent: Derived, not declared: `apply` is the base one (``center +
            update``). A lone worker then computes the new center itself (no weights sent
            back), and the server can reuse its buffers (``reuse_server_buffers``).
        pull_first: Pull the center before committing (elastic averaging), rather than
            commit then pull.
        uses_staleness: Commits must carry the update count of the worker's last pull
            (`ServerContext.staleness` then counts from it, clamped to the truth).
        sends_pulled: Commits carry the center the worker pulled (`ServerContext.pulled`).
        sets_worker_learning_rate: The trainer's ``learning_rate`` is the workers' Keras
            optimizer's (for rules that have none of their own).
        averages_weights: The center is weights that no worker trained as they are (an
            elastic average, an outer optimizer's step): the trainer measures its
            BatchNormalization statistics again before returning it (`batch_statistics`).
        local_step: None, or a method ``local_step(model, batch, state)`` that takes one
            local step in place of the Keras optimizer's (it leaves the JAX window path).
    """

    hyperparameters = ()
    default_window = 5
    adds_commits_as_sent = _AppliesAsSent()
    pull_first = False
    uses_staleness = False
    sends_pulled = False
    sets_worker_learning_rate = False
    averages_weights = False
    local_step = None

    def __init__(self, **values):
        names = [parameter.name for parameter in self.hyperparameters]
        unknown = sorted(set(values) - set(names))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no hyperparameter "
                            f"{', '.join(unknown)}; it has: {', '.join(names) or 'none'}.")
        for parameter in self.hyperparameters:
            setattr(self, parameter.name, values.get(parameter.name, parameter.default))

    def get_config(self):
        """The hyperparameters' values, by name."""
        return {parameter.name: getattr(self, parameter.name)
                for parameter in self.hyperparameters}

    def validate(self):
        """Raises a ValueError naming any hyperparameter out of range."""
        for parameter in self.hyperparameters:
            if parameter.check is not None:
                parameter.check(parameter.name, getattr(self, parameter.name))
        self.check()

    def check(self):
        """Checks that involve several hyperparameters; raises ValueError."""

    def for_optimizer(self, optimizer):
        """This algorithm for workers that train with ``optimizer`` (a Keras optimizer, its
        name or config): hyperparameters left to the run (None) chosen. Default: itself."""
        return self

    @classmethod
    def default_window_for(cls, num_workers):
        """The ``communication_window`` for ``num_workers`` when none is given:
        ``default_window`` (rules that divide a commit by the window override it with
        `window_up_to_workers`)."""
        return cls.default_window

    @classmethod
    def worker_learning_rate_factor(cls, window, num_workers):
        """What the trainer multiplies its workers' Keras optimizer's learning rate by when
        it is given no ``learning_rate`` (1.0: the optimizer's own rate).

        Args:
            window: The run's ``communication_window``.
            num_workers: The run's number of workers.

        Returns:
            A positive float. A rule whose center keeps only part of its workers'
            progress (it divides each commit by the window, or by its staleness) returns
            more than 1, so that at equal epochs the center goes about as far as `fit`.
        """
        return 1.0

    @property
    def overlaps(self):
        """Whether the exchange can run while the next window trains: the worker commits,
        then pulls, and sends nothing but its update (the overlapped exchange goes on
        from the last center plus its own update)."""
        return not (self.pull_first or self.sends_pulled)

    # -- the rule ------------------------------------------------------------------------

    def commit(self, weights, pulled, context):
        """The worker's commit after a window: from its ``weights`` now and the center
        it ``pulled`` (at the window's start; just now where ``pull_first``).

        Args:
            weights: The worker's weights.
            pulled: The center it pulled.
            context: A `WorkerContext`.

        Returns:
            The update, shaped like the weights.
        """
        raise NotImplementedError(f"{type(self).__name__} must define commit().")

    def apply(self, center, update, context):
        """The new center after a commit (default: ``center + update``).

        Args:
            center: The center variable.
            update: The worker's commit, checked (shapes, finite values).
            context: A `ServerContext`.

        Returns:
            The new center (a new array: never ``center`` modified in place).
        """
        return center + update

    def continue_from(self, weights, update, center):
        """What the worker trains on from after its exchange (default: the ``center``
        it pulled; elastic averaging keeps its own ``weights`` less the ``update``)."""
        return center
