"""Punchcard's HTTP front: waitress, made to survive slow and hostile clients.

Plain waitress buffers a request's whole body (to temporary files past 512 KiB) before the
application sees its headers, keeps a connection for as long as it sends a byte every
``channel_timeout`` seconds, and stops accepting at ``connection_limit``: 100 clients
trickling header lines locked every other client out, and unauthenticated uploads filled
the disk. Here:

- the secret is checked when the headers arrive: a submission with an unknown secret is
  refused before its body is read (a small body is read and dropped, so the client reads
  the 403; a larger one closes the connection), and each route has its own body limit;
- a request's headers must arrive whole within ``header_timeout`` seconds of its first
  byte (or of the connection's last activity), and its body at ``min_upload_rate`` bytes
  a second at least: a trickling client is dropped, whatever it sends;
- at ``connection_limit`` connections a new one is still accepted, and the oldest
  connection that has not sent its headers yet is closed for it: tricklers evict each
  other, while a client that sends its headers at once is served.
"""

import json
import logging
import time

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.receiver import FixedStreamReceiver
from waitress.server import TcpWSGIServer
from waitress.utilities import Error

logger = logging.getLogger(__name__)

SUBMIT_PATH = "/api/submit"
# The body of any other route (they take none), and the unauthenticated body read and
# dropped so that its client reads the 403 rather than a reset connection.
SMALL_BODY_BYTES = 64 << 10
DRAINED_BODY_BYTES = 1 << 20


class Refused(Error):
    """A refusal sent from the front, as the application's JSON errors are."""

    def __init__(self, code, reason, message):
        super().__init__(message)
        self.code, self.reason = code, reason

    def to_response(self, ident=None):
        body = json.dumps({"error": self.body}).encode("utf-8")
        return (f"{self.code} {self.reason}",
                [("Content-Type", "application/json")], body)


class _Discarded:
    """A body buffer that keeps nothing (an unauthenticated submission's body)."""

    def __init__(self):
        self.length = 0

    def append(self, data):
        self.length += len(data)

    def __len__(self):
        return 0

    def getfile(self):
        import io

        return io.BytesIO()

    def close(self):
        pass


class _Parser(HTTPRequestParser):
    """Checks the route's body limit and the secret as soon as the headers are parsed."""

    identify = None  # set on the subclass `make_front` makes: secret -> identity or None
    secret_header = None  # its name as waitress keeps it (X_PUNCHCARD_SECRET)
    max_submit_bytes = 0
    audit = None  # a function of (identity or None, path, status, message), or None

    def __init__(self, adj):
        super().__init__(adj)
        self.started = time.time()
        self.headers_done = None

    def parse_header(self, header_plus):
        super().parse_header(header_plus)
        self.headers_done = time.time()
        if self.chunked:  # its length unknown until it is read: every client sends one
            self._refuse(411, "Length Required", "Send the body with a Content-Length.")
            return
        if self.content_length <= 0:
            return
        submit = self.path == SUBMIT_PATH
        limit = self.max_submit_bytes if submit else SMALL_BODY_BYTES
        if submit and self.identify(self.headers.get(self.secret_header, "")) is None:
            if self.content_length > DRAINED_BODY_BYTES:
                self._refuse(403, "Forbidden", "Unknown secret.")
            else:  # read and dropped; the application answers 403 with an empty body
                self.body_rcv = FixedStreamReceiver(self.content_length, _Discarded())
        elif self.content_length > limit:
            self._refuse(413, "Request Entity Too Large",
                         f"The request is larger than {limit} bytes.")

    def _refuse(self, code, reason, message):
        self.error = Refused(code, reason, message)
        self.completed = True
        if self.audit is not None:
            self.audit(self.identify(self.headers.get(self.secret_header, "")), self.path,
                       code, message)

    def deadline(self, header_timeout, min_upload_rate):
        """When this request must be whole (time.time() seconds)."""
        if self.headers_done is None:
            return self.started + header_timeout
        return self.headers_done + header_timeout + self.content_length / min_upload_rate


class _Channel(HTTPChannel):
    def overdue(self, now, header_timeout, min_upload_rate):
        """Whether this connection is late with its request (and not being served)."""
        if self.requests or self.will_close or self.close_when_flushed:
            return False
        if self.request is None:
            return now > self.last_activity + header_timeout
        return now > self.request.deadline(header_timeout, min_upload_rate)

    def evictable(self):
        """Waiting for (more of) a request's headers, nothing being served."""
        return not (self.requests or self.will_close or self.close_when_flushed) and \
            (self.request is None or self.request.headers_done is None)


class _Server(TcpWSGIServer):
    channel_class = _Channel
    dropped = 0
    header_timeout = 10.0
    min_upload_rate = 64 << 10

    def readable(self):
        now = time.time()
        if now >= self.next_channel_cleanup:
            self.next_channel_cleanup = now + self.adj.cleanup_interval
            self.maintenance(now)
        return self.accepting  # at the limit too: `handle_accept` evicts

    def handle_accept(self):
        super().handle_accept()
        if len(self.active_channels) <= self.adj.connection_limit:
            return
        channels = list(self.active_channels.values())
        victim = next((channel for channel in channels if channel.evictable()), channels[-1])
        victim.will_close = True
        self.dropped += 1

    def maintenance(self, now):
        super().maintenance(now)
        for channel in list(self.active_channels.values()):
            if channel.overdue(now, self.header_timeout, self.min_upload_rate):
                channel.will_close = True
                self.dropped += 1
        if self.dropped:  # at most a line a cleanup interval, however many
            logger.warning("Dropped %d connections whose requests came too slowly, or to "
                           "make room at the connection limit (%d)", self.dropped,
                           self.adj.connection_limit)
            self.dropped = 0


def make_front(app, identify, host, port, threads=16, max_request_bytes=256 << 20,
               connection_limit=1000, header_timeout=10.0, min_upload_rate=64 << 10,
               channel_timeout=30, secret_header="X-Punchcard-Secret", audit=None):
    """A waitress server of ``app`` with the checks above (call its ``run()``).

    Args:
        app: The WSGI application.
        identify: A function of a secret: its identity, or None for an unknown secret.
        host: Where to listen (one address: the first ``host`` resolves to).
        port: The port to listen on.
        threads: Worker threads serving requests.
        max_request_bytes: The largest submission body.
        connection_limit: Connections held at once.
        header_timeout: Seconds a request's headers may take, and a body's allowance
            on top of ``content length / min_upload_rate``.
        min_upload_rate: The slowest upload accepted, in bytes a second.
        channel_timeout: Seconds an idle kept-alive connection is held.
        secret_header: The header that carries the client's secret.
        audit: Called with ``(identity or None, path, status, message)`` for each request
            refused here, or None.

    Returns:
        The server (a waitress ``TcpWSGIServer``): ``run()``, ``close()``,
        ``effective_port``.
    """
    parser = type("PunchcardParser", (_Parser,), {
        "identify": staticmethod(identify), "max_submit_bytes": max_request_bytes,
        "audit": None if audit is None else staticmethod(audit),
        "secret_header": secret_header.upper().replace("-", "_")})
    channel = type("PunchcardChannel", (_Channel,), {"parser_class": parser})
    server = type("PunchcardServer", (_Server,), {
        "channel_class": channel, "header_timeout": header_timeout,
        "min_upload_rate": min_upload_rate})
    adjustments = Adjustments(
        host=host, port=port, threads=threads, ident="punchcard",
        # The limits are the parser's, by route, from Content-Length (chunked bodies are
        # refused): waitress's own would answer a 256 MB upload of an unknown secret 413.
        max_request_body_size=1 << 62, connection_limit=connection_limit,
        channel_timeout=channel_timeout, cleanup_interval=1, asyncore_use_poll=True)
    return server(app, adj=adjustments)
