"""The socket transport of a server: accept, handshake, eviction, one thread per
connection, and the dispatch of each action to the handler that serves it.

A connection starts with the run's token (compared in constant time); then the worker
sends one-byte actions. `SocketTransport` knows no model: the server that holds it says
which actions it serves (`action_handlers`) and how large a frame may be, and any other
action closes the connection. A frame is read into memory only up to the server's
``max_frame_bytes`` (a small limit until the token is in).
"""

import errno
import logging
import secrets
import socket
import threading
import time

from distkeras.transport import networking
from distkeras.transport.networking import recv_data

logger = logging.getLogger(__name__)

# accept() fails with these while the process (or the machine) is out of descriptors or
# buffers: the pending connection stays queued, and accepting can go on once some close.
_EXHAUSTED_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
# accept() fails with these for one connection that the peer gave up on before it was taken.
_ABORTED_ERRNOS = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})


class Listener:
    """Binds a TCP port and hands each connection it accepts to `_start_connection`.

    Args:
        master_port: Port to listen on; 0 lets the OS pick a free one.
        host: Address to bind.

    Notes:
        Subclasses define `_start_connection(sock, addr)` and `_warn_exhausted(error)`
        (accept() failed for want of descriptors; it goes on once some close).
    """

    def __init__(self, master_port=0, host="127.0.0.1"):
        self.master_port = master_port
        self.host = host
        self.name = type(self).__name__  # in the log, with the port
        self.port = None
        self._server_socket = None
        self._accept_thread = None
        self._running = False

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
                    self.name, self.host, self.port)

    # The most stop() waits, in all, for the connections' threads once it shut them down.
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


class SocketTransport(Listener):
    """Accepts workers on a TCP socket and serves each connection on its own thread.

    Args:
        master_port: Port to listen on; 0 lets the OS pick a free one.
        host: Address to bind; the trainer sets the driver's address.
        handshake_timeout: Seconds a new connection has, in all, to present the token.
        server: What serves the actions: its `action_handlers` (the handlers
            themselves), `prepare_connection`, `joined` and `frame_limits`, read as each
            connection starts. None: this object itself (a subclass that defines them).

    Notes:
        ``lock`` guards the connections and the errors; a server's parts share it for
        what they keep (the history sink's records).
    """

    # Connections that have not presented the token yet each hold a thread until the
    # handshake deadline, and anyone who reaches the port can open thousands. Past this
    # many, the oldest is closed as each new one arrives (not the new one): a worker sends
    # its token as it connects, and it is read long before that many later connections
    # could push it out, so workers still join while a flood holds every place. Trainers
    # raise the cap to twice their workers (`expect_workers`), who may connect at once.
    MAX_PENDING_HANDSHAKES = 64

    def __init__(self, master_port=0, host="127.0.0.1", handshake_timeout=30.0, server=None):
        Listener.__init__(self, master_port, host)
        self.server = self if server is None else server
        self.name = type(self.server).__name__
        self.token = secrets.token_hex(32)
        self.handshake_timeout = handshake_timeout
        self.max_pending_handshakes = self.MAX_PENDING_HANDSHAKES
        self.handshakes_closed = 0  # connections closed to make room (see above)
        self.max_frame_bytes = 1 << 20
        self.weight_spec = None  # the shapes and dtypes of lists of arrays, when known
        # Fields whose lists of arrays are not shaped like the weights (their own spec).
        self.field_specs = None
        self.errors = []
        self.on_error = None  # called with the error of a handler (a bug) as it happens
        self.lock = threading.Lock()
        self._connections = set()
        # Connections still in their handshake, oldest first (a dict: ordered, O(1) removal).
        self._pending = {}
        self._threads = set()

    @property
    def running(self):
        """Whether it accepts and serves connections (from `start` until `stop`)."""
        return self._running

    def action_handlers(self):
        """``{action: (handler(conn, addr), whether the connection ends after it)}``: the
        actions this transport serves when it is its own server (see ``server``)."""
        return {}

    def frame_limits(self):
        """``(max_frame_bytes, weight_spec, field_specs)`` of an authenticated connection,
        when it is its own server."""
        return self.max_frame_bytes, self.weight_spec, self.field_specs

    def prepare_connection(self, conn):
        """Sets a new connection's own state (the center's per-worker counts)."""

    def joined(self, conn):
        """Called once ``conn`` presented the token (``conn.worker_id``, ``conn.attempt``)."""

    def expect_workers(self, count):
        """Leaves room for ``count`` workers in their handshake at once (twice that: see
        `MAX_PENDING_HANDSHAKES`)."""
        self.max_pending_handshakes = max(self.max_pending_handshakes, 2 * count)


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

    def _end_connections(self):
        """Shuts every connection down and waits for its thread, which closes it.

        Only shut down here: a handler may be between two reads of a frame, or reading
        the commits already buffered, and a socket closed under it leaves it reading or
        writing a descriptor whose number the OS may have given to a file opened since.
        Shut down, its next read or write ends at once.
        """
        with self.lock:
            connections = list(self._connections)
        for conn in connections:
            conn.shutdown()
        if not self.wait_for_goodbyes(self.STOP_JOIN_SECONDS):
            with self.lock:
                running = len(self._threads)
            logger.warning("%s connection threads of the parameter server on port %s did "
                           "not end within %s s of stop(); each closes its connection as "
                           "it ends.", running, self.port, self.STOP_JOIN_SECONDS)

    def wait_for_goodbyes(self, timeout):
        """Waits until every connection has ended (workers said goodbye), or ``timeout``.

        Returns:
            Whether every connection ended in time.
        """
        deadline = time.monotonic() + timeout
        with self.lock:
            threads = list(self._threads)
        for thread in threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in threads)

    def _warn_exhausted(self, error):
        with self.lock:
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
        conn = networking.Connection(sock, *self.server.frame_limits())
        conn.addr, conn.evicted = addr, False
        thread = threading.Thread(target=self._serve, args=(conn, addr), daemon=True,
                                  name=f"distkeras-ps-conn-{addr[1]}")
        with self.lock:  # started under the lock: a listed thread can be joined
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
        within ``max_pending_handshakes``; call under ``lock``."""
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
        with self.lock:
            if conn.evicted:
                raise ConnectionError("closed to make room for newer connections before "
                                      "its token was read")
            self._pending.pop(conn, None)

    # -- one connection ------------------------------------------------------------------

    def _serve(self, conn, addr):
        conn.worker_id = -1
        conn.last_activity = time.monotonic()
        self.server.prepare_connection(conn)
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
            conn.max_frame_bytes = self.server.frame_limits()[0]
            self.server.joined(conn)
            conn.set_deadline(None)
            self._dispatch(conn, addr)
        except (networking.ProtocolError, ConnectionError, OSError) as error:
            if self._running:
                # One of a flood, closed to make room: `_make_room_for_handshake` warned.
                log = logger.debug if conn.evicted else logger.warning
                log("Closed connection from %s (worker %s): %s", addr, conn.worker_id, error)
        except Exception as error:  # a bug in a handler: keep it for the trainer to report
            logger.exception("Parameter server handler failed for %s", addr)
            with self.lock:
                self.errors.append(f"{type(error).__name__}: {error}")
            if self.on_error is not None:
                self.on_error(self.errors[-1])
        finally:
            conn.close()
            with self.lock:
                self._connections.discard(conn)
                self._pending.pop(conn, None)
                self._threads.discard(threading.current_thread())

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
        with self.lock:
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
        handlers = self.server.action_handlers()
        while True:
            conn.last_activity = time.monotonic()
            action = networking.recv_action(conn)
            # The silence ends as the action arrives, and before `stepped` says a worker
            # that steps: else the monitor could read a compile's silence against
            # worker_timeout while a report's payload is read.
            conn.last_activity = time.monotonic()
            if action == b"":
                return
            if action == networking.ACTION_COMPILING:
                conn.stepped = False  # start-up's allowance until its next report
                continue
            if action not in handlers:
                raise networking.ProtocolError(
                    f"Unknown action {action!r} (this {type(self.server).__name__} takes "
                    f"{sorted(handlers)}).")
            if action in (networking.ACTION_COMMIT, networking.ACTION_HISTORY):
                conn.stepped = True
            handler, ends = handlers[action]
            handler(conn, addr)
            if ends:
                return
