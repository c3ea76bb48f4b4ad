"""A worker's per-step training records, on their way to the driver.

Kept as columns (`HistoryLog`), packed into the task's reply
(`distkeras.transport.history_messages.pack_history`) and sent to the driver's server while
the worker trains (`send_history_columns`, `ProgressReporter`).
"""

import logging
import time

import numpy as np

from distkeras.executor.metric_sums import EpochMetricSums
from distkeras.transport import networking

logger = logging.getLogger(__name__)


class HistoryLog:
    """Per-step training records, kept as columns of numbers (compact, JSON-able).

    Values may arrive as JAX scalars, or as JAX arrays holding a whole window of steps,
    still being computed; they are turned into floats in groups (one transfer per array),
    so recording a step never waits for that step to finish.

    ``metric_sums`` adds up the steps' metric state per epoch, for the exact epoch logs
    (see `distkeras.executor.metric_sums`); it travels with the records (`drain_metric_sums`).
    """

    MATERIALIZE_EVERY = 64

    def __init__(self):
        self.columns = {}
        self.size = 0
        self._materialized = 0
        self.metric_sums = EpochMetricSums()

    def append(self, record):
        """Adds one step's record (a dict of numbers)."""
        self.extend(record, 1)

    def extend(self, record, count):
        """Adds ``count`` steps: values that are arrays of ``count`` give one per step,
        other values are shared by all of them."""
        for key in record:
            if key not in self.columns:
                self.columns[key] = [None] * self.size
        for key, column in self.columns.items():
            value = record.get(key)
            if count == 1 or value is None or np.ndim(value) == 0:
                column.extend([value] * count)
            else:
                block = _StepBlock(value)
                column.extend(_BlockItem(block, index) for index in range(count))
        self.size += count
        if self.size - self._materialized >= self.MATERIALIZE_EVERY:
            self._materialize(keep_last=count)

    def _materialize(self, keep_last=0):
        end = self.size - keep_last
        for column in self.columns.values():
            for index in range(self._materialized, end):
                value = column[index]
                if isinstance(value, _BlockItem):
                    column[index] = value.get()
                elif value is not None and not isinstance(value, (int, float)):
                    column[index] = to_float(value)
        self._materialized = max(self._materialized, end)

    def drain(self):
        """Returns the records so far as columns and forgets them."""
        self._materialize()
        columns, self.columns, self.size, self._materialized = self.columns, {}, 0, 0
        return columns

    def drain_metric_sums(self):
        """The metric state added up since the last call, as message fields (see
        `EpochMetricSums.drain`); drained with the records, it covers their steps."""
        return self.metric_sums.drain()


class _StepBlock:
    """A window's values for one key: fetched to the host once, when first read."""

    def __init__(self, values):
        self.values = values
        self._host = None

    def host(self):
        if self._host is None:
            values = np.asarray(self.values).reshape(-1)
            if not np.issubdtype(values.dtype, np.integer):
                values = values.astype(np.float64)
            self._host = values.tolist()  # Python ints and floats, as JSON wants them
            self.values = None
        return self._host


class _BlockItem:
    def __init__(self, block, index):
        self.block = block
        self.index = index

    def get(self):
        return self.block.host()[self.index]


def to_float(value):
    """A step's logged value as a Python float (JAX is imported only when needed)."""
    from distkeras.executor import jax_steps  # imports JAX: only once a step is logged

    return jax_steps.to_float(value)


# The numbers of a history message travel as JSON in its frame's header, which may hold
# at most `networking.MAX_HEADER_BYTES` (1 MiB): a number takes up to about 25 bytes, so a
# frame carries at most this many. A long window's steps (they go with its commit) take
# several frames.
HISTORY_VALUES_PER_FRAME = 32768


def send_history_columns(sock, columns, metric_sums=None):
    """Sends drained history columns, and the metric sums drained with them (see
    `HistoryLog.drain_metric_sums`), to the driver's server (nothing when there are
    none), in as many frames as their size needs. The sums go with the first: the driver
    ends an epoch when records show it over, and reads the epoch's metric state then."""
    if not (columns or metric_sums):
        return
    steps = len(next(iter(columns.values()))) if columns else 0
    per_frame = max(1, HISTORY_VALUES_PER_FRAME // max(1, len(columns)))
    starts = range(0, steps, per_frame) if steps > per_frame else [0]
    for start in starts:
        chunk = columns if len(starts) == 1 else {
            key: column[start:start + per_frame] for key, column in columns.items()}
        first = start == starts[0]
        networking.send_action(sock, networking.ACTION_HISTORY)
        networking.send_data(sock, {"history": chunk,
                                    **((metric_sums or {}) if first else {})})


class ProgressReporter:
    """Sends a worker's step records to the driver's `HistoryServer` every
    ``every_seconds`` and at the end, for the progress bar of a trainer whose workers
    exchange no weights.

    Args:
        host: The server's host.
        port: The server's port.
        token: The run's token.
        every_seconds: Seconds between two reports.
    """

    def __init__(self, host, port, token, every_seconds=0.5):
        self.host, self.port, self.token = host, port, token
        self.every_seconds = every_seconds
        self.socket = None
        self._last = float("-inf")

    def open(self, worker_id, timeout=60.0):
        self.socket = networking.connect(self.host, self.port, timeout=timeout)
        networking.authenticate(self.socket, self.token, worker_id,
                                networking.task_attempt_id())

    def report(self, history, force=False):
        """Sends (and forgets) the records of ``history``, a `HistoryLog`, when due."""
        if not force and time.monotonic() - self._last < self.every_seconds:
            return
        self._last = time.monotonic()
        send_history_columns(self.socket, history.drain(), history.drain_metric_sums())

    def close(self, history, timeout=10.0):
        """Sends the last records, says goodbye and waits until the server has closed the
        connection: it has then read every record before this worker's task ends. A
        failure only logs (the training's result does not depend on it)."""
        try:
            self.report(history, force=True)
            networking.send_action(self.socket, networking.ACTION_QUIT)
            self.socket.settimeout(timeout)
            self.socket.recv(1)  # b"" once the server has closed its side
        except OSError as error:
            logger.warning("Could not send the last progress report: %s", error)
        networking.close_socket(self.socket)
        self.socket = None
