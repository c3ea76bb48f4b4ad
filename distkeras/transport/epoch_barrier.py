"""The epoch barrier of a server: workers send their weights at each epoch's end and
wait until every one has, while the driver ends the epoch (validation, callbacks).

`EpochBarrier` serves the pull (a worker joins, or rejoins after Spark restarted it) and
the commit (an epoch's end) of a server composed of `socket_transport.SocketTransport`,
`center.CenterExchange` and `history_sink.HistorySink`. What the epoch's end makes of
the weights is the composed server's: `_epoch_entry`, `_average`, `_run_epoch_hook`.
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

    Notes:
        Composed after the center (``mutex``), whose commit checks it uses.
    """

    WAIT_SECONDS = 1.0  # how often a waiting handler checks that the server still runs
    # Its commits are epoch ends, not the workers' exchanges: no commit rate to show.
    shows_commit_rate = False

    def __init__(self, num_workers):
        self.num_workers = num_workers
        # Weights that hold NaN or infinite values still take part in the mean, as in one
        # Spark job per epoch (the driver averages whatever the workers return): a refused
        # commit would get no reply and every worker would wait for it forever.
        self.allow_nonfinite = True
        self.epochs_done = 0
        self.stop_requested = False
        self.learning_rate = None  # the next epoch's, when the driver sets one
        self._epoch_weights = {}  # worker id -> what `_epoch_entry` keeps of its commit
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

    def _reply(self):
        reply = {"center": self.center_variable, "epochs_done": self.epochs_done,
                 "stop": self.stop_requested}
        if self.learning_rate is not None:
            reply["learning_rate"] = float(self.learning_rate)
        return reply

    def _epoch_entry(self, data, weights, samples):
        """What a worker's commit of an epoch keeps until the epoch ends."""
        return weights, samples

    def _average(self):
        """Makes the new center of the epoch's entries; call under the lock."""
        raise NotImplementedError(f"{type(self).__name__} must implement _average().")

    def _run_epoch_hook(self):
        """Runs the driver's end of the epoch; returns whether to stop."""
        return False
