"""`NetworkWorker`: a worker that talks to the driver's parameter server with `pull()`
and `commit()` (seed 000's extension API: a subclass writes `optimize`)."""

import logging
import math
import time

import numpy as np

from distkeras.executor.failures import send_failure
from distkeras.executor.shard_links import ShardLinks
from distkeras.executor.step_history import send_history_columns
from distkeras.executor.task_spec import SpecSetting
from distkeras.executor.worker import Worker
from distkeras.transport import compression as codecs
from distkeras.transport import networking
from distkeras.transport.exchange_checks import checked_update, learning_rate_field

logger = logging.getLogger(__name__)


def variables_bytes(variables):
    """The bytes of Keras variables' values, from their shapes and dtypes."""
    return sum(math.prod(variable.shape) * np.dtype(variable.dtype).itemsize
               for variable in variables)


def reply_limit_bytes(keras_model):
    """The largest frame a worker of ``keras_model`` reads from its server: room for the
    weights twice and the optimizer's state (an epoch server's reply), so a model past
    2 GiB comes back whole, while a lying length field is still refused."""
    weights = variables_bytes(keras_model.weights)
    optimizer = keras_model.optimizer
    if optimizer is not None and optimizer.built:
        state = variables_bytes(optimizer.variables)
    else:  # built at the first step: room for Adam's two moments and AMSGrad's third
        state = 3 * weights
    return max(networking.DEFAULT_MAX_FRAME_BYTES, 2 * weights + state + (1 << 20))


class NetworkWorker(Worker):
    """A worker that talks to the parameter server with `pull()` and `commit()`.

    The steps' records reach the driver with the commits, at most every
    ``HISTORY_EVERY_SECONDS`` (the progress bar's pace; the spec's
    ``history_every_seconds`` where set) and at the end.

    Takes `Worker`'s arguments, in its order, with these three before ``learning_rate``.

    Args:
        model: A `keras.Model` or the bytes of a `.keras` archive.
        master_host: The parameter server's address (set by the trainer).
        master_port: The parameter server's port (set by the trainer).
        communication_window: Local steps between two commits.
    """

    HISTORY_EVERY_SECONDS = 0.5
    master_host = SpecSetting()
    master_port = SpecSetting()
    connect_timeout = SpecSetting()
    communication_window = SpecSetting()
    compression = SpecSetting()
    shard_ports = SpecSetting()

    def __init__(self, model, optimizer=None, loss=None, loss_weights=None, metrics=None,
                 features_col=None, label_col=None, batch_size=None, num_epoch=None,
                 master_host=None, master_port=None, communication_window=None,
                 learning_rate=None):
        super().__init__(model, optimizer, loss, loss_weights, metrics, features_col,
                         label_col, batch_size, num_epoch, learning_rate)
        self.spec = self.spec.replace(master_host=master_host, master_port=master_port,
                                      communication_window=communication_window)
        self.center_variable = None
        self.last_update = 0
        self.socket = None
        self._last_flush = float("-inf")
        self._reported_epoch = 0
        self._failure_reported = False
        self._server_learning_rate = None  # the last one a pull brought
        self._applied_learning_rate = None
        self.encoder = None  # the compression's `codecs.Encoder`, made in `setup`
        self.links = None  # a sharded center's `ShardLinks`, made in `setup`

    def setup(self):
        self._failure_reported = False
        spec = self.spec
        self.socket = self._connect(spec.master_port)
        if spec.shard_ports:
            self.links = ShardLinks([self.socket] + [self._connect(port)
                                                     for port in spec.shard_ports],
                                    self.weight_spec)
        compression = codecs.parse(spec.compression)
        self.encoder = None if compression is None else codecs.Encoder(
            compression, self.weight_spec, self.error_feedback())

    def _connect(self, port):
        """An authenticated connection to the server (or shard) at ``port``."""
        spec = self.spec
        sock = networking.Connection(
            networking.connect(spec.master_host, port, timeout=spec.connect_timeout),
            max_frame_bytes=reply_limit_bytes(self.model.keras_model))
        networking.authenticate(sock, spec.token, self.worker_id,
                                networking.task_attempt_id())
        return sock

    def _pull_reply(self, action):
        """Sends a pull ``action`` and reads the reply (every shard's, joined)."""
        if self.links is not None:
            return self.links.pull(action)
        networking.send_action(self.socket, action)
        return networking.recv_data(self.socket)

    def error_feedback(self):
        """Whether compressed commits carry what the previous ones left out (True: the
        worker goes on from the center, so what a commit left out is lost otherwise)."""
        return True

    def teardown(self):
        if self.socket is None:
            return
        try:
            self.before_goodbye()
            self.flush_history()
            # The goodbye says the partition is done: a failed task that Spark retries
            # only closes (the driver's monitor would end the epochs it has not trained).
            if self.completed:
                networking.send_action(self.socket, networking.ACTION_QUIT)
                if self.links is not None:
                    self.links.goodbye()
        except OSError as error:
            # A worker that failed is most often one the driver stopped (another worker's
            # invalid rows, a callback's error): the server is gone, and a warning of a
            # broken pipe would sit beside the error that matters.
            log = logger.warning if self.completed else logger.info
            log("Worker %s could not say goodbye to the server: %s", self.worker_id, error)
        networking.close_socket(self.socket)
        self.socket = None
        if self.links is not None:
            self.links.close()
            self.links = None

    def before_goodbye(self):
        """Hook run before the last history and the goodbye are sent."""

    def before_compile(self):
        networking.send_action(self.socket, networking.ACTION_COMPILING)

    def report_failure(self, error):
        """Sends the error that stops this worker to the server (once), whose driver then
        stops the job rather than wait for the other workers or Spark's retries."""
        if self.socket is None or self._failure_reported:
            return
        self._failure_reported = True
        send_failure(self.socket, error, self.worker_id)

    def pull(self):
        """Fetches the center variable into ``self.center_variable``."""
        data = self._pull_reply(networking.ACTION_PULL)
        self.center_variable = self._pulled_center(data)
        self.last_update = data.get("num_updates", 0)
        self._note_learning_rate(data)
        self.apply_server_learning_rate()

    def pull_unless_own(self):
        """Like `pull`, but the server sends no weights when only this worker's commits
        changed the center since its last pull and its rule adds commits as sent.

        A learning rate the reply brings is kept, not applied (this may run on the
        exchange thread while the model trains): the caller applies it with
        `apply_server_learning_rate`, as `communicate` does.

        Returns:
            True when no weights came: the center is then the last pulled one plus this
            worker's commit since, which the caller computes (``center_variable`` is left
            for it to set).
        """
        data = self._pull_reply(networking.ACTION_PULL_UNLESS_OWN)
        self.last_update = data.get("num_updates", 0)
        self._note_learning_rate(data)
        if data.get("unchanged") is True:
            if self.encoder is not None:
                self.encoder.own_sent = []
            return True
        self.center_variable = self._pulled_center(data)
        return False

    def _pulled_center(self, data):
        """The float32 center a pull reply carries (see `codecs.Encoder.take_pull`)."""
        if self.encoder is not None:
            center = self.encoder.take_pull(data, self.center_variable)
        else:
            center = data.get("center")
        if center is None:
            raise networking.ProtocolError("The server's pull reply carries no center.")
        return center

    def _note_learning_rate(self, data):
        """Keeps the learning rate a pull reply carries (the driver's callbacks set it)."""
        rate = learning_rate_field(data, "optimizer_learning_rate")
        if rate is not None:
            self._server_learning_rate = rate

    def apply_server_learning_rate(self):
        """Gives the local optimizer the learning rate that the driver's callbacks
        (``ReduceLROnPlateau``, ``LearningRateScheduler``) set, when it changed since the
        last one applied."""
        rate = self._server_learning_rate
        if rate is None or rate == self._applied_learning_rate:
            return
        self.model.optimizer.learning_rate = rate
        self._applied_learning_rate = rate
        logger.info("Worker %s: learning rate %g from the driver", self.worker_id, rate)

    def commit(self, delta, **extra):
        """Sends an update (``delta``, plus any extra fields) to the parameter server.

        Returns:
            The update as the server applies it: ``delta``, or what its compression kept
            of it (plus what earlier commits left out).
        """
        sent = self.send_commit(delta, **extra)
        if self.history_due():
            self.flush_history()
        return sent

    def send_commit(self, delta, **extra):
        """Sends the commit message alone (no history); returns the update as applied."""
        message, sent = self.commit_message(delta, **extra)
        self.send_commit_message(message, sent)
        return sent

    def commit_message(self, delta, **extra):
        """The commit message of ``delta`` (compressed, where the run compresses) and the
        update as the server applies it."""
        delta = checked_update(delta, self.weight_spec, f"{type(self).__name__}.commit()")
        message = {"worker_id": self.worker_id, "last_update": self.last_update}
        if self.encoder is None:
            message["delta"], sent = delta, delta
        else:
            fields, sent = self.encoder.encode(delta)
            message.update(fields)
        message.update(extra)
        return message, sent

    def send_commit_message(self, message, sent):
        """Sends a `commit_message`; notes ``sent`` for the next sparse pull reply."""
        if self.links is not None:
            self.links.commit(message)
        else:
            networking.send_action(self.socket, networking.ACTION_COMMIT)
            networking.send_data(self.socket, message)
        if self.encoder is not None:
            self.encoder.sent(sent)

    def history_due(self):
        """Whether the recorded steps should travel with this commit: every
        ``HISTORY_EVERY_SECONDS``, and as soon as they hold a new epoch's (the driver ends
        an epoch, on the center as it is then, when every worker's records show it over)."""
        every = self.spec.history_every_seconds
        every = self.HISTORY_EVERY_SECONDS if every is None else every
        return time.monotonic() - self._last_flush >= every or \
            self.latest_epoch > self._reported_epoch

    def flush_history(self):
        """Sends the steps recorded since the last flush to the driver, keeping none."""
        self.send_history(*self.drain_history())

    def drain_history(self):
        """The steps recorded since the last drain, as columns, and the metric sums
        drained with them (see `HistoryLog.drain_metric_sums`), forgotten here."""
        self._reported_epoch = self.latest_epoch
        return self.history.drain(), self.history.drain_metric_sums()

    def send_history(self, columns, metric_sums=None):
        """Sends drained history columns and metric sums (nothing when there are none)."""
        self._last_flush = time.monotonic()
        send_history_columns(self.socket, columns, metric_sums)
