"""`WindowedWorker`: the loop every built-in asynchronous worker shares, run by an
`Algorithm`, and the built-ins' workers (`ADAGWorker`, `DOWNPOURWorker`, ...)."""

import logging

from distkeras import algorithms
from distkeras.algorithms import WorkerContext
from distkeras.algorithms import update_rules
from distkeras.executor.network import NetworkWorker
from distkeras.executor.task_spec import SpecSetting
from distkeras.transport import networking

logger = logging.getLogger(__name__)


class WindowedWorker(NetworkWorker):
    """The loop every built-in asynchronous worker shares, run by an `Algorithm`.

    Pull, then train; every ``communication_window`` steps (and once more after the last
    step, so no work is lost) call `communicate`, which commits what ``algorithm``
    says (`Algorithm.commit`) and continues from where it says. A subclass without an
    algorithm (the escape hatch) defines `communicate`, or only `window_update`.

    With ``overlap_communication`` (algorithms that commit, then pull: DOWNPOUR, ADAG,
    DynSGD, ...), the exchange with the server runs on a background thread while the next
    window trains: at a boundary the worker sends its update, applies that same update
    to the last center it received and trains on from there; the new center arrives during
    the window and is used at the next boundary. One worker alone follows exactly the
    same path as without overlap; with several, the others' commits reach a worker one
    window later.

    Args:
        model: A `keras.Model` or the bytes of a `.keras` archive.
        *args: `NetworkWorker`'s other arguments, in its order.
        algorithm: The `Algorithm` to run; None: the class's ``algorithm_class`` built
            from the keyword arguments that name its hyperparameters.
        **kwargs: See `NetworkWorker`, and the hyperparameters.
    """

    algorithm_class = None
    overlap_communication = SpecSetting()
    algorithm = SpecSetting()

    def __init__(self, model, *args, algorithm=None, **kwargs):
        if algorithm is None and self.algorithm_class is not None:
            names = {parameter.name for parameter in self.algorithm_class.hyperparameters}
            algorithm = self.algorithm_class(**{name: kwargs[name] for name in names
                                                if kwargs.get(name) is not None})
            kwargs = {name: value for name, value in kwargs.items()
                      if name not in names or name == "learning_rate"}
        super().__init__(model, *args, **kwargs)
        self.algorithm = algorithm
        self.local_state = {}  # the algorithm's own state on this worker (a velocity, ...)
        self.window_start = None  # the weights the window began from
        self._exchanger = None  # the thread of overlapped exchanges, once started
        self._pending_exchange = None  # the overlapped exchange in flight

    def optimize(self):
        self.pull()
        self.model.set_weights(self.center_variable)
        self.window_start = self.center_variable
        exchange = self.communicate
        if self.spec.overlap_communication:
            self.check_overlap()
            exchange = self.communicate_overlapped
        window = self.spec.communication_window
        # The steps left until the next window boundary (a window counts iterations).
        wanted = window - (self.iteration - 1) % window
        batches = self.take_minibatches(wanted)
        while batches:
            self.train_steps(batches)
            # Read the next window's minibatches while this one computes (JAX runs the
            # steps asynchronously); the exchange then waits for the weights.
            complete = len(batches) == wanted
            wanted = window
            upcoming = self.take_minibatches(wanted) if complete else []
            exchange()
            batches = upcoming
        self.wait_for_exchange()

    def has_own_step(self):
        return (self._local_step() is not None
                or type(self).train_step is not WindowedWorker.train_step)

    def train_step(self, x, y, sample_weight=None):
        """One local step: the algorithm's `local_step` where it has one."""
        step = self._local_step()
        if step is None:
            return super().train_step(x, y, sample_weight)
        return step(self.model, (x, y, sample_weight), self.local_state)

    def communicate(self):
        """Exchanges with the parameter server at the end of a window.

        Commits the algorithm's update (pulling first where it says so), pulls, and goes
        on from where it says (by default the new center). When the server adds commits
        as sent and no other worker committed since, it sends no weights back
        (`pull_unless_own`): the center is the pulled one plus this update.
        """
        algorithm = self.spec.algorithm
        pull_first = algorithm is not None and algorithm.pull_first
        if pull_first:
            self.pull()
        weights = self.model.get_weights()
        pulled = self.center_variable
        update = self.window_update(weights, pulled)
        sends_pulled = algorithm is not None and algorithm.sends_pulled
        sent = self.commit(update, **({"center": pulled} if sends_pulled else {}))
        # What the server applies: what compression kept of the update, or the update
        # itself (a subclass's own commit() may return nothing).
        update = update if sent is None else sent
        if not pull_first:
            if self.pull_unless_own():
                # Only this commit moved the center: the server's own addition, done here.
                self.center_variable = update_rules.add_update(pulled, update)
            self.apply_server_learning_rate()
        if algorithm is None:
            self.model.set_weights(self.center_variable)
        else:
            self.model.set_weights(algorithm.continue_from(weights, update,
                                                           self.center_variable))

    def error_feedback(self):
        """Compressed commits carry what earlier ones left out, unless the algorithm goes
        on from the worker's own weights (elastic averaging): what was not sent then
        stays in them, and the worker and the center move by what was sent."""
        algorithm = self.spec.algorithm
        return algorithm is None or \
            type(algorithm).continue_from is algorithms.Algorithm.continue_from

    def window_update(self, weights, start):
        """The commit for a window that began at ``start`` and ended at ``weights``:
        the algorithm's `commit`."""
        algorithm = self.spec.algorithm
        if algorithm is None:
            raise NotImplementedError(
                f"{type(self).__name__} must define communicate() or window_update().")
        return algorithm.commit(
            weights, start, WorkerContext(self.spec.communication_window, self.trainable))

    def _local_step(self):
        algorithm = self.spec.algorithm
        return None if algorithm is None else algorithm.local_step

    def check_overlap(self):
        """Raises a ValueError, saying what to do, when this worker cannot overlap its
        exchanges with training (its algorithm pulls first or sends the pulled center)."""
        algorithm = self.spec.algorithm
        if algorithm is None:
            able = type(self).window_update is not WindowedWorker.window_update
        else:
            able = algorithm.overlaps
        if not able:
            raise ValueError(
                f"{type(self).__name__} cannot overlap communication: its algorithm "
                "pulls before it commits, or sends the center it pulled. Use "
                "overlap_communication=False (the CLI: leave out --overlap-communication).")

    def communicate_overlapped(self):
        """Sends this window's update in the background and trains on without waiting."""
        from concurrent.futures import ThreadPoolExecutor

        update = self.window_update(self.model.get_weights(), self.window_start)
        self.wait_for_exchange()  # the previous exchange's center is in center_variable
        self.apply_server_learning_rate()  # one it brought, here on the training thread
        # Encoded here, after the last exchange: its error feedback runs in order.
        message, sent = self.commit_message(update)
        self.window_start = update_rules.add_update(self.center_variable, sent)
        self.model.set_weights(self.window_start)
        history = self.drain_history() if self.history_due() else None
        if self._exchanger is None:
            self._exchanger = ThreadPoolExecutor(1, thread_name_prefix="distkeras-exchange")
        self._pending_exchange = self._exchanger.submit(
            self._exchange, message, sent, history, self.window_start)

    def _exchange(self, message, sent, history, center_if_only_own):
        self.send_commit_message(message, sent)
        if history is not None:
            self.send_history(*history)
        if self.pull_unless_own():
            self.center_variable = center_if_only_own

    def wait_for_exchange(self):
        """Waits for a background exchange to finish; raises what it raised."""
        pending = self._pending_exchange
        if pending is not None:
            self._pending_exchange = None
            pending.result()

    def before_compile(self):
        # An exchange in flight on the background thread shares the socket: let it end
        # first, or the two frames would interleave (rare: compiles are few).
        self.wait_for_exchange()
        super().before_compile()

    def report_failure(self, error):
        # An exchange in flight on the background thread shares the socket: let it end
        # first, or the two frames would interleave.
        try:
            self.wait_for_exchange()
        except (OSError, networking.ProtocolError) as cause:
            logger.warning("Worker %s: the last exchange failed: %s", self.worker_id, cause)
        super().report_failure(error)

    def before_goodbye(self):
        try:
            self.wait_for_exchange()
        except (OSError, networking.ProtocolError) as error:
            logger.warning("Worker %s: the last exchange failed: %s", self.worker_id, error)
        if self._exchanger is not None:
            self._exchanger.shutdown()
            self._exchanger = None


class DOWNPOURWorker(WindowedWorker):
    """DOWNPOUR's worker (`algorithms.DOWNPOUR`)."""

    algorithm_class = algorithms.DOWNPOUR


class ADAGWorker(WindowedWorker):
    """ADAG's worker (`algorithms.ADAG`)."""

    algorithm_class = algorithms.ADAG


class DynSGDWorker(WindowedWorker):
    """DynSGD's worker (`algorithms.DynSGD`): commits carry the count of its last pull."""

    algorithm_class = algorithms.DynSGD


class AEASGDWorker(WindowedWorker):
    """AEASGD's worker (`algorithms.AEASGD`): takes ``rho`` and ``learning_rate``."""

    algorithm_class = algorithms.AEASGD


class EAMSGDWorker(AEASGDWorker):
    """EAMSGD's worker (`algorithms.EAMSGD`): takes ``momentum`` too."""

    algorithm_class = algorithms.EAMSGD

    def __init__(self, model, *args, momentum=0.9, **kwargs):
        if kwargs.get("algorithm") is None:
            kwargs["momentum"] = momentum
        super().__init__(model, *args, **kwargs)

    @property
    def momentum(self):
        """The local momentum (0: AEASGD's steps, on the window path)."""
        return self.algorithm.momentum

    @property
    def velocity(self):
        """The local momentum's velocity (None before the first step)."""
        return self.local_state.get("velocity")


class ExperimentalWorker(WindowedWorker):
    """The research scaffold's worker (`algorithms.Experimental`)."""

    algorithm_class = algorithms.Experimental
