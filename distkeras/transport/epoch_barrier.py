"""The epoch barrier of a server: workers send their weights at each epoch's end and
wait until every one has, while the driver ends the epoch (validation, callbacks).

`EpochBarrier` serves the pull (a worker joins, or rejoins after Spark restarted it) and
the commit (an epoch's end) of a server that holds it beside its transport
(`socket_transport.SocketTransport`), center (`center.CenterExchange`) and history sink
(`history_sink.HistorySink`). What an epoch's end makes of the weights is the server's
(``ends``).
"""

import logging
import threading

from distkeras.transport import networking
from distkeras.transport.networking import recv_data, send_data

logger = logging.getLogger(__name__)


class EpochBarrier:
    """The barrier at each epoch's end, for ``num_workers`` workers.

    Replies carry ``epochs_done``: a worker that Spark restarted (a barrier stage restarts
    them all) joins with a pull and skips the epochs already ended. A worker's weights
    for an epoch replace any it sent for that epoch before (from a task that was killed):
    both started from the same center, so either is a true result of that epoch.

    Args:
        num_workers: Workers that take part in every epoch's end.
        transport: The server's `socket_transport.SocketTransport` (whether it still
            runs; its errors).
        center: The server's `center.CenterExchange` (its lock, the commit checks).
        sink: The server's `history_sink.HistorySink`, built with
            ``supersede_on_retry=False``: the barrier says which records a rejoining
            worker redoes.
        ends: What makes each epoch's end, called under the lock:
            ``epoch_entry(data, weights, samples)`` (what a commit keeps until the epoch
            ends), ``average(entries)`` (the new center of ``{worker id: entry}``, or
            None), ``end_epoch(epochs_done)`` (the driver's end; returns whether to stop)
            and ``reply_fields()`` (a reply's other fields): the server's own.
    """

    WAIT_SECONDS = 1.0  # how often a waiting handler checks that the server still runs

    def __init__(self, num_workers, transport, center, sink, ends):
        self.num_workers = num_workers
        self.transport, self.center, self.sink, self.ends = transport, center, sink, ends
        # Weights that hold NaN or infinite values still take part in the mean, as in one
        # Spark job per epoch (the driver averages whatever the workers return): a refused
        # commit would get no reply and every worker would wait for it forever.
        center.allow_nonfinite = True
        self.epochs_done = 0
        self.stop_requested = False
        self.learning_rate = None  # the next epoch's, when the driver sets one
        self.entries = {}  # worker id -> what ``ends.epoch_entry`` kept of its commit
        self._averaged = threading.Condition(center.mutex)

    def handle_pull(self, conn, addr):
        """A worker joins (or rejoins): the center and the epochs averaged so far.

        A rejoining worker redoes the epochs not averaged yet: the steps its lost task
        recorded in them are marked ``superseded``, so the history counts each epoch's
        steps once (it keeps those of the epochs averaged, which the new task skips).
        """
        with self.center.mutex:
            with self.sink.lock:
                self.sink.supersede(conn.worker_id,
                                    lambda record: record.get("epoch", 0) >= self.epochs_done)
            reply = self._reply()
        send_data(conn, reply)

    def handle_commit(self, conn, addr):
        """A worker's weights at an epoch's end: kept, and answered once the epoch ended."""
        center = self.center
        data = recv_data(conn)
        weights = center.model_update(data.get("delta"))
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
                self.entries[conn.worker_id] = self.ends.epoch_entry(data, weights, samples)
                if len(self.entries) >= self.num_workers:
                    self._end_epoch()
                while self.epochs_done == epoch and not self.stop_requested \
                        and self.transport.running:
                    self._averaged.wait(self.WAIT_SECONDS)
            center.next_update(conn)
            reply = self._reply()
        send_data(conn, reply)

    def _end_epoch(self):
        """Makes the epoch's center, counts the epoch done, runs the driver's end of it
        and wakes the waiting workers; call under the lock."""
        entries, self.entries = self.entries, {}
        center = self.ends.average(entries)
        if center is not None:
            self.center.center_variable = center
        self.epochs_done += 1
        try:
            # The workers wait meanwhile, as they would between two Spark jobs.
            self.stop_requested = bool(self.ends.end_epoch(self.epochs_done))
        except Exception as error:  # the driver's hook: stop the workers, keep its error
            logger.exception("The end of epoch %s failed on the driver", self.epochs_done)
            with self.transport.lock:
                self.transport.errors.append(f"{type(error).__name__}: {error}")
            self.stop_requested = True
        finally:
            self._averaged.notify_all()

    def _reply(self):
        reply = {"center": self.center.center_variable, "epochs_done": self.epochs_done,
                 "stop": self.stop_requested}
        if self.learning_rate is not None:
            reply["learning_rate"] = float(self.learning_rate)
        reply.update(self.ends.reply_fields())
        return reply
