"""The history sink of a server: the workers' step records and metric states, their
failures and goodbyes, Spark's task retries (superseded records) and the epochs' ends.

`HistorySink` serves the history, failure and goodbye actions of a server; it is given
the transport's lock and the server's center (`center.CenterVariable`: its ``mutex``,
and the ``center_variable`` it holds as each epoch ends).
"""

import logging

from distkeras.transport import history_messages, networking
from distkeras.transport.networking import recv_data

logger = logging.getLogger(__name__)


def _history_records(columns):
    """The step records of a history message's columns, checked as they arrive.

    A worker sends one list per field, one number (or None) per step, all as long; any
    other value used to fail in the handler (counted as a bug of the server's, which
    stops the run) or, once kept, in every later report's epoch count.

    Raises:
        ProtocolError: If the columns are not such lists.
    """
    if not isinstance(columns, dict):
        raise networking.ProtocolError("A history message must carry a dict of columns.")
    for key, column in columns.items():
        integral = key in history_messages.INTEGRAL_FIELDS
        if not isinstance(column, list) or not all(
                value is None or (isinstance(value, int) and not isinstance(value, bool)
                                  if integral else isinstance(value, (int, float)))
                for value in column):
            raise networking.ProtocolError(
                f"History column {key!r} must be a list of "
                f"{'integers' if integral else 'numbers'} or None.")
    if len({len(column) for column in columns.values()}) > 1:
        raise networking.ProtocolError("A history message's columns differ in length.")
    return history_messages.history_records(columns)



class HistorySink:
    """Keeps what the workers report: step records, metric states, failures, goodbyes.

    Args:
        lock: The lock of the records (the transport's ``lock``).
        center: The server's `center.CenterVariable`.
        supersede_on_retry: Whether a new Spark task attempt of a worker marks all of
            its earlier attempts' records superseded as it connects (False: the server
            says which, as an epoch barrier does at the new attempt's pull).
    """

    MAX_FAILURE_CHARS = 4000

    def __init__(self, lock, center, supersede_on_retry=True):
        self.lock = lock
        self.center = center
        self.supersede_on_retry = supersede_on_retry
        self.history = []
        # The workers' reports of their metric state per epoch (`history_messages.unpack_metric_states`),
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
        self.worker_failures = []  # (worker id, error) that workers reported before failing
        self.on_worker_failure = None  # called with (worker id, error) as one arrives

    def finished(self):
        """The ids of the workers that said goodbye (a copy)."""
        with self.lock:
            return set(self.finished_workers)

    def history_snapshot(self):
        """The step records received so far (a copy)."""
        with self.lock:
            return list(self.history)

    def metric_states_snapshot(self):
        """The metric state reports received so far (a copy of the list)."""
        with self.lock:
            return list(self.metric_states)

    def joined(self, conn):
        """Notes which Spark task attempt of its worker a new connection is. When Spark
        retried the worker's failed task, the new attempt trains the partition again: it
        is no longer finished, and the steps the earlier attempts recorded are superseded
        (their commits stay applied)."""
        conn.attempt_index = 0  # this worker's attempts in the order they connected
        with self.center.mutex, self.lock:
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
                if self.supersede_on_retry:
                    # What its earlier attempts recorded is redone, from epoch 0.
                    self.supersede(conn.worker_id, lambda record: True)
                    self._trained_epochs.pop(conn.worker_id, None)

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
        with self.lock:
            self._epoch_tracking = None if num_tasks is None else (num_tasks, num_epoch)
            self._trained_epochs, self._epochs_ended, self._epoch_ends = {}, 0, {}

    def epoch_end(self, epoch):
        """``(center, samples)`` as ``epoch`` (from 1) ended: the center variable, and the
        samples of the steps recorded then (the ones it holds), or None where they were
        not kept (see `track_epochs`); they are then forgotten, with those of the epochs
        before."""
        with self.lock:
            end = self._epoch_ends.pop(epoch, None)
            for earlier in [kept for kept in self._epoch_ends if kept < epoch]:
                del self._epoch_ends[earlier]
        return end

    def _note_epoch_records(self, worker_id, records):
        """Counts the epochs of a worker's new records (of its current attempt); call
        under ``lock``."""
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
            self._epoch_ends[epoch] = (self.center.center_variable, samples)
            self._epochs_ended = epoch

    def supersede(self, worker_id, redone):
        """Marks ``worker_id``'s records for which ``redone(record)`` holds as
        ``superseded`` (with the ``attempt`` that made them, 0 for the first); call under
        ``lock``."""
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

    def handle_history(self, conn, addr):
        """Receives a worker's per-step records."""
        data = recv_data(conn)
        # Both checked before anything is kept: a malformed report closes the connection
        # and leaves the history as it was.
        records = _history_records(data.get("history"))
        reports = history_messages.unpack_metric_states(data, conn.worker_id)
        attempt = getattr(conn, "attempt", 0)
        index = getattr(conn, "attempt_index", 0)
        with self.lock:
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

    def handle_failure(self, conn, addr):
        """Receives the error that stops a worker (text, shown to the user, never run);
        keeps it and calls ``on_worker_failure``."""
        data = recv_data(conn)
        error = str(data.get("error", "an error it did not describe"))[:self.MAX_FAILURE_CHARS]
        with self.lock:
            self.worker_failures.append((conn.worker_id, error))
        if self.on_worker_failure is not None:
            self.on_worker_failure(conn.worker_id, error)

    def handle_goodbye(self, conn, addr):
        """A worker is done: after its last history, so its records are all in."""
        with self.lock:
            self.finished_workers.add(conn.worker_id)
            self._note_epoch_ends()
