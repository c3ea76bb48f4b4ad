"""Punchcard's HTTP front: waitress, made to survive slow and hostile clients.

Plain waitress buffers a request's whole body (to temporary files past 512 KiB) before the
application sees its headers, keeps a connection for as long as it sends a byte every
``channel_timeout`` seconds, and stops accepting at ``connection_limit``: 100 clients
trickling header lines, or 40 sending whole headers and withholding their bodies, locked
every other client out. Here:

- each request is judged from its headers: a body with an unknown secret, one over the
  route's limit, or one the application refuses from the headers (``admit``: a busy
  secret's submission) is answered at once, before its body is read; the connection is
  then half-closed and the body read and dropped (so that its client reads the answer
  rather than a reset), under the deadline below (an unknown secret's for
  ``header_timeout`` at most);
- a request's headers must arrive whole within ``header_timeout`` seconds of its first
  byte (or of the connection's last activity), and its body (read or dropped) must keep
  up with ``min_upload_rate`` bytes a second after that allowance: a client that
  withholds or trickles either is dropped, whatever secret it sends; an answer left
  unread (a download) is held ``channel_timeout`` seconds, then must be read at that rate;
- at ``connection_limit`` connections a new one is still accepted, and a waiting one
  (never one being served) is closed for it: a refused body being dropped first, then a
  body still to come, then the connection nearest its deadline (the slowest or longest
  stalled): withholding clients evict each other, while a client that sends its request
  at once is served.
"""

import http
import json
import logging
import socket
import struct
import time

from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.parser import HTTPRequestParser
from waitress.server import TcpWSGIServer
from waitress.utilities import Error

logger = logging.getLogger(__name__)

SUBMIT_PATH = "/api/submit"
# The body of any other route (they take none).
SMALL_BODY_BYTES = 64 << 10
# An answer buffered ahead of its client, at most (the writing thread waits).
OUTBUF_BYTES = 1 << 20


class Refused(Error):
    """A refusal sent from the front, as the application's JSON errors are."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code, self.reason = code, http.HTTPStatus(code).phrase

    def to_response(self, ident=None):
        body = json.dumps({"error": self.body}).encode("utf-8")
        return (f"{self.code} {self.reason}",
                [("Content-Type", "application/json")], body)


class _Parser(HTTPRequestParser):
    """Judges a request from its headers (`make_front`'s checks) as soon as they arrive."""

    identify = None  # set on the subclass `make_front` makes: secret -> identity or None
    admit = None  # (path, identity) -> ((status, message) or None, release or None)
    secret_header = None  # its name as waitress keeps it (X_PUNCHCARD_SECRET)
    max_submit_bytes = 0
    audit = None  # a function of (identity or None, path, status, message), or None

    def __init__(self, adj):
        super().__init__(adj)
        self.started = time.time()
        self.headers_done = None
        self.dropping = False  # refused from its headers: its body is read and dropped
        self.known = False  # of a known secret (its dropped body may take longer)
        self.dropped = 0
        self.release = None  # gives back what `admit` granted, once the request is done

    def received(self, data):
        consumed = super().received(data)
        if self.dropping:  # what follows a refused request's headers is its body
            self.dropped += len(data) - consumed
            return len(data)
        return consumed

    def parse_header(self, header_plus):
        super().parse_header(header_plus)
        self.headers_done = time.time()
        who = self.identify(self.headers.get(self.secret_header, ""))
        limit = self.max_submit_bytes if self.path == SUBMIT_PATH else SMALL_BODY_BYTES
        if self.chunked:  # its length unknown until it is read: every client sends one
            self._refuse(411, "Send the body with a Content-Length.", who)
        elif self.content_length > 0 and who is None:
            self._refuse(403, "Unknown secret.", who)
        elif self.content_length > limit:
            self._refuse(413, f"The request is larger than {limit} bytes.", who)
        elif who is not None and self.admit is not None:
            refusal, self.release = self.admit(self.path, who)
            if refusal is not None:
                self._refuse(*refusal, who)

    def _refuse(self, code, message, who):
        self.error = Refused(code, message)
        self.completed = True
        self.dropping = self.chunked or self.content_length > 0
        self.known = who is not None
        if self.audit is not None:
            self.audit(who, self.path, code, message)

    def deadline(self, header_timeout, min_upload_rate):
        """When this request must have come further (time.time() seconds)."""
        if self.headers_done is None:
            return self.started + header_timeout
        return self.headers_done + header_timeout + self.body_bytes_received / min_upload_rate

    def close(self):
        release, self.release = self.release, None
        if release is not None:
            release()
        super().close()


class _Channel(HTTPChannel):
    drain = None  # a refused request's body left to drop (None: until the client stops)
    draining = None  # since when the answer was sent and the body is being dropped
    drain_next = False  # the request being answered was refused from its headers
    drain_known = False  # ... with a known secret: its body is dropped at the upload rate
    dropped = 0  # bytes of its body dropped since
    answering = 0.0  # when the answer being sent was started
    sent = 0  # bytes of it sent since

    def deadline(self, header_timeout, min_upload_rate):
        """When this connection must have sent (or read) more, or None while it is
        served or closing."""
        if self.will_close:
            return None
        if self.draining is not None:  # an unknown secret's, for header_timeout at most
            return self.draining + header_timeout + \
                (self.dropped / min_upload_rate if self.drain_known else 0)
        if self.requests or self.close_when_flushed or self.total_outbufs_len:
            # Being answered: a client that reads its answer slowly holds it (and the
            # thread writing it), so it must read at the upload rate too.
            stalled = self.total_outbufs_len >= self.adj.outbuf_high_watermark or \
                (self.total_outbufs_len and not self.requests)
            return self.answering + self.adj.channel_timeout + self.sent / min_upload_rate \
                if stalled else None
        if self.request is None:
            return self.last_activity + header_timeout
        return self.request.deadline(header_timeout, min_upload_rate)

    def _flush_some(self, do_close=True):
        before = self.total_outbufs_len
        flushed = super()._flush_some(do_close=do_close)
        self.sent += max(0, before - self.total_outbufs_len)
        return flushed

    def service(self):
        self.answering, self.sent = time.time(), 0
        request = self.requests[0]
        if request.dropping:  # set before the answer's flush can close the connection
            self.drain_next, self.drain_known = True, request.known
            self.drain = None if request.chunked else \
                max(0, request.content_length - request.dropped)
        super().service()

    def handle_read(self):
        if self.draining is None:
            return super().handle_read()
        data = self.recv(self.adj.recv_bytes)  # b"" (and closed) at the client's end
        self.dropped += len(data)
        if data and self.drain is not None and self.dropped >= self.drain:
            self.handle_close()
        return None

    def handle_close(self):
        if self.drain_next and self.draining is None and self.connected and self.drain != 0:
            # Answered before its body was read: stop sending, read the body and drop it,
            # then close (closed at once, the client would read a reset, not the answer).
            try:
                self.socket.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            else:
                self.draining = time.time()
                self.will_close = self.close_when_flushed = False
                return
        if self.request is not None:
            self.request.close()  # a request cut off while it came: what it held
        super().handle_close()


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

    def _deadline(self, channel):
        return channel.deadline(self.header_timeout, self.min_upload_rate)

    def _drop(self, channel):
        """Closes ``channel`` now, discarding what it has not sent (`will_close` would
        wait for a write that its client can block)."""
        try:
            channel.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                      struct.pack("ii", 1, 0))
        except OSError:
            pass
        channel.draining = channel.draining or time.time()  # closed, not drained
        channel.handle_close()
        self.dropped += 1

    def _eviction_order(self, channel):
        # A refused body being dropped first, then a body that is late in coming (whole
        # headers, then nothing: the one attack a fresh connection cannot be told from
        # by its deadline alone), then the rest by deadline.
        request = channel.request
        stage = 0 if channel.draining is not None else \
            1 if request is not None and request.headers_done is not None else 2
        return stage, self._deadline(channel)

    def handle_accept(self):
        super().handle_accept()
        channels = [channel for channel in self.active_channels.values()
                    if not channel.will_close]
        if len(channels) <= self.adj.connection_limit:
            return
        waiting = [channel for channel in channels if self._deadline(channel) is not None]
        victim = min(waiting, key=self._eviction_order) if waiting else channels[-1]
        self._drop(victim)

    def maintenance(self, now):
        super().maintenance(now)
        for channel in list(self.active_channels.values()):
            deadline = self._deadline(channel)
            if deadline is not None and now > deadline:
                self._drop(channel)
        if self.dropped:  # at most a line a cleanup interval, however many
            logger.warning("Dropped %d connections whose requests came too slowly, or to "
                           "make room at the connection limit (%d)", self.dropped,
                           self.adj.connection_limit)
            self.dropped = 0


def make_front(app, identify, host, port, threads=16, max_request_bytes=256 << 20,
               connection_limit=1000, header_timeout=10.0, min_upload_rate=64 << 10,
               channel_timeout=30, secret_header="X-Punchcard-Secret", audit=None,
               admit=None):
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
            on top of ``bytes received / min_upload_rate``.
        min_upload_rate: The slowest upload accepted, in bytes a second (and the slowest
            download, past ``channel_timeout``).
        channel_timeout: Seconds an idle kept-alive connection is held, and an answer's
            allowance before its client must read it at ``min_upload_rate``.
        secret_header: The header that carries the client's secret.
        audit: Called with ``(identity or None, path, status, message)`` for each request
            refused here, or None.
        admit: Called with ``(path, identity)`` once a known secret's request headers
            are in: returns ``(refusal, release)``, a refusal ``(status, message)`` to
            answer at once or None, and a function called once the request is done
            (answered, or its connection closed) or None. None: every request goes on.

    Returns:
        The server (a waitress ``TcpWSGIServer``): ``run()``, ``close()``,
        ``effective_port``.
    """
    parser = type("PunchcardParser", (_Parser,), {
        "identify": staticmethod(identify), "max_submit_bytes": max_request_bytes,
        "audit": None if audit is None else staticmethod(audit),
        "admit": None if admit is None else staticmethod(admit),
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
        # An answer's bytes are kept in memory until the whole buffer is sent: at
        # waitress's 16 MiB a download held 16 MiB; here 1 MiB, the rest waits.
        outbuf_high_watermark=OUTBUF_BYTES,
        channel_timeout=channel_timeout, cleanup_interval=1, asyncore_use_poll=True)
    return server(app, adj=adjustments)
