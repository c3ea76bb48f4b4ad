"""Parameter servers: hold the center variable on the driver and apply workers' commits.

`SocketParameterServer` serves each worker connection on its own thread. A connection
starts with the run's token; then the worker sends one-byte actions (pull, commit, history,
quit). Subclasses define `handle_commit`; everything else is shared.

A server whose rule adds each commit to the center exactly as sent (``C += update``) sets
``commits_applied_as_sent``: a worker whose own commits are the only updates since its
last pull can then ask for the center "unless only mine changed it" and, when so, compute
it itself (``C_pull + update``, the same float32 additions), which saves sending the
weights back. That is every exchange of a lone worker.
"""

import errno
import logging
import secrets
import socket
import sys
import threading
import time

import numpy as np

from distkeras import algorithms
from distkeras import networking
from distkeras import update_rules
from distkeras.algorithms import ServerContext
from distkeras.networking import recv_data, send_data, weights_array

logger = logging.getLogger(__name__)

# accept() fails with these while the process (or the machine) is out of descriptors or
# buffers: the pending connection stays queued, and accepting can go on once some close.
_EXHAUSTED_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# accept() fails with these for one connection that the peer gave up on before it was taken.
_ABORTED_ERRNOS = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})


# Step record fields the server and the driver's monitor count with (`int()` of them):
# whole numbers, as a worker's `_record_step` writes them.
_INTEGRAL_HISTORY_FIELDS = frozenset({"worker_id", "iteration", "batch_size", "epoch"})


def _history_records(columns):
    """The step records of a history message's columns, checked as they arrive.

    A worker sends one list per field, one number (or None) per step, all as long; any
    other value used to fail in the handler (counted as a bug of the server's, which
    stops the run) or, once kept, in every later report's epoch count.

    Raises:
        ProtocolError: If the columns are not such lists.
    """
    from distkeras.step_history import history_records

    if not isinstance(columns, dict):
        raise networking.ProtocolError("A history message must carry a dict of columns.")
    for key, column in columns.items():
        integral = key in _INTEGRAL_HISTORY_FIELDS
        if not isinstance(column, list) or not all(
                value is None or (isinstance(value, int) and not isinstance(value, bool)
                                  if integral else isinstance(value, (int, float)))
                for value in column):
            raise networking.ProtocolError(
                f"History column {key!r} must be a list of "
                f"{'integers' if integral else 'numbers'} or None.")
    if len({len(column) for column in columns.values()}) > 1:
        raise networking.ProtocolError("A history message's columns differ in length.")
    return history_records(columns)


class RefusedUpdate(Exception):
    """A well-formed commit that is not applied (for example NaN or infinite values)."""


# Floating-point errors that make a rule's new center non-finite from finite operands: a
# float32 sum past 3.4e38 overflows to inf, and inf - inf or 0 * inf gives NaN. Raising
# costs nothing: numpy reads the FPU's flags after every ufunc anyway (to warn by default).
_NON_FINITE_ERRORS = {"over": "raise", "invalid": "raise"}


class ParameterServer:
    """Holds the center variable and the update counter.

    Args:
        model: The master `keras.Model`; its weights are the initial center variable.
        master_port: Port to listen on; 0 lets the OS pick a free one.
    """

    def __init__(self, model, master_port=0):
        self.model = model
        self.master_port = master_port
        self.center_variable = weights_array(model.get_weights())
        self.num_updates = 0
        self.mutex = threading.RLock()

    def start(self):
        """Starts serving."""

    def stop(self):
        """Stops serving."""

    def get_model(self):
        """Returns a copy of the master model holding the center variable."""
        from distkeras.utils import deserialize_model, serialize_model

        model = deserialize_model(serialize_model(self.model))
        with self.mutex:
            model.set_weights(list(self.center_variable))
        return model


class SocketParameterServer(ParameterServer):
    """A parameter server on a TCP socket, one thread per worker connection.

    Args:
        model: The master `keras.Model`.
        master_port: Port to listen on; 0 lets the OS pick a free one.
        host: Address to bind; the trainer sets the driver's address.
        handshake_timeout: Seconds a new connection has, in all, to present the token.
    """

    commits_applied_as_sent = False

    # Connections that have not presented the token yet each hold a thread until the
    # handshake deadline, and anyone who reaches the port can open thousands. Past this
    # many, the oldest is closed as each new one arrives (not the new one): a worker sends
    # its token as it connects, and it is read long before that many later connections
    # could push it out, so workers still join while a flood holds every place. Trainers
    # raise the cap to twice their workers (`expect_workers`), who may connect at once.
    MAX_PENDING_HANDSHAKES = 64

    # Whether the progress shows commits per second (the rate of the workers' exchanges).
    shows_commit_rate = True

    def __init__(self, model, master_port=0, host="127.0.0.1", handshake_timeout=30.0):
        super().__init__(model, master_port)
        self.host = host
        self.port = None
        self.token = secrets.token_hex(32)
        self.handshake_timeout = handshake_timeout
        self.max_pending_handshakes = self.MAX_PENDING_HANDSHAKES
        self.handshakes_closed = 0  # connections closed to make room (see above)
        self.weight_spec = [(weight.shape, weight.dtype) for weight in self.center_variable]
        model_bytes = sum(weight.nbytes for weight in self.center_variable)
        # Room for two copies of the weights (Experimental sends the delta and the center).
        self.max_frame_bytes = 2 * model_bytes + (1 << 20)
        self.history = []
        # The workers' reports of their metric state per epoch (`epoch_metrics.unpack`),
        # superseded with the records of the same steps.
        self.metric_states = []
        # Goes up each time records are marked ``superseded`` (a retried task's): a reader
        # that counted them counts again.
        self.history_generation = 0
        # worker id: [its latest task attempt id connected, how many came before it]
        self._attempts = {}
        self.finished_workers = set()  # ids of the workers that said goodbye
        # Set by `track_epochs`: (worker tasks, epochs); per worker, the latest epoch it
        # recorded a step of; the epochs ended; the center and the samples trained as each
        # ended, until taken.
        self._epoch_tracking = None
        self._trained_epochs = {}
        self._epochs_ended = 0
        self._epoch_ends = {}
        self.staleness = []
        self.errors = []
        self.worker_failures = []  # (worker id, error) that workers reported before failing
        self.on_worker_failure = None  # called with (worker id, error) as one arrives
        self.on_error = None  # called with the error of a handler (a bug) as it happens
        self.allow_nonfinite = False
        # Fields whose lists of arrays are not shaped like the weights (their own spec).
        self.field_specs = None
        # The workers' optimizer learning rate that the driver's callbacks set
        # (ReduceLROnPlateau, LearningRateScheduler): sent with every pull once set.
        self.optimizer_learning_rate = None
        self.refused = 0
        self.refused_by_worker = {}  # worker id: commits refused (NaN, ...)
        self._history_lock = threading.Lock()
        self._server_socket = None
        self._accept_thread = None
        self._connections = set()
        # Connections still in their handshake, oldest first (a dict: ordered, O(1) removal).
        self._pending = {}
        self._threads = set()
        self._running = False

    def expect_workers(self, count):
        """Leaves room for ``count`` workers in their handshake at once (twice that: see
        `MAX_PENDING_HANDSHAKES`)."""
        self.max_pending_handshakes = max(self.max_pending_handshakes, 2 * count)

    # -- life cycle --------------------------------------------------------------------

    def start(self):
        """Binds, listens and starts accepting workers in a background thread."""
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind((self.host, self.master_port))
        except OSError as error:
            server.close()
            raise OSError(
                f"The parameter server could not bind {self.host}:{self.master_port}: {error}. "
                "Use master_port=0 to let the OS pick a free port."
            ) from error
        server.listen(1024)
        self.port = server.getsockname()[1]
        self._server_socket = server
        self._running = True
        self._accept_thread = threading.Thread(
            target=self._accept_loop, name=f"distkeras-ps-{self.port}", daemon=True)
        self._accept_thread.start()
        logger.info("Parameter server %s listening on %s:%s",
                    type(self).__name__, self.host, self.port)

    # The most stop() waits, in all, for the connections' threads once it shut them down.
    STOP_JOIN_SECONDS = 10.0

    def stop(self, grace_seconds=1.0):
        """Stops accepting, ends every connection and joins the threads.

        Args:
            grace_seconds: How long connections may take to end on their own first, so
                what finished workers sent last (their final history) is still read.
        """
        self._running = False
        self._stop_accepting()
        if grace_seconds:
            self.wait_for_goodbyes(grace_seconds)
        self._end_connections()

    def _stop_accepting(self):
        """Ends the accept loop, then closes the listening socket.

        Shut down first and closed once the loop has ended: closed under a blocked
        accept(), its descriptor's number could go to the next server's listening socket
        (a trainer's next run), whose connections this loop would then take.
        """
        if self._server_socket is not None:
            networking.shutdown_socket(self._server_socket)  # wakes accept()
        if self._accept_thread is not None:
            # Once the accept loop has ended no connection can be added, so the snapshot
            # in `_end_connections` holds every one (none accepted during stop() is left).
            self._accept_thread.join(timeout=10)
        if self._server_socket is not None:
            self._server_socket.close()

    def _end_connections(self):
        """Shuts every connection down and waits for its thread, which closes it.

        Only shut down here: a handler may be between two reads of a frame, or reading
        the commits already buffered, and a socket closed under it leaves it reading or
        writing a descriptor whose number the OS may have given to a file opened since.
        Shut down, its next read or write ends at once.
        """
        with self._history_lock:
            connections = list(self._connections)
        for conn in connections:
            conn.shutdown()
        if not self.wait_for_goodbyes(self.STOP_JOIN_SECONDS):
            with self._history_lock:
                running = len(self._threads)
            logger.warning("%s connection threads of the parameter server on port %s did "
                           "not end within %s s of stop(); each closes its connection as "
                           "it ends.", running, self.port, self.STOP_JOIN_SECONDS)

    def finished(self):
        """The ids of the workers that said goodbye (a copy)."""
        with self._history_lock:
            return set(self.finished_workers)

    def history_snapshot(self):
        """The step records received so far (a copy)."""
        with self._history_lock:
            return list(self.history)

    def metric_states_snapshot(self):
        """The metric state reports received so far (a copy of the list)."""
        with self._history_lock:
            return list(self.metric_states)

    def wait_for_goodbyes(self, timeout):
        """Waits until every connection has ended (workers said goodbye), or ``timeout``.

        Returns:
            Whether every connection ended in time.
        """
        deadline = time.monotonic() + timeout
        with self._history_lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    ACCEPT_RETRY_SECONDS = 0.2  # the wait before accepting again once out of resources

    def _accept_loop(self):
        exhausted = False  # warned of the current shortage already
        while self._running:
            try:
                sock, addr = self._server_socket.accept()
            except OSError as error:
                if not self._running:
                    break  # the listening socket was closed by stop()
                if error.errno in _ABORTED_ERRNOS:
                    continue
                if error.errno not in _EXHAUSTED_ERRNOS:
                    logger.error("The parameter server on port %s stopped accepting "
                                 "workers: %s", self.port, error)
                    break
                # Out of descriptors (many connections, a low `ulimit -n`): ending the loop
                # would leave the port open but never answered, and every worker that
                # connects later would wait forever. Accept again once some have closed.
                if not exhausted:
                    self._warn_exhausted(error)
                exhausted = True
                time.sleep(self.ACCEPT_RETRY_SECONDS)
                continue
            exhausted = False
            self._start_connection(sock, addr)

    def _warn_exhausted(self, error):
        with self._history_lock:
            count = len(self._connections)
        logger.warning(
            "The parameter server on port %s cannot accept connections: %s (%s open). "
            "It accepts again once some close; if these are your workers, raise the "
            "driver's open files limit (ulimit -n).", self.port, error, count)

    def _start_connection(self, sock, addr):
        """Serves an accepted socket on its own thread; closes it if that cannot start."""
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as error:  # reset by the peer already
            logger.debug("Dropped connection from %s before serving it: %s", addr, error)
            networking.close_socket(sock)
            return
        conn = networking.Connection(sock, self.max_frame_bytes, self.weight_spec,
                                     self.field_specs)
        conn.addr, conn.evicted = addr, False
        thread = threading.Thread(target=self._serve, args=(conn, addr), daemon=True,
                                  name=f"distkeras-ps-conn-{addr[1]}")
        with self._history_lock:  # started under the lock: a listed thread can be joined
            self._make_room_for_handshake()
            try:
                thread.start()
            except RuntimeError as error:  # "can't start new thread": out of threads
                logger.warning("The parameter server refused a connection from %s: %s "
                               "(%s open).", addr, error, len(self._connections))
                conn.close()
                return
            self._connections.add(conn)
            self._pending[conn] = None
            self._threads.add(thread)

    def _make_room_for_handshake(self):
        """Closes the oldest connections still in their handshake until a new one fits
        within ``max_pending_handshakes``; call under the history lock."""
        while self._pending and len(self._pending) >= self.max_pending_handshakes:
            oldest = next(iter(self._pending))
            del self._pending[oldest]
            oldest.evicted = True
            # Only shut down: its own thread wakes from its read and closes the socket, so
            # no descriptor is closed under a thread still reading it.
            oldest.shutdown()
            self.handshakes_closed += 1
            log = logger.warning if self.handshakes_closed == 1 else logger.debug
            log("The parameter server on port %s has %s connections that have not sent "
                "the run's token; closed the oldest (from %s). Something other than this "
                "run's workers is connecting to the port.", self.port,
                self.max_pending_handshakes, oldest.addr)

    def _end_handshake(self, conn):
        """Takes an authenticated connection out of the handshake count.

        Raises:
            ConnectionError: If it was closed to make room before its token was read.
        """
        with self._history_lock:
            if conn.evicted:
                raise ConnectionError("closed to make room for newer connections before "
                                      "its token was read")
            self._pending.pop(conn, None)

    # -- one connection ------------------------------------------------------------------

    def _serve(self, conn, addr):
        conn.worker_id = -1
        conn.last_activity = time.monotonic()
        conn.last_pull_update = 0
        conn.own_updates = 0  # this connection's commits applied since its last pull
        conn.own_commits = 0  # ... and received (a refused one is not applied)
        conn.counted = False
        try:
            # The whole handshake, not each read: the token arrives in time or never.
            conn.set_deadline(self.handshake_timeout)
            # Before the token, a frame the size of the weights would be read into memory
            # for anyone who can reach the port: the hello is small.
            conn.max_frame_bytes = networking.HANDSHAKE_MAX_FRAME_BYTES
            hello = recv_data(conn)
            conn.worker_id = networking.check_token(hello, self.token)
            self._end_handshake(conn)
            conn.attempt = networking.hello_attempt(hello)
            conn.max_frame_bytes = self.max_frame_bytes
            self._join(conn)
            conn.set_deadline(None)
            self._dispatch(conn, addr)
        except (networking.ProtocolError, ConnectionError, OSError) as error:
            if self._running:
                # One of a flood, closed to make room: `_make_room_for_handshake` warned.
                log = logger.debug if conn.evicted else logger.warning
                log("Closed connection from %s (worker %s): %s", addr, conn.worker_id, error)
        except Exception as error:  # a bug in a handler: keep it for the trainer to report
            logger.exception("Parameter server handler failed for %s", addr)
            with self._history_lock:
                self.errors.append(f"{type(error).__name__}: {error}")
            if self.on_error is not None:
                self.on_error(self.errors[-1])
        finally:
            conn.close()
            with self._history_lock:
                self._connections.discard(conn)
                self._pending.pop(conn, None)
                self._threads.discard(threading.current_thread())

    def _join(self, conn):
        """Notes which Spark task attempt of its worker a new connection is. When Spark
        retried the worker's failed task, the new attempt trains the partition again: it
        is no longer finished, and the steps the earlier attempts recorded are superseded
        (their commits stay applied)."""
        conn.attempt_index = 0  # this worker's attempts in the order they connected
        with self.mutex, self._history_lock:
            latest = self._attempts.get(conn.worker_id)
            if latest is not None and conn.attempt <= latest[0]:
                conn.attempt_index = latest[1] if conn.attempt == latest[0] else 0
                return
            if latest is not None:
                conn.attempt_index = latest[1] + 1
            self._attempts[conn.worker_id] = [conn.attempt, conn.attempt_index]
            if latest is not None:
                logger.info("Worker %s is back as a new Spark task attempt; the steps of "
                            "its failed attempt are marked superseded.", conn.worker_id)
                self.finished_workers.discard(conn.worker_id)
                self._retried(conn)

    def _retried(self, conn):
        """A new attempt of ``conn``'s worker connected: what its earlier attempts recorded
        is redone. Call under ``self.mutex`` and the history lock."""
        self._supersede(conn.worker_id, lambda record: True)
        self._trained_epochs.pop(conn.worker_id, None)  # it trains from epoch 0 again

    # -- epoch ends ----------------------------------------------------------------------

    def track_epochs(self, num_tasks=None, num_epoch=None):
        """Keeps the center variable and the samples trained as each epoch ends, for
        `epoch_end` (None: stops and forgets the ones kept).

        An epoch ends when every worker (ids 0 to ``num_tasks - 1``) has recorded a step
        of a later epoch, or said goodbye, as `monitor.TrainingMonitor` decides; the last
        epoch is not counted (its end is the returned model). The driver's monitor sees
        the records a look later, and after a slow validation several epochs at once:
        the center it would read then holds the later epochs' training too.

        Args:
            num_tasks: The worker tasks of the run.
            num_epoch: Its epochs.
        """
        with self._history_lock:
            self._epoch_tracking = None if num_tasks is None else (num_tasks, num_epoch)
            self._trained_epochs, self._epochs_ended, self._epoch_ends = {}, 0, {}

    def epoch_end(self, epoch):
        """``(center, samples)`` as ``epoch`` (from 1) ended: the center variable, and the
        samples of the steps recorded then (the ones it holds), or None where they were
        not kept (see `track_epochs`); they are then forgotten, with those of the epochs
        before."""
        with self._history_lock:
            end = self._epoch_ends.pop(epoch, None)
            for earlier in [kept for kept in self._epoch_ends if kept < epoch]:
                del self._epoch_ends[earlier]
        return end

    def _note_epoch_records(self, worker_id, records):
        """Counts the epochs of a worker's new records (of its current attempt); call
        under the history lock."""
        epochs = [int(record["epoch"]) for record in records if "epoch" in record
                  and not record.get("superseded")]
        if self._epoch_tracking is None or not epochs:
            return
        self._trained_epochs[worker_id] = max(self._trained_epochs.get(worker_id, 0),
                                              max(epochs))
        self._note_epoch_ends()

    def _note_epoch_ends(self):
        """Keeps the center for each epoch that has just ended; call under the history
        lock, after the records or the goodbye that ended it (the commits before them are
        applied: a worker sends a window's records after its commit)."""
        if self._epoch_tracking is None:
            return
        num_tasks, num_epoch = self._epoch_tracking
        finished = min(num_epoch if worker in self.finished_workers
                       else self._trained_epochs.get(worker, 0)
                       for worker in range(num_tasks))
        ended = range(self._epochs_ended + 1, min(finished, num_epoch - 1) + 1)
        if not ended:
            return
        # The samples the center holds: a late worker's epoch may end well after the
        # others have trained on (the driver, looking later, would count those too).
        samples = sum(int(record.get("batch_size", 0)) for record in self.history
                      if not record.get("superseded"))
        # Handlers replace the center, never modify it in place: the reference is the
        # center as it is now, and pins one copy of the weights until taken.
        for epoch in ended:
            self._epoch_ends[epoch] = (self.center_variable, samples)
            self._epochs_ended = epoch

    def _supersede(self, worker_id, redone):
        """Marks ``worker_id``'s records for which ``redone(record)`` holds as
        ``superseded`` (with the ``attempt`` that made them, 0 for the first); call under
        the history lock."""
        marked = False
        for report in self.metric_states:
            if report["worker_id"] == worker_id and redone(report):
                report["superseded"] = True
        for record in self.history:
            if record.get("worker_id") == worker_id and not record.get("superseded") \
                    and redone(record):
                record["superseded"] = True
                record.setdefault("attempt", 0)
                marked = True
        if marked:
            self.history_generation += 1

    def idle_workers(self, limit, startup_limit=None):
        """Open connections silent for more than ``limit`` seconds: ``[(worker_id, idle)]``.

        Args:
            limit: Seconds a connection that has reported a step (committed or sent its
                history) may stay silent.
            startup_limit: Seconds a connection may stay silent before its first step
                report, and after it said it compiles a step (`ACTION_COMPILING`) until
                its next report (default: ``limit``). A worker pulls the center before
                its first step, then compiles that step and reads its partition's first
                rows; a short last batch compiles again: seconds on a busy executor,
                which are not a stall.
        """
        startup_limit = limit if startup_limit is None else startup_limit
        now = time.monotonic()
        with self._history_lock:
            connections = list(self._connections)
        idle = []
        for conn in connections:
            if not getattr(conn, "authenticated", False):
                continue
            allowed = limit if getattr(conn, "stepped", False) else startup_limit
            if now - conn.last_activity > allowed:
                idle.append((getattr(conn, "worker_id", -1), now - conn.last_activity))
        return idle

    def _dispatch(self, conn, addr):
        conn.authenticated = True
        # Until its first commit or history, and again while it compiles a step: see
        # `idle_workers`.
        conn.stepped = False
        while True:
            conn.last_activity = time.monotonic()
            action = networking.recv_action(conn)
            # The silence ends as the action arrives, and before `stepped` says a worker
            # that steps: else the monitor could read a compile's silence against
            # worker_timeout while a report's payload is read.
            conn.last_activity = time.monotonic()
            if action in (networking.ACTION_COMMIT, networking.ACTION_HISTORY):
                conn.stepped = True
            elif action == networking.ACTION_COMPILING:
                conn.stepped = False  # start-up's allowance until its next report
                continue
            if action == networking.ACTION_PULL:
                self.handle_pull(conn, addr)
            elif action == networking.ACTION_PULL_UNLESS_OWN:
                self.handle_pull_unless_own(conn, addr)
            elif action == networking.ACTION_COMMIT:
                conn.counted = False
                conn.own_commits += 1
                try:
                    self.handle_commit(conn, addr)
                except RefusedUpdate as refusal:
                    with self._history_lock:
                        self.refused += 1
                        self.refused_by_worker[conn.worker_id] = \
                            self.refused_by_worker.get(conn.worker_id, 0) + 1
                    logger.warning("Refused a commit from worker %s (%s): %s",
                                   conn.worker_id, addr, refusal)
                    continue
                if not conn.counted:  # a custom handler that does not count its updates
                    with self.mutex:
                        self.next_update(conn)
            elif action == networking.ACTION_HISTORY:
                self.handle_history(conn, addr)
            elif action == networking.ACTION_FAILURE:
                self.handle_failure(conn, addr)
                return
            elif action == networking.ACTION_QUIT:
                with self._history_lock:  # after its last history: its records are all in
                    self.finished_workers.add(conn.worker_id)
                    self._note_epoch_ends()
                return
            elif action == b"":
                return
            else:
                raise networking.ProtocolError(f"Unknown action {action!r}.")

    # -- handlers ---------------------------------------------------------------------

    def next_update(self, conn):
        """Counts one applied commit and records its staleness. Call under ``self.mutex``.

        Staleness is the number of updates by others since this worker's last pull.
        """
        self.staleness.append((conn.worker_id, self.num_updates - conn.last_pull_update))
        self.num_updates += 1
        conn.own_updates += 1
        conn.counted = True

    def model_update(self, update):
        """Checks that a commit's update is a list of arrays, one per layer.

        Lists of arrays were checked against the model's shapes and dtypes as they arrived;
        a single array or a number would broadcast into every layer (and could change their
        dtype), so they are refused.

        Raises:
            ProtocolError: If the update is not a list of arrays shaped like the model.
            RefusedUpdate: If it holds NaN or infinite values (unless ``allow_nonfinite``):
                the commit is dropped with a warning, the connection stays open.
        """
        if not (isinstance(update, np.ndarray) and update.dtype == object
                and len(update) == len(self.weight_spec)):
            raise networking.ProtocolError(
                "A commit must carry a list of arrays shaped like the model's weights.")
        if not self.allow_nonfinite and not all(np.isfinite(layer).all() for layer in update):
            raise RefusedUpdate("it holds NaN or infinite values")
        return update

    def apply_rule(self, rule, *args):
        """Replaces the center with ``rule(center, *args)``; call under ``self.mutex``.

        A finite update can still make the center infinite (3e38 added to a center near
        3e38 in float32), and every worker would pull that center from then on: such an
        update is refused as a non-finite one is, and the center stays as it was (rules
        return a new center, they never modify it in place).

        Args:
            rule: An `update_rules` function of the center and ``args``.
            *args: The rule's other arguments (the commit's update, ...).

        Raises:
            RefusedUpdate: If the rule's arithmetic overflowed or gave NaN (unless
                ``allow_nonfinite``).
        """
        if self.allow_nonfinite:
            self.center_variable = rule(self.center_variable, *args)
            return
        try:
            with np.errstate(**_NON_FINITE_ERRORS):
                center = rule(self.center_variable, *args)
        except FloatingPointError as error:
            raise RefusedUpdate(f"applying it would make the center non-finite ({error})") \
                from None
        self.center_variable = center

    def handle_pull(self, conn, addr):
        """Sends the center variable and the update count read under one lock."""
        with self.mutex:
            # Handlers replace the center variable, never modify it in place, so this
            # reference stays a consistent snapshot after the lock is released.
            center = self.center_variable
            num_updates = self.num_updates
            conn.last_pull_update = num_updates
            conn.own_updates = conn.own_commits = 0
        send_data(conn, self._pull_reply(center=center, num_updates=num_updates))

    def _pull_reply(self, **fields):
        """A pull's reply: ``fields``, and the workers' learning rate once the driver set
        one."""
        if self.optimizer_learning_rate is not None:
            fields["optimizer_learning_rate"] = float(self.optimizer_learning_rate)
        return fields

    def handle_pull_unless_own(self, conn, addr):
        """Like `handle_pull`, but answers ``{"unchanged": True}`` without the weights when
        the center moved only by this connection's commits since its last pull, every one
        of them applied (servers with ``commits_applied_as_sent`` only)."""
        with self.mutex:
            num_updates = self.num_updates
            only_own = (self._commits_applied_as_sent()
                        and num_updates - conn.last_pull_update == conn.own_updates
                        and conn.own_updates == conn.own_commits)
            if only_own:
                conn.last_pull_update = num_updates
                conn.own_updates = conn.own_commits = 0
        if only_own:
            send_data(conn, self._pull_reply(unchanged=True, num_updates=num_updates))
        else:
            self.handle_pull(conn, addr)

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

    def handle_history(self, conn, addr):
        """Receives a worker's per-step records."""
        data = recv_data(conn)
        from distkeras.epoch_metrics import unpack

        # Both checked before anything is kept: a malformed report closes the connection
        # and leaves the history as it was.
        records = _history_records(data.get("history"))
        reports = unpack(data, conn.worker_id)
        attempt = getattr(conn, "attempt", 0)
        index = getattr(conn, "attempt_index", 0)
        with self._history_lock:
            # A failed attempt that still reports (speculation, a slow goodbye) has been
            # replaced already: its steps count as superseded at once.
            latest = self._attempts.get(conn.worker_id)
            stale = latest is not None and attempt < latest[0]
            for record in records:
                if index or stale:  # only a retried worker's records name their attempt
                    record["attempt"] = index
                if stale:
                    record["superseded"] = True
            for report in reports:
                report["superseded"] = stale
            # Before the records: a reader that sees them sees the state of their steps.
            self.metric_states.extend(reports)
            self.history.extend(records)
            self._note_epoch_records(conn.worker_id, records)


    MAX_FAILURE_CHARS = 4000

    def handle_failure(self, conn, addr):
        """Receives the error that stops a worker (text, shown to the user, never run);
        keeps it and calls ``on_worker_failure``."""
        data = recv_data(conn)
        error = str(data.get("error", "an error it did not describe"))[:self.MAX_FAILURE_CHARS]
        with self._history_lock:
            self.worker_failures.append((conn.worker_id, error))
        if self.on_worker_failure is not None:
            self.on_worker_failure(conn.worker_id, error)


class HistoryServer(SocketParameterServer):
    """Takes the step records of workers that exchange no weights (SingleTrainer's), so the
    driver shows their progress as it does for the parameter-server trainers. Refuses
    pulls and commits."""

    def _refuse(self, conn, addr):
        raise networking.ProtocolError("This server takes progress reports only.")

    handle_pull = handle_pull_unless_own = handle_commit = _refuse


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
