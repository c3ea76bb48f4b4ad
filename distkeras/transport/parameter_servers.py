"""Parameter servers: hold the center variable on the driver and apply workers' commits.

A server holds its parts and hands each its share of the work: the transport
(`socket_transport.SocketTransport`: accept, handshake, eviction, one thread per
connection, the dispatch of actions to the server), the center (`center.CenterExchange`:
the center variable, its lock, the pull and commit protocol, update counting and
staleness) and the history sink (`history_sink.HistorySink`: step records, task retries,
epoch ends). `SocketParameterServer` holds all three; its subclasses define the rule,
`handle_commit` (an `Algorithm`'s `apply`, through `AlgorithmServer`). `HistoryServer`
(the progress server) holds a transport, the center's weights and a history sink, and
serves no pull or commit. `AveragingServer` and SingleTrainer's `EpochServer` hold an
`epoch_barrier.EpochBarrier` (workers wait at each epoch's end) in place of a rule per
commit.

The server's attributes that the extension API (docs/writing-an-algorithm.md) and the
trainers use (``mutex``, ``center_variable``, ``num_updates``, ``port``, ``token``,
``history``, ...) are its parts', read and written through it (`part_attribute`).
"""

import functools
import sys

import numpy as np

from distkeras import algorithms
from distkeras.algorithms import ServerContext
from distkeras.algorithms import update_rules
from distkeras.transport import networking
from distkeras.transport.center import CenterExchange, CenterVariable, RefusedUpdate
from distkeras.transport.epoch_barrier import EpochBarrier, EpochEnds
from distkeras.transport.history_sink import HistorySink
from distkeras.transport.networking import recv_data, weights_array
from distkeras.transport.socket_transport import SocketTransport

__all__ = ["RefusedUpdate", "ParameterServer", "SocketParameterServer", "HistoryServer",
           "AlgorithmServer", "DeltaParameterServer", "ADAGParameterServer",
           "DynSGDParameterServer", "ExperimentalParameterServer", "AveragingServer",
           "EpochServer", "part_attribute", "part_method"]


def part_attribute(part, name, writable=False):
    """A property of a server that is ``name`` of the part it holds at ``part``.

    Args:
        part: The server's attribute that holds the part (``"center"``, ...).
        name: The part's attribute.
        writable: Whether setting it on the server sets it on the part.
    """
    def get(server):
        return getattr(getattr(server, part), name)

    def set_(server, value):
        setattr(getattr(server, part), name, value)

    return property(get, set_ if writable else None,
                    doc=f"The ``{name}`` of the server's ``{part}``.")


def part_method(part_class, part, name):
    """A method of a server that calls method ``name`` of the part it holds at ``part``.

    Args:
        part_class: The part's class (the method's signature and docstring are its).
        part: The server's attribute that holds the part.
        name: The part's method.
    """
    @functools.wraps(getattr(part_class, name))
    def method(server, *args, **kwargs):
        return getattr(getattr(server, part), name)(*args, **kwargs)

    return method


class ParameterServer:
    """Holds the center variable (`center.CenterVariable`) and the update counter.

    Args:
        model: The master `keras.Model`; its weights are the initial center variable.
        master_port: Port to listen on; 0 lets the OS pick a free one.
    """

    def __init__(self, model, master_port=0):
        self.center = self.make_center(model)
        self.master_port = master_port

    def make_center(self, model):
        """The center part this server holds."""
        return CenterVariable(model)

    model = part_attribute("center", "model")
    center_variable = part_attribute("center", "center_variable", writable=True)
    num_updates = part_attribute("center", "num_updates", writable=True)
    mutex = part_attribute("center", "mutex")
    weight_spec = part_attribute("center", "weight_spec")
    max_frame_bytes = part_attribute("center", "max_frame_bytes", writable=True)
    get_model = part_method(CenterVariable, "center", "get_model")
    # Fields whose lists of arrays are not shaped like the weights (their own spec).
    field_specs = None

    def start(self):
        """Starts serving."""

    def stop(self):
        """Stops serving."""


class _ServedBySocket(ParameterServer):
    """A `ParameterServer` that holds a `SocketTransport` and a `HistorySink`, and
    serves the actions of its ``action_handlers`` table.

    Args:
        model: The master `keras.Model`.
        master_port: Port to listen on; 0 lets the OS pick a free one.
        host: Address to bind; the trainer sets the driver's address.
        handshake_timeout: Seconds a new connection has, in all, to present the token.
    """

    # Whether the progress shows commits per second (the rate of the workers' exchanges).
    shows_commit_rate = True
    MAX_PENDING_HANDSHAKES = SocketTransport.MAX_PENDING_HANDSHAKES
    supersede_on_retry = True  # see `HistorySink`

    def __init__(self, model, master_port=0, host="127.0.0.1", handshake_timeout=30.0):
        self.transport = SocketTransport(master_port, host, handshake_timeout, server=self)
        ParameterServer.__init__(self, model, master_port)
        self.sink = HistorySink(self.transport.lock, self.center, self.supersede_on_retry)

    # The transport's.
    start = part_method(SocketTransport, "transport", "start")
    stop = part_method(SocketTransport, "transport", "stop")
    wait_for_goodbyes = part_method(SocketTransport, "transport", "wait_for_goodbyes")
    idle_workers = part_method(SocketTransport, "transport", "idle_workers")
    expect_workers = part_method(SocketTransport, "transport", "expect_workers")
    master_port = part_attribute("transport", "master_port", writable=True)
    host = part_attribute("transport", "host", writable=True)
    port = part_attribute("transport", "port")
    token = part_attribute("transport", "token")
    handshake_timeout = part_attribute("transport", "handshake_timeout", writable=True)
    max_pending_handshakes = part_attribute("transport", "max_pending_handshakes",
                                            writable=True)
    handshakes_closed = part_attribute("transport", "handshakes_closed")
    errors = part_attribute("transport", "errors")
    running = part_attribute("transport", "running")
    on_error = part_attribute("transport", "on_error", writable=True)
    # The history sink's.
    history = part_attribute("sink", "history")
    metric_states = part_attribute("sink", "metric_states")
    history_generation = part_attribute("sink", "history_generation")
    finished_workers = part_attribute("sink", "finished_workers")
    worker_failures = part_attribute("sink", "worker_failures")
    on_worker_failure = part_attribute("sink", "on_worker_failure", writable=True)
    finished = part_method(HistorySink, "sink", "finished")
    history_snapshot = part_method(HistorySink, "sink", "history_snapshot")
    metric_states_snapshot = part_method(HistorySink, "sink", "metric_states_snapshot")
    track_epochs = part_method(HistorySink, "sink", "track_epochs")
    epoch_end = part_method(HistorySink, "sink", "epoch_end")
    handle_history = part_method(HistorySink, "sink", "handle_history")
    handle_failure = part_method(HistorySink, "sink", "handle_failure")
    handle_goodbye = part_method(HistorySink, "sink", "handle_goodbye")

    def action_handlers(self):
        """``{action: (method name, whether the connection ends after it)}``: what the
        transport serves (`SocketTransport.action_handlers`)."""
        return {networking.ACTION_HISTORY: ("handle_history", False),
                networking.ACTION_FAILURE: ("handle_failure", True),
                networking.ACTION_QUIT: ("handle_goodbye", True)}

    def prepare_connection(self, conn):
        """Sets a new connection's own state, before its handshake."""

    def joined(self, conn):
        """Called once ``conn`` presented the token: the sink notes its task attempt."""
        self.sink.joined(conn)


class _ExchangingServer(_ServedBySocket):
    """A `_ServedBySocket` server whose center is a `CenterExchange`: it serves pulls
    and commits."""

    # The method that serves a pull "unless only mine changed it".
    pull_unless_own_handler = "handle_pull_unless_own"

    def make_center(self, model):
        return CenterExchange(model)

    # The center's.
    staleness = part_attribute("center", "staleness")
    refused = part_attribute("center", "refused")
    refused_by_worker = part_attribute("center", "refused_by_worker")
    allow_nonfinite = part_attribute("center", "allow_nonfinite", writable=True)
    optimizer_learning_rate = part_attribute("center", "optimizer_learning_rate",
                                             writable=True)
    next_update = part_method(CenterExchange, "center", "next_update")
    model_update = part_method(CenterExchange, "center", "model_update")

    def action_handlers(self):
        return {networking.ACTION_PULL: ("handle_pull", False),
                networking.ACTION_PULL_UNLESS_OWN: (self.pull_unless_own_handler, False),
                networking.ACTION_COMMIT: ("commit_action", False),
                **super().action_handlers()}

    def prepare_connection(self, conn):
        self.center.prepare_connection(conn)


class SocketParameterServer(_ExchangingServer):
    """A parameter server on a TCP socket, one thread per worker connection.

    Subclasses define the rule, `handle_commit`; it reads the commit with `recv_data`
    and changes ``center_variable`` under ``mutex`` (the extension API of
    docs/writing-an-algorithm.md).

    Args:
        model: The master `keras.Model`.
        master_port: Port to listen on; 0 lets the OS pick a free one.
        host: Address to bind; the trainer sets the driver's address.
        handshake_timeout: Seconds a new connection has, in all, to present the token.
    """

    # Whether its `handle_commit` adds each commit to the center exactly as sent (see
    # `center`); counted only where the class that defines `handle_commit` declares it.
    commits_applied_as_sent = False

    def apply_rule(self, rule, *args):
        """Replaces the center with ``rule(center, *args)``; call under ``mutex`` (see
        `CenterExchange.apply_rule`)."""
        self.center.apply_rule(rule, *args)

    def handle_pull(self, conn, addr):
        """Sends the center variable and the update count read under one lock."""
        self.center.handle_pull(conn, addr)

    def handle_pull_unless_own(self, conn, addr):
        """Like `handle_pull`, but answers ``{"unchanged": True}`` without the weights when
        the center moved only by this connection's commits since its last pull (servers
        whose rule adds commits as sent only)."""
        if not self.center.pull_unchanged(conn, self._commits_applied_as_sent()):
            self.handle_pull(conn, addr)

    def commit_action(self, conn, addr):
        """Serves one commit with `handle_commit` (see `CenterExchange.commit_action`)."""
        self.center.commit_action(conn, addr, self.handle_commit)

    def _commits_applied_as_sent(self):
        # The flag counts only where declared by the class whose handle_commit is in use:
        # a subclass with its own rule does not inherit it by accident.
        for cls in type(self).__mro__:
            if "handle_commit" in vars(cls):
                return bool(vars(cls).get("commits_applied_as_sent", False))
        return False

    def handle_commit(self, conn, addr):
        """Receives one commit and applies it; subclasses define the rule."""
        raise NotImplementedError(f"{type(self).__name__} must implement handle_commit().")


class HistoryServer(_ServedBySocket):
    """Takes the step records of workers that exchange no weights (SingleTrainer's), so the
    driver shows their progress as it does for the parameter-server trainers.

    A transport, the center's weights (`center.CenterVariable`, which never change:
    ``num_updates`` stays 0) and a history sink: no pull or commit is served, and either
    closes the connection as any unknown action does.

    Args:
        model: The master `keras.Model`.
        master_port: Port to listen on; 0 lets the OS pick a free one.
        host: Address to bind; the trainer sets the driver's address.
        handshake_timeout: Seconds a new connection has, in all, to present the token.
    """


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


class _EpochBarrierServer(EpochEnds, _ExchangingServer):
    """A transport, a center, a history sink and an epoch barrier (`EpochBarrier`); the
    server says what each epoch's end makes of the weights (`EpochEnds`).

    Args:
        model: The master `keras.Model` (its weights: the first center).
        num_workers: Workers that take part in every epoch's end.
        master_port: Port to listen on; 0 lets the OS pick a free one.
    """

    # Its commits are epoch ends, not the workers' exchanges: no commit rate to show.
    shows_commit_rate = False
    # A rejoining worker's pull says which epochs it redoes (an epoch may still end
    # between its handshake and its pull).
    supersede_on_retry = False

    def __init__(self, model, num_workers, master_port=0):
        _ExchangingServer.__init__(self, model, master_port)
        self.barrier = EpochBarrier(num_workers, self.transport, self.center, self.sink,
                                    self)

    # Every pull answers with the weights and the epochs done.
    pull_unless_own_handler = "handle_pull"

    num_workers = part_attribute("barrier", "num_workers")
    epochs_done = part_attribute("barrier", "epochs_done")
    stop_requested = part_attribute("barrier", "stop_requested")
    learning_rate = part_attribute("barrier", "learning_rate", writable=True)

    def handle_pull(self, conn, addr):
        """A worker joins or rejoins (`EpochBarrier.handle_pull`)."""
        self.barrier.handle_pull(conn, addr)

    def commit_action(self, conn, addr):
        """A worker's epoch end (`EpochBarrier.handle_commit`)."""
        self.center.commit_action(conn, addr, self.barrier.handle_commit)


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

    def average(self, entries):
        """The mean of the epoch's weights (in worker order) that trained on some rows."""
        trained = [weights for _, (weights, samples) in sorted(entries.items())
                   if samples > 0]
        return update_rules.average_weights(trained) if trained else None

    def end_epoch(self, epochs_done):
        """Runs ``on_average``; returns whether to stop."""
        if self.on_average is None:
            return False
        return self.on_average(epochs_done, self.center_variable)


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

    def epoch_entry(self, data, weights, samples):
        state = data.get(self.FIELD)
        if not (isinstance(state, np.ndarray) and state.dtype == object
                and len(state) == len(self.optimizer_state)):
            raise networking.ProtocolError(
                "An epoch's commit must carry the optimizer's state.")
        return weights, samples, state

    def average(self, entries):
        """The one worker's weights; its optimizer state is kept too."""
        ((weights, _, state),) = entries.values()
        self.optimizer_state = state
        return weights

    def end_epoch(self, epochs_done):
        if self.on_epoch_end is None:
            return False
        stop, state = self.on_epoch_end(epochs_done, self.center_variable,
                                        self.optimizer_state)
        if state is not None:
            self.optimizer_state = weights_array(state)
        return stop

    def reply_fields(self):
        return {self.FIELD: self.optimizer_state}
