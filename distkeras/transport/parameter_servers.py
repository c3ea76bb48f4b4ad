"""Parameter servers: hold the center variable on the driver and apply workers' commits.

A server holds its parts and hands each its share of the work, with no layer between:
the transport (``transport``, a `socket_transport.SocketTransport`: accept, handshake,
eviction, one thread per connection), the center (``center``, a `center.CenterExchange`:
the weights, their lock, the update count, the pull and the checks of a commit), the
history sink (``sink``, a `history_sink.HistorySink`: step records, task retries, epoch
ends) and, for the built-in rules, the ``algorithm`` (an `Algorithm`). The transport
calls the handlers of the server's `action_handlers` table directly: a commit goes from
the connection's thread to `SocketParameterServer.commit_action`, the server's
`handle_commit` and the algorithm's `apply`.

Seed 000's names stay on the server itself (``center_variable``, ``mutex``,
``num_updates``; ``port``, ``token`` and ``history``, which every trainer reads); the rest
is read from the part that holds it (``server.transport.errors``,
``server.sink.worker_failures``, ``server.center.staleness``, ...). The servers whose
commits are epoch ends (an epoch barrier's) are in `epoch_servers`.
"""

import logging

from distkeras import algorithms
from distkeras.algorithms import ServerContext
from distkeras.algorithms import update_rules
from distkeras.transport import center_writes
from distkeras.transport import compression as codecs
from distkeras.transport import networking
from distkeras.transport.center import (CenterExchange, CenterVariable, RefusedUpdate,
                                        refusing_nonfinite)
from distkeras.transport.center_writes import CenterWrites
from distkeras.keras_io.archives import deserialize_model, serialize_model
from distkeras.transport.history_sink import HistorySink
from distkeras.transport.networking import recv_data
from distkeras.transport.socket_transport import SocketTransport

__all__ = ["RefusedUpdate", "ParameterServer", "SocketParameterServer", "HistoryServer",
           "AlgorithmServer", "DeltaParameterServer", "ADAGParameterServer",
           "DynSGDParameterServer", "ExperimentalParameterServer"]

logger = logging.getLogger(__name__)


def _part_property(part, name, writable=False):
    """The property ``name`` of the part the server holds at ``part`` (seed 000's names)."""
    def get(server):
        return getattr(getattr(server, part), name)

    def set_(server, value):
        setattr(getattr(server, part), name, value)

    return property(get, set_ if writable else None,
                    doc=f"The ``{name}`` of the server's ``{part}``.")


class ParameterServer:
    """A server on a TCP socket: a transport, a center and a history sink.

    It serves the workers' step records, failures and goodbyes; its subclasses add the
    exchanges of weights (`SocketParameterServer`).

    Args:
        model: The master `keras.Model`; its weights are the first center variable.
        master_port: Port to listen on; 0 lets the OS pick a free one.
        host: Address to bind; the trainer sets the driver's address
            (``server.transport.host``).
        handshake_timeout: Seconds a new connection has, in all, to present the token.
    """

    # The center part: the weights and their lock, or with the pull and commit protocol.
    center_class = CenterVariable
    # Whether the progress shows commits per second (the rate of the workers' exchanges).
    shows_commit_rate = True
    supersede_on_retry = True  # see `HistorySink`
    MAX_PENDING_HANDSHAKES = SocketTransport.MAX_PENDING_HANDSHAKES
    # Fields whose lists of arrays are not shaped like the weights (their own spec).
    field_specs = None

    def __init__(self, model, master_port=0, host="127.0.0.1", handshake_timeout=30.0):
        self.center = self.center_class(model)
        self.transport = SocketTransport(master_port, host, handshake_timeout, server=self)
        self.sink = HistorySink(self.transport.lock, self.center, self.supersede_on_retry)
        self.shards = None  # a sharded center's other shards (`server_shards`)

    # Seed 000's names, and what every trainer reads: the only properties of a server.
    mutex = _part_property("center", "mutex")
    num_updates = _part_property("center", "num_updates", writable=True)
    port = _part_property("transport", "port")
    token = _part_property("transport", "token")
    history = _part_property("sink", "history")

    @property
    def center_variable(self):
        """The center's weights (a sharded center's: gathered from every shard)."""
        own = self.center.center_variable
        return own if self.shards is None else self.shards.gather(own)

    @center_variable.setter
    def center_variable(self, weights):
        self.center.center_variable = weights if self.shards is None else \
            self.shards.scatter(weights)

    def start(self):
        """Binds, listens and serves workers in background threads (and other shards)."""
        self.transport.start()
        if self.shards is not None:
            try:
                self.shards.start(self.transport, self.center.num_updates)
            except BaseException:
                self.stop(0.0)
                raise

    def stop(self, grace_seconds=1.0):
        """Stops serving (`SocketTransport.stop`), and the other shards."""
        self.transport.stop(grace_seconds)
        if self.shards is not None:
            self.transport.errors.extend(self.shards.stop(grace_seconds))

    def get_model(self):
        """Returns a copy of the master model holding the center variable."""
        if self.shards is None:
            return self.center.get_model()
        model = deserialize_model(serialize_model(self.shards.model))
        model.set_weights(list(self.center_variable))
        return model

    # -- what the transport asks of its server ---------------------------------------------

    def action_handlers(self):
        """``{action: (handler(conn, addr), whether the connection ends after it)}``: what
        the transport serves; read as each connection starts."""
        sink = self.sink
        return {networking.ACTION_HISTORY: (sink.handle_history, False),
                networking.ACTION_FAILURE: (sink.handle_failure, True),
                networking.ACTION_QUIT: (sink.handle_goodbye, True)}

    def frame_limits(self):
        """``(max_frame_bytes, weight_spec, field_specs)`` of an authenticated connection."""
        return self.center.max_frame_bytes, self.center.weight_spec, self.field_specs

    def prepare_connection(self, conn):
        """Sets a new connection's own state, before its handshake."""

    def joined(self, conn):
        """Called once ``conn`` presented the token: the sink notes its task attempt."""
        self.sink.joined(conn)


class HistoryServer(ParameterServer):
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


class SocketParameterServer(ParameterServer):
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

    center_class = CenterExchange
    # Whether its `handle_commit` adds each commit to the center exactly as sent (see
    # `center`); counted only where the class that defines `handle_commit` declares it.
    commits_applied_as_sent = False

    def action_handlers(self):
        return {networking.ACTION_PULL: (self.handle_pull, False),
                networking.ACTION_PULL_UNLESS_OWN: (self.handle_pull_unless_own, False),
                networking.ACTION_COMMIT: (self.commit_action, False),
                **super().action_handlers()}

    def prepare_connection(self, conn):
        self.center.prepare_connection(conn)

    # -- the extension API's (docs/writing-an-algorithm.md) --------------------------------

    def model_update(self, update):
        """Checks a commit's update (`CenterExchange.model_update`) and returns it."""
        return self.center.model_update(update)

    def next_update(self, conn):
        """Counts one applied commit and its staleness; call under ``mutex``."""
        self.center.next_update(conn)

    def apply_rule(self, rule, *args):
        """Replaces the center with ``rule(center, *args)``; call under ``mutex``.

        A finite update can still make the center infinite (3e38 added to a center near
        3e38 in float32), and every worker would pull that center from then on: such an
        update is refused as a non-finite one is, and the center stays as it was (rules
        return a new center, they never modify it in place).

        Raises:
            RefusedUpdate: If the rule's arithmetic overflowed or gave NaN (unless the
                center's ``allow_nonfinite``).
        """
        center = self.center
        with refusing_nonfinite(center.allow_nonfinite):
            new_center = rule(center.center_variable, *args)
        center.center_variable = new_center

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
        """Serves one commit: `handle_commit` (the rule), then counts it if the handler did
        not; a `RefusedUpdate` is counted and logged, and the connection stays open."""
        conn.counted = False
        conn.own_commits += 1
        center = self.center
        try:
            self.handle_commit(conn, addr)
        except RefusedUpdate as refusal:
            with center.mutex:
                center.refused += 1
                center.refused_by_worker[conn.worker_id] = \
                    center.refused_by_worker.get(conn.worker_id, 0) + 1
            logger.warning("Refused a commit from worker %s (%s): %s",
                           conn.worker_id, addr, refusal)
            return
        if not conn.counted:  # a custom handler that does not count its updates
            with center.mutex:
                center.next_update(conn)

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


class AlgorithmServer(SocketParameterServer):
    """The center variable of an `Algorithm`: each commit, checked, goes to its `apply`.

    The framework's part: the commit's arrays are checked (shapes, finite values), the
    update count and the commit's staleness kept, a new center that would be non-finite
    refused. An algorithm that adds commits as sent (``C += update``) is served by
    `apply_rule` with `update_rules.add_update`, or with ``reuse_buffers`` without new
    memory per commit; its compressed commits are added from their compressed form.
    Both by the server's ``writes`` (`center_writes.CenterWrites`).

    Args:
        model: The master `keras.Model`; its weights are the first center.
        master_port: Port to listen on; 0 lets the OS pick a free one.
        host: Address to bind; the trainer sets the driver's address.
        handshake_timeout: Seconds a new connection has, in all, to present the token.
        reuse_buffers: Opt-in, for algorithms that add commits as sent. Read each
            connection's commits into one buffer it keeps, and write each new center into
            the center before last when nothing holds that one any more (else into new
            memory). The centers are the same, bit for bit: only where the bytes live
            changes.
        algorithm: The `Algorithm`; None: the class's ``algorithm_class()``.
        compression: None, ``"bfloat16"`` or ``"topk"`` (``"topk:F"``): what the workers'
            commits and the pulls carry (`compression.parse`); the center stays float32.

    Raises:
        ValueError: If ``reuse_buffers`` is not a bool, ``compression`` is not one of
            those, or cannot serve this model, rule or class (`compression.check_server`).

    Notes:
        ``reuse_buffers``: for a large model, most of the server's CPU per commit and pull
        is the kernel mapping and zeroing fresh pages for the commit read and the new
        center. The cost: one model's bytes more per connection and one more center. See
        docs/scaling.md (measured by benchmarks/ps_capacity.py).
    """

    algorithm_class = None
    # The field of a commit that holds the update (ADAG's server also reads "residual").
    commit_field = "delta"

    def __init__(self, model, master_port=0, host="127.0.0.1", handshake_timeout=30.0,
                 reuse_buffers=False, algorithm=None, compression=None):
        super().__init__(model, master_port, host, handshake_timeout)
        if not isinstance(reuse_buffers, bool):
            raise ValueError("`reuse_buffers` must be True or False. Received: "
                             f"reuse_buffers={reuse_buffers!r}")
        self.reuse_buffers = reuse_buffers
        self.writes = CenterWrites(self.center)  # adds into the spare center, or in place
        self.algorithm = self.algorithm_class() if algorithm is None else algorithm
        # Non-trainable weights (BatchNormalization's statistics): see `update_rules`.
        self.trainable = update_rules.trainable_flags(model)
        self.algorithm_state = {}  # the algorithm's own (`ServerContext.state`)
        self.compression = codecs.parse(compression)
        # A subclass's own handle_commit (the escape hatch) reads float32 commits.
        codecs.check_server(self.compression, self.algorithm, self.center.weight_spec,
                            type(self).handle_commit is not AlgorithmServer.handle_commit,
                            type(self).__name__)
        self.field_specs = codecs.field_specs(self.compression, self.center.weight_spec)
        self.center.compress(self.compression, self.algorithm.adds_commits_as_sent)

    def action_handlers(self):
        handlers = super().action_handlers()
        if self.center.sparse_log is not None:  # top-k: a pull of the center itself
            handlers[networking.ACTION_PULL_CENTER] = (self.handle_pull_center, False)
        return handlers

    def handle_pull_center(self, conn, addr):
        """Like `handle_pull`, but always with the center, never a sparse reply."""
        self.center.handle_pull(conn, addr, sparse_allowed=False)

    def handle_commit(self, conn, addr):
        """Receives one commit, checks it and applies it with the algorithm."""
        algorithm, center = self.algorithm, self.center
        if self.compression is not None:
            data, update = self._compressed_commit(conn)
            if update is None:  # added as sent
                return
        elif algorithm.adds_commits_as_sent:
            data = recv_data(conn, reuse_body=self.reuse_buffers)
            field = self.commit_field
            update = center.model_update(data[field] if field in data else data.get("delta"))
            with center.mutex:
                self.apply_rule(self.writes.add_into_spare if self.reuse_buffers
                                else update_rules.add_update, update)
                center.next_update(conn)
            return
        else:
            data = recv_data(conn)
            update = center.model_update(data.get(self.commit_field))
        pulled = center.model_update(data.get("center")) if algorithm.sends_pulled else None
        last_update = data.get("last_update")
        if algorithm.uses_staleness and (isinstance(last_update, bool)
                                         or not isinstance(last_update, int)):
            raise networking.ProtocolError(
                f"A {type(algorithm).__name__} commit must carry its last_update.")
        with center.mutex:
            num_updates = center.num_updates
            if algorithm.uses_staleness:
                # A worker cannot have seen more updates than were made; clamp a lying count.
                seen = min(max(last_update, 0), num_updates)
            else:
                seen = conn.last_pull_update
            context = ServerContext(num_updates - seen, pulled, self.trainable,
                                    self.algorithm_state, num_updates)
            with refusing_nonfinite(center.allow_nonfinite):
                new_center = algorithm.apply(center.center_variable, update, context)
            center.center_variable = new_center
            center.next_update(conn)

    def _compressed_commit(self, conn):
        """Reads a compressed commit (`center_writes.read_finite`) and adds it from its
        compressed form where the rule adds commits as sent (`center_writes`).

        Returns:
            ``(message, None)`` once added, else ``(message, the float32 update)`` for
            the algorithm's `apply`.
        """
        center, compression = self.center, self.compression
        # Applied (copied out) before this connection reads its next frame.
        data = recv_data(conn, reuse_body=True)
        payload = center_writes.read_finite(data, compression, center)
        if not self.algorithm.adds_commits_as_sent:
            return data, center.model_update(
                codecs.dense(compression, payload, center.weight_spec))
        with center.mutex:
            if compression.kind == codecs.TOPK:
                self.writes.add_sparse(*payload)
                center.log_sparse(conn, *payload)
            else:
                self.writes.add_bfloat16(payload)
            center.next_update(conn)
        return data, None

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
