"""Parameter servers: hold the center variable on the driver and apply workers' commits.

A server is built from parts: `server_transport.SocketTransport` (accept, handshake,
eviction, one thread per connection, the dispatch of actions), `center.CenterExchange`
(the center variable, its lock, the pull and commit protocol, update counting and
staleness) and `history_sink.HistorySink` (step records, task retries, epoch ends).
`SocketParameterServer` composes all three; subclasses define `handle_commit`.
`HistoryServer` (the progress server) composes the transport and the history sink only.
"""

import logging
import sys
import threading

import numpy as np

from distkeras import algorithms
from distkeras import networking
from distkeras import update_rules
from distkeras.algorithms import ServerContext
from distkeras.center import CenterExchange, CenterVariable, RefusedUpdate
from distkeras.history_sink import HistorySink
from distkeras.networking import recv_data, send_data, weights_array
from distkeras.server_transport import SocketTransport

logger = logging.getLogger(__name__)

__all__ = ["RefusedUpdate", "ParameterServer", "SocketParameterServer", "HistoryServer",
           "AlgorithmServer", "DeltaParameterServer", "ADAGParameterServer",
           "DynSGDParameterServer", "ExperimentalParameterServer", "AveragingServer",
           "EpochServer"]


class ParameterServer(CenterVariable):
    """Holds the center variable and the update counter.

    Args:
        model: The master `keras.Model`; its weights are the initial center variable.
        master_port: Port to listen on; 0 lets the OS pick a free one.
    """

    def __init__(self, model, master_port=0):
        CenterVariable.__init__(self, model)
        self.master_port = master_port

    def start(self):
        """Starts serving."""

    def stop(self):
        """Stops serving."""


class SocketParameterServer(CenterExchange, HistorySink, SocketTransport, ParameterServer):
    """A parameter server on a TCP socket, one thread per worker connection.

    Args:
        model: The master `keras.Model`.
        master_port: Port to listen on; 0 lets the OS pick a free one.
        host: Address to bind; the trainer sets the driver's address.
        handshake_timeout: Seconds a new connection has, in all, to present the token.
    """

    # Whether the progress shows commits per second (the rate of the workers' exchanges).
    shows_commit_rate = True

    def __init__(self, model, master_port=0, host="127.0.0.1", handshake_timeout=30.0):
        SocketTransport.__init__(self, master_port, host, handshake_timeout)
        CenterExchange.__init__(self, model)
        HistorySink.__init__(self)

    def action_handlers(self):
        return {**self.exchange_actions(), **self.history_actions()}


class HistoryServer(HistorySink, SocketTransport, ParameterServer):
    """Takes the step records of workers that exchange no weights (SingleTrainer's), so the
    driver shows their progress as it does for the parameter-server trainers.

    The transport and the history sink, without the pull and commit protocol: a pull or
    a commit is an action it does not take, and closes the connection. The center (the
    master model's weights) never changes and ``num_updates`` stays 0.

    Args:
        model: The master `keras.Model`.
        master_port: Port to listen on; 0 lets the OS pick a free one.
        host: Address to bind; the trainer sets the driver's address.
        handshake_timeout: Seconds a new connection has, in all, to present the token.
    """

    def __init__(self, model, master_port=0, host="127.0.0.1", handshake_timeout=30.0):
        SocketTransport.__init__(self, master_port, host, handshake_timeout)
        ParameterServer.__init__(self, model, master_port)
        HistorySink.__init__(self)

    def action_handlers(self):
        return self.history_actions()


def _reference_counts(weights):
    """``sys.getrefcount`` of ``weights`` (an object array of layers) and of each layer."""
    return sys.getrefcount(weights), [sys.getrefcount(layer) for layer in weights]


def _unshared(weights, unheld):
    """Whether nothing but its caller holds ``weights`` or any of its layers: no pull
    still sending it, no view of a layer, no epoch end or trainer keeping it.

    Args:
        weights: An object array of layers, held by one variable of the caller.
        unheld: ``weights_array([np.empty(0)])``, made by the caller and held the same way.

    Notes:
        CPython's reference counts, compared with those of ``unheld`` read the same way:
        what the interpreter itself counts (arguments, loop variables; fewer in newer
        versions) cancels out.
    """
    unheld_array, (unheld_layer,) = _reference_counts(unheld)
    array, layers = _reference_counts(weights)
    return array <= unheld_array and all(count <= unheld_layer for count in layers)


class _AddingServer(SocketParameterServer):
    """``C += update`` as sent; with ``reuse_buffers``, without new memory per commit.

    Args:
        model, master_port, host, handshake_timeout: See `SocketParameterServer`.
        reuse_buffers: Opt-in. Read each connection's commits into one buffer it keeps,
            and write each new center into the center before last when nothing holds
            that one any more (else into new memory). The centers are the same, bit for
            bit: only where the bytes live changes.

    Notes:
        Measured by benchmarks/ps_capacity.py (docs/scaling.md): for a 10M-parameter
        model, most of the server's CPU per commit+pull was the kernel mapping and zeroing
        fresh pages for the 40 MB commit read and the 40 MB new center, not the copy or
        the addition. The cost: one model's bytes more per connection and one more center.
    """

    def __init__(self, model, master_port=0, host="127.0.0.1", handshake_timeout=30.0,
                 reuse_buffers=False):
        super().__init__(model, master_port, host, handshake_timeout)
        if not isinstance(reuse_buffers, bool):
            raise ValueError("`reuse_buffers` must be True or False. Received: "
                             f"reuse_buffers={reuse_buffers!r}")
        self.reuse_buffers = reuse_buffers
        self._spare_center = None  # the center before the current one, to write into

    def add_commit(self, conn, field):
        """Receives a commit and adds its ``field`` (or its ``delta``) to the center."""
        data = recv_data(conn, reuse_body=self.reuse_buffers)
        update = self.model_update(data[field] if field in data else data.get("delta"))
        with self.mutex:
            self.apply_rule(self._add_into_spare if self.reuse_buffers
                            else update_rules.add_update, update)
            self.next_update(conn)

    def _add_into_spare(self, center, update):
        """``center + update`` written into the spare center; call under ``self.mutex``.

        The rule leaves ``center`` and ``update`` as they are (`apply_rule`'s contract):
        ``center`` becomes the spare once replaced, written into only at a later commit
        that finds nothing else holding it.
        """
        spare, self._spare_center = self._spare_center, None
        unheld = weights_array([np.empty(0)])
        if spare is None or spare is center or not _unshared(spare, unheld):
            spare = weights_array(np.empty_like(layer) for layer in center)
        for out, layer, change in zip(spare, center, update):
            np.add(layer, change, out=out)
        self._spare_center = center
        return spare


class AlgorithmServer(_AddingServer):
    """The center variable of an `Algorithm`: each commit, checked, goes to its `apply`.

    The framework's part: the commit's arrays are checked (shapes, finite values), the
    update count and the commit's staleness kept, a new center that would be non-finite
    refused, and with ``reuse_buffers`` (algorithms that add commits as sent) no new
    memory is taken per commit.

    Args:
        model: The master `keras.Model`; its weights are the first center.
        master_port: Port to listen on; 0 lets the OS pick a free one.
        host: Address to bind; the trainer sets the driver's address.
        handshake_timeout: Seconds a new connection has, in all, to present the token.
        reuse_buffers: Opt-in, for algorithms that add commits as sent: see
            `_AddingServer`.
        algorithm: The `Algorithm`; None: the class's ``algorithm_class()``.
    """

    algorithm_class = None
    # The field of a commit that holds the update (ADAG's server also reads "residual").
    commit_field = "delta"

    def __init__(self, model, master_port=0, host="127.0.0.1", handshake_timeout=30.0,
                 reuse_buffers=False, algorithm=None):
        super().__init__(model, master_port, host, handshake_timeout, reuse_buffers)
        self.algorithm = self.algorithm_class() if algorithm is None else algorithm
        # Non-trainable weights (BatchNormalization's statistics): see `update_rules`.
        self.trainable = update_rules.trainable_flags(model)
        self.algorithm_state = {}  # the algorithm's own (`ServerContext.state`)

    def handle_commit(self, conn, addr):
        algorithm = self.algorithm
        if algorithm.adds_commits_as_sent:
            self.add_commit(conn, self.commit_field)
            return
        data = recv_data(conn)
        update = self.model_update(data.get(self.commit_field))
        pulled = self.model_update(data.get("center")) if algorithm.sends_pulled else None
        last_update = data.get("last_update")
        if algorithm.uses_staleness and (isinstance(last_update, bool)
                                         or not isinstance(last_update, int)):
            raise networking.ProtocolError(
                f"A {type(algorithm).__name__} commit must carry its last_update.")
        with self.mutex:
            if algorithm.uses_staleness:
                # A worker cannot have seen more updates than were made; clamp a lying count.
                seen = min(max(last_update, 0), self.num_updates)
            else:
                seen = conn.last_pull_update
            context = ServerContext(self.num_updates - seen, pulled, self.trainable,
                                    self.algorithm_state, self.num_updates)
            self.apply_rule(algorithm.apply, update, context)
            self.next_update(conn)

    def _commits_applied_as_sent(self):
        if type(self).handle_commit is AlgorithmServer.handle_commit:
            return self.algorithm.adds_commits_as_sent
        return super()._commits_applied_as_sent()


class DeltaParameterServer(AlgorithmServer):
    """``C += delta`` (DOWNPOUR, and the default for custom trainers)."""

    algorithm_class = algorithms.DOWNPOUR


class ADAGParameterServer(AlgorithmServer):
    """``C += residual``, the residual being the worker's window-averaged change (ADAG)."""

    algorithm_class = algorithms.ADAG
    commit_field = "residual"


class DynSGDParameterServer(AlgorithmServer):
    """DynSGD's center (`algorithms.DynSGD`): stale commits count less."""

    algorithm_class = algorithms.DynSGD


class ExperimentalParameterServer(AlgorithmServer):
    """The research scaffold's center (`algorithms.Experimental`).

    Args:
        model: The master `keras.Model`.
        master_port: Port to listen on; 0 lets the OS pick.
        learning_rate: The rule's learning rate.
    """

    def __init__(self, model, master_port=0, learning_rate=1.0):
        super().__init__(model, master_port,
                         algorithm=algorithms.Experimental(learning_rate=learning_rate))


class AveragingServer(SocketParameterServer):
    """Model averaging at every epoch's end, for AveragingTrainer's workers in one job.

    Each worker sends its weights when it finishes an epoch and waits; once all
    ``num_workers`` have sent theirs for that epoch, the center becomes the mean of those
    that trained on some rows (a replica of an empty partition would pull it back),
    ``on_average(epochs_done, center)`` runs (the driver's end of the epoch: validation and
    callbacks; it returns whether to stop) and every waiting worker gets the mean back,
    with ``learning_rate`` when the driver sets one for the next epoch.

    Replies carry ``epochs_done``: a worker that Spark restarted (a barrier stage restarts
    them all) joins with a pull and skips the epochs already averaged. A worker's weights
    for an epoch replace any it sent for that epoch before (from a task that was killed):
    both started from the same average, so either is a true result of that epoch.

    Args:
        model: The master `keras.Model` (its weights: the first center).
        num_workers: Workers that take part in every average.
        on_average: ``f(epochs_done, center) -> bool`` or None.
    """

    WAIT_SECONDS = 1.0  # how often a waiting handler checks that the server still runs
    # Its commits are epoch ends, not the workers' exchanges: no commit rate to show.
    shows_commit_rate = False

    def __init__(self, model, num_workers, on_average=None, master_port=0):
        super().__init__(model, master_port)
        self.num_workers = num_workers
        self.on_average = on_average
        # Weights that hold NaN or infinite values still take part in the mean, as in one
        # Spark job per epoch (the driver averages whatever the workers return): a refused
        # commit would get no reply and every worker would wait for it forever.
        self.allow_nonfinite = True
        self.epochs_done = 0
        self.stop_requested = False
        self.learning_rate = None  # the next epoch's, when the driver sets one
        self._epoch_weights = {}  # worker id -> (weights, samples) of epoch ``epochs_done``
        self._averaged = threading.Condition(self.mutex)

    def handle_pull(self, conn, addr):
        """A worker joins (or rejoins): the center and the epochs averaged so far.

        A rejoining worker redoes the epochs not averaged yet: the steps its lost task
        recorded in them are marked ``superseded``, so the history counts each epoch's
        steps once (it keeps those of the epochs averaged, which the new task skips).
        """
        with self.mutex:
            with self._history_lock:
                self._supersede(conn.worker_id,
                                lambda record: record.get("epoch", 0) >= self.epochs_done)
            reply = self._reply()
        send_data(conn, reply)

    def _retried(self, conn):
        """Nothing at the handshake: the new attempt's pull says which epochs it redoes
        (an epoch may still end between the two)."""

    handle_pull_unless_own = handle_pull

    def handle_commit(self, conn, addr):
        data = recv_data(conn)
        weights = self.model_update(data.get("delta"))
        epoch = data.get("epoch")
        if isinstance(epoch, bool) or not isinstance(epoch, int):
            raise networking.ProtocolError("An averaging commit must carry its epoch.")
        samples = data.get("samples")
        if isinstance(samples, bool) or not isinstance(samples, int):
            raise networking.ProtocolError("An averaging commit must carry its samples.")
        with self._averaged:
            if epoch > self.epochs_done:
                raise networking.ProtocolError(
                    f"Worker {conn.worker_id} sent epoch {epoch + 1} before epoch "
                    f"{self.epochs_done + 1} was averaged.")
            if epoch == self.epochs_done and not self.stop_requested:
                self._epoch_weights[conn.worker_id] = self._epoch_entry(data, weights,
                                                                        samples)
                if len(self._epoch_weights) >= self.num_workers:
                    self._average()
                while self.epochs_done == epoch and not self.stop_requested \
                        and self._running:
                    self._averaged.wait(self.WAIT_SECONDS)
            self.next_update(conn)
            reply = self._reply()
        send_data(conn, reply)

    def _epoch_entry(self, data, weights, samples):
        """What a worker's commit of an epoch keeps until the epoch ends."""
        return weights, samples

    def _average(self):
        """Averages the epoch's weights (in worker order); call under the lock."""
        trained = [weights for _, (weights, samples) in sorted(self._epoch_weights.items())
                   if samples > 0]
        if trained:
            self.center_variable = update_rules.average_weights(trained)
        self._epoch_weights = {}
        self._end_epoch()

    def _end_epoch(self):
        """Counts the epoch done, runs the driver's end of it and wakes the waiting
        workers; call under the lock."""
        self.epochs_done += 1
        try:
            # The workers wait meanwhile, as they would between two Spark jobs.
            self.stop_requested = bool(self._run_epoch_hook())
        except Exception as error:  # the driver's hook: stop the workers, keep its error
            logger.exception("The end of epoch %s failed on the driver", self.epochs_done)
            with self._history_lock:
                self.errors.append(f"{type(error).__name__}: {error}")
            self.stop_requested = True
        finally:
            self._averaged.notify_all()

    def _run_epoch_hook(self):
        """Runs ``on_average``; returns whether to stop."""
        if self.on_average is None:
            return False
        return self.on_average(self.epochs_done, self.center_variable)

    def _reply(self):
        reply = {"center": self.center_variable, "epochs_done": self.epochs_done,
                 "stop": self.stop_requested}
        if self.learning_rate is not None:
            reply["learning_rate"] = float(self.learning_rate)
        return reply


class EpochServer(AveragingServer):
    """SingleTrainer's driver end when every epoch runs in one Spark task and the driver
    validates or calls back at each epoch's end.

    The one worker sends its weights and its optimizer's state at each epoch's end and
    waits while ``on_epoch_end(epochs_done, weights, optimizer_state)`` runs on the driver;
    the hook returns ``(stop, optimizer_state)``, the state to go on with (a callback may
    have changed its learning rate), or None to keep the worker's. Replies carry the
    weights and that state, so a task that Spark restarted goes on from the last epoch's
    end, as the next task of a job per epoch would.

    Args:
        model: The master `keras.Model` (its weights: where training starts).
        optimizer_state: The optimizer's state to start from (`model_state.get_optimizer_state`
            of the compiled model whose optimizer the worker builds).
        on_epoch_end: The driver's end of an epoch, or None.
    """

    FIELD = "optimizer_state"

    def __init__(self, model, optimizer_state, on_epoch_end=None, master_port=0):
        super().__init__(model, 1, master_port=master_port)
        self.optimizer_state = weights_array(optimizer_state)
        self.field_specs = {self.FIELD: [(value.shape, value.dtype)
                                         for value in self.optimizer_state]}
        self.max_frame_bytes += sum(value.nbytes for value in self.optimizer_state)
        self.on_epoch_end = on_epoch_end

    def _epoch_entry(self, data, weights, samples):
        state = data.get(self.FIELD)
        if not (isinstance(state, np.ndarray) and state.dtype == object
                and len(state) == len(self.optimizer_state)):
            raise networking.ProtocolError(
                "An epoch's commit must carry the optimizer's state.")
        return weights, samples, state

    def _average(self):
        """Takes the one worker's weights and optimizer state; call under the lock."""
        ((weights, _, state),) = self._epoch_weights.values()
        self._epoch_weights = {}
        self.center_variable, self.optimizer_state = weights, state
        self._end_epoch()

    def _run_epoch_hook(self):
        if self.on_epoch_end is None:
            return False
        stop, state = self.on_epoch_end(self.epochs_done, self.center_variable,
                                        self.optimizer_state)
        if state is not None:
            self.optimizer_state = weights_array(state)
        return stop

    def _reply(self):
        reply = super()._reply()
        reply[self.FIELD] = self.optimizer_state
        return reply
