"""Parameter servers: hold the center variable on the driver and apply workers' commits.

A server is built from parts: `socket_transport.SocketTransport` (accept, handshake,
eviction, one thread per connection, the dispatch of actions), `center.CenterExchange`
(the center variable, its lock, the pull and commit protocol, update counting and
staleness) and `history_sink.HistorySink` (step records, task retries, epoch ends).
`SocketParameterServer` composes all three; subclasses define `handle_commit`.
`HistoryServer` (the progress server) composes the transport and the history sink only.
`AveragingServer` and SingleTrainer's `EpochServer` add `epoch_barrier.EpochBarrier`
(workers wait at each epoch's end) in place of a rule per commit.
"""

import sys

import numpy as np

from distkeras import algorithms, update_rules
from distkeras.algorithms import ServerContext
from distkeras.transport import networking
from distkeras.transport.center import CenterExchange, CenterVariable, RefusedUpdate
from distkeras.transport.epoch_barrier import EpochBarrier
from distkeras.transport.history_sink import HistorySink
from distkeras.transport.networking import recv_data, weights_array
from distkeras.transport.socket_transport import SocketTransport

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


class _EpochBarrierServer(EpochBarrier, CenterExchange, HistorySink, SocketTransport,
                          ParameterServer):
    """The transport, the center, the history sink and the epoch barrier, composed.

    Args:
        model: The master `keras.Model` (its weights: the first center).
        num_workers: Workers that take part in every epoch's end.
        master_port: Port to listen on; 0 lets the OS pick a free one.
    """

    def __init__(self, model, num_workers, master_port=0):
        SocketTransport.__init__(self, master_port)
        CenterExchange.__init__(self, model)
        HistorySink.__init__(self)
        EpochBarrier.__init__(self, num_workers)

    def action_handlers(self):
        return {**self.exchange_actions(), **self.history_actions()}


class AveragingServer(_EpochBarrierServer):
    """Model averaging at every epoch's end, for AveragingTrainer's workers in one job.

    Each worker sends its weights when it finishes an epoch and waits (`EpochBarrier`);
    once all ``num_workers`` have sent theirs for that epoch, the center becomes the mean
    of those that trained on some rows (a replica of an empty partition would pull it
    back), ``on_average(epochs_done, center)`` runs (the driver's end of the epoch:
    validation and callbacks; it returns whether to stop) and every waiting worker gets
    the mean back, with ``learning_rate`` when the driver sets one for the next epoch.

    Args:
        model: The master `keras.Model` (its weights: the first center).
        num_workers: Workers that take part in every average.
        on_average: ``f(epochs_done, center) -> bool`` or None.
        master_port: Port to listen on; 0 lets the OS pick a free one.
    """

    def __init__(self, model, num_workers, on_average=None, master_port=0):
        super().__init__(model, num_workers, master_port)
        self.on_average = on_average

    def _average(self):
        """Averages the epoch's weights (in worker order); call under the lock."""
        trained = [weights for _, (weights, samples) in sorted(self._epoch_weights.items())
                   if samples > 0]
        if trained:
            self.center_variable = update_rules.average_weights(trained)
        self._epoch_weights = {}
        self._end_epoch()

    def _run_epoch_hook(self):
        """Runs ``on_average``; returns whether to stop."""
        if self.on_average is None:
            return False
        return self.on_average(self.epochs_done, self.center_variable)


class EpochServer(_EpochBarrierServer):
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
        super().__init__(model, 1, master_port)
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
