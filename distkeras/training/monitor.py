"""Watches a training from the driver: a live progress bar, and a stop for stalled workers.

Workers send their per-step records to the parameter server with their commits; this
thread reads them (no extra traffic on the workers' hot path) to show samples done, commits
per second and the running loss, and stops the Spark job when a worker stays silent longer
than ``worker_timeout`` between its steps (``STARTUP_TIMEOUT`` before the first one and
while it compiles one).
"""

import importlib.util
import logging
import sys
import threading
import time

import numpy as np

from distkeras.training.checkpoints import save_checkpoint
from distkeras.training.epoch_metrics import of_epoch
from distkeras.training.spark_jobs import cancel_jobs
from distkeras.training.validator import epoch_logs

logger = logging.getLogger(__name__)

VERBOSE_CHOICES = (0, 1, 2, "auto")


def resolve_verbose(verbose):
    """Keras's ``verbose`` for a training: ``"auto"`` becomes 1 (a bar) where a person watches
    (stderr is a terminal, or a notebook kernel runs us) and 2 (lines) elsewhere.

    Raises:
        ValueError: For anything but 0, 1, 2 or ``"auto"``.
    """
    if isinstance(verbose, bool) or verbose not in VERBOSE_CHOICES:
        raise ValueError(f"`verbose` must be 0 (silent), 1 (a progress bar), 2 (a line every "
                         f"{LineProgress.EVERY:.0f} seconds) or 'auto'. "
                         f"Received: verbose={verbose!r}")
    if verbose != "auto":
        return verbose
    interactive = _in_notebook() or (hasattr(sys.stderr, "isatty") and sys.stderr.isatty())
    return 1 if interactive else 2


def _in_notebook():
    """Whether a Jupyter kernel runs us (tqdm's own test, from `tqdm.autonotebook`)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in shell.config


def _tqdm_class():
    """tqdm's widget in a notebook that can show one (ipywidgets installed), its text bar
    elsewhere. (``tqdm.auto`` warns "IProgress not found. Please update jupyter and
    ipywidgets" in a notebook without them, then draws the text bar all the same.)"""
    if _in_notebook():
        if importlib.util.find_spec("ipywidgets") is not None:
            from tqdm.notebook import tqdm

            return tqdm
    from tqdm.std import tqdm

    return tqdm


class BarProgress:
    """A tqdm progress bar on stderr (or in the notebook)."""

    def __init__(self, name, total):
        tqdm = _tqdm_class()
        self.bar = tqdm(total=total, unit="sample", desc=name, leave=True,
                        dynamic_ncols=True)  # the last state stays on screen, as Keras's

    def update(self, samples, postfix):
        self.bar.n = samples
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.refresh()

    def close(self):
        self.bar.close()


class LineProgress:
    """Progress as plain lines on stderr, for logs and pipes: one every ``EVERY`` seconds
    and a last one when the training ends (a bar's carriage returns would fill a log)."""

    EVERY = 30.0

    def __init__(self, name, total, stream=None):
        self.name = name
        self.total = total
        self.stream = stream or sys.stderr
        self.started = self.last_written = time.monotonic()
        self.line = None

    def update(self, samples, postfix):
        done = f"{samples}/{self.total}" if self.total else f"{samples}"
        details = ", ".join(f"{key}={value}" for key, value in postfix.items())
        self.line = (f"{self.name}: {done} samples, "
                     f"{time.monotonic() - self.started:.0f} s, {details}\n")
        if time.monotonic() - self.last_written >= self.EVERY:
            self._write()

    def _write(self):
        self.stream.write(self.line)
        self.stream.flush()
        self.line = None
        self.last_written = time.monotonic()

    def close(self):
        if self.line is not None:
            self._write()


def report_returned_validation(name, records, verbose, stream=None):
    """Writes the validation of the returned model (of each member, for an ensemble) as a
    line, where ``verbose``: it runs after the progress ended, whose bar or last line
    still shows the epoch before's ``val_loss``.

    Args:
        name: The trainer's name, starting each line.
        records: The validation records of the returned model(s).
        verbose: 0 writes nothing.
        stream: Where to write (default: stderr, as the progress).
    """
    if not verbose:
        return
    stream = stream or sys.stderr
    for record in records:
        member = f" {record['member']}" if "member" in record else ""
        values = ", ".join(f"{key}={value:.4f}" for key, value in record.items()
                           if key.startswith("val_"))
        # None: weights that a callback set at the train's end, of no epoch known.
        epoch = "weights a callback set" if record["epoch"] is None else \
            f"epoch {record['epoch']}"
        stream.write(f"{name}, returned model{member} ({epoch}): {values}\n")
    stream.flush()


class TrainingMonitor(threading.Thread):
    """Driver-side monitor of an asynchronous training.

    Args:
        server: The running server (a `parameter_servers.ParameterServer`).
        spark: The SparkSession running the job (classic or Connect).
        job_tag: The Spark job tag to cancel when a worker stalls (`spark_jobs.tagged_jobs`).
        total_samples: Samples the whole run will train on (for the bar), or None.
        verbose: 0 for silence, 1 for a progress bar (tqdm, on stderr), 2 for a line every
            30 seconds (see `resolve_verbose` for ``"auto"``).
        worker_timeout: Seconds a connected worker may stay silent between its steps
            (before the first one and while compiling one: ``STARTUP_TIMEOUT``), or None.
        name: The trainer's name: the bar's label, and the writer its checkpoints name.
        checkpoint_dir: Where to save the center variable periodically, or None.
        checkpoint_every: Seconds between two checkpoints.
        interval: Seconds between two looks.
        validator: A `distkeras.training.validator.Validator` to evaluate the center variable with
            each time the workers' samples complete an epoch (all but the last: the trainer
            evaluates the returned model), or None. Needs ``total_samples``.
        num_epoch: Epochs in ``total_samples``.
        validation_records: A list whose latest record's ``val_loss`` the progress shows
            (default: the validator's records); for trainers that validate themselves.
        num_tasks: Worker tasks (ids 0 to ``num_tasks - 1``): an epoch ends when each of
            them has reported a step of a later epoch, or finished. None, or workers whose
            records carry no ``epoch``: when the samples of all of them make an epoch.
        label: The bar's label instead of ``name`` (the run's, where several train at
            once: ``ADAG #2``).

    Attributes:
        STARTUP_TIMEOUT: Seconds (at least ``worker_timeout``) a connected worker may stay
            silent before its first step report, and after it said it compiles a step
            until its next report: it pulls the center, then compiles its training step
            and reads its first rows (a short last batch compiles again), which takes
            seconds on a busy executor. ``worker_timeout`` counts otherwise.
    """

    STARTUP_TIMEOUT = 120.0

    def __init__(self, server, spark, job_tag, total_samples=None, verbose=1,
                 worker_timeout=None, name=None, checkpoint_dir=None, checkpoint_every=60.0,
                 interval=0.5, validator=None, num_epoch=1, validation_records=None,
                 num_tasks=None, label=None):
        super().__init__(name="distkeras-monitor", daemon=True)
        self.server = server
        self.spark = spark
        self.job_tag = job_tag
        self.total_samples = total_samples
        self.verbose = resolve_verbose(verbose)
        self.worker_timeout = worker_timeout
        self.interval = interval
        self.name = name or type(server).__name__
        # What the progress calls the training (`name` names its checkpoints' writer).
        self.label = label or self.name
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self._checkpointed_updates = None
        self.stalled = None
        self._done = threading.Event()
        self._seen = 0
        self._samples = 0
        self._recent_losses = []
        self.validator = validator if total_samples else None
        self.num_epoch = num_epoch
        self.validation_records = validation_records
        self.num_tasks = num_tasks
        self._worker_epochs = {}  # per worker id, the latest epoch it reported a step of
        self._generation = 0  # the server's `history_generation` counted
        self._validated_epochs = 0
        self._epoch_records = []
        self.stopped_by_callback = None
        self.end_of_epoch_error = None  # (epoch, exception) when validation or a callback failed
        if self.validator is not None and num_tasks is not None:
            server.sink.track_epochs(num_tasks, num_epoch)  # each epoch on its own center

    def stop(self):
        self._done.set()
        self.join(timeout=5)
        self.server.sink.track_epochs(None)  # frees the centers no epoch end took

    def _progress(self):
        if self.verbose == 2:
            return LineProgress(self.label, self.total_samples)
        if self.verbose == 1:
            try:
                return BarProgress(self.label, self.total_samples)
            except ImportError:  # tqdm is optional
                return LineProgress(self.label, self.total_samples)
        return None

    def _read_new_records(self):
        # Read before the records: records superseded meanwhile are counted again at the
        # next look.
        generation = self.server.sink.history_generation
        recount = generation != self._generation
        if recount:
            # Spark retried a worker's failed task: the steps of the failed attempt no
            # longer count (the retry trains them again); count every step again.
            self._generation = generation
            self._seen = self._samples = 0
            self._worker_epochs = {}
            self._recent_losses, self._epoch_records = [], []
        history = self.server.history
        new = history[self._seen:len(history)]
        self._seen += len(new)
        for record in new:
            if not record.get("superseded"):
                self._count(record, recount)
        del self._recent_losses[:-50]
        return len(new) + recount

    def _count(self, record, recount=False):
        """Counts one step's record in the progress and the epochs' accounting
        (``recount``: again from the start, where epochs already ended are past)."""
        self._samples += record.get("batch_size", 0)
        if "epoch" in record:
            worker = record.get("worker_id")
            self._worker_epochs[worker] = max(self._worker_epochs.get(worker, 0),
                                              int(record["epoch"]))
        if "loss" in record:
            self._recent_losses.append(record["loss"])
        if self.validator is not None:  # emptied at each epoch's end
            if not recount or record.get("epoch", self._validated_epochs) >= \
                    self._validated_epochs:
                self._epoch_records.append(record)

    def run(self):
        progress = self._progress()
        started = last_checkpoint = time.monotonic()
        try:
            while not self._done.wait(self.interval):
                self._update(progress, started)
                if self.worker_timeout and self._check_stall():
                    return
                if self.checkpoint_dir and \
                        time.monotonic() - last_checkpoint >= self.checkpoint_every:
                    self._checkpoint()
                    last_checkpoint = time.monotonic()
            self._update(progress, started)  # the last records, sent as the workers finished
        finally:
            if progress is not None:
                progress.close()

    def _update(self, progress, started):
        if not self._read_new_records():
            return
        self._validate_finished_epochs()
        if progress is None:
            return
        elapsed = max(time.monotonic() - started, 1e-9)
        postfix = {}
        # None where workers only report progress, or exchange only at epoch ends.
        if self.server.num_updates and getattr(self.server, "shows_commit_rate", True):
            postfix["commits/s"] = f"{self.server.num_updates / elapsed:.1f}"
        if self._recent_losses:
            postfix["loss"] = f"{sum(self._recent_losses) / len(self._recent_losses):.4f}"
        records = self.validation_records if self.validation_records is not None else \
            getattr(self.validator, "records", None)
        if records and "val_loss" in records[-1]:
            postfix["val_loss"] = f"{records[-1]['val_loss']:.4f}"
        progress.update(self._samples, postfix)

    def _validate_finished_epochs(self):
        """Ends each epoch whose samples have all been trained (evaluates the center, calls
        the callbacks' ``on_epoch_end``, then ``on_epoch_begin`` of the next)."""
        if self.validator is None or self.stopped_by_callback or self.end_of_epoch_error:
            return
        # The last epoch: the returned model, at the end.
        finished = min(self._finished_epochs(), self.num_epoch - 1)
        if finished <= self._validated_epochs:
            return
        # Read after the records that ended the epochs: the workers' metric state of
        # their steps came before them.
        metric_states = self.server.sink.metric_states_snapshot()
        # Records arrive a few times a second: when they show several epochs done at once
        # (short epochs, the last ones ending together, or a validation that took longer
        # than an epoch), each still ends, so the callbacks count every epoch
        # (EarlyStopping's patience), each with the loss and metrics of its own steps
        # (records say their epoch) and on the center its end reached, where the server
        # kept it (else the center now, where several epochs end on the same one).
        for epoch in range(self._validated_epochs + 1, finished + 1):
            self._validated_epochs = epoch
            weights, samples = self._state_at_end(epoch)
            logs = epoch_logs((record for record in self._epoch_records
                               if record.get("epoch", epoch - 1) == epoch - 1),
                              of_epoch(metric_states, epoch - 1))
            self._epoch_records = [record for record in self._epoch_records
                                   if record.get("epoch", epoch - 1) > epoch - 1]
            if not self._end_epoch(weights, epoch, logs, samples):
                return

    def _state_at_end(self, epoch):
        """A copy of the center variable as ``epoch`` ended and the samples trained then,
        where the server kept them (see `HistorySink.track_epochs`), else the
        center as it is now and the samples seen so far."""
        end = self.server.sink.epoch_end(epoch)
        with self.server.mutex:  # a copy: commits go on while it is evaluated
            center, samples = end if end is not None else \
                (self.server.center_variable, self._samples)
            return [np.array(weight) for weight in center], samples

    def _finished_epochs(self):
        """Epochs every worker has finished: one that started late, or went slower, holds
        the end back (the samples of all of them together would not)."""
        if self.num_tasks is None or not self._worker_epochs:
            return int(self._samples * self.num_epoch // self.total_samples)
        done = self.server.sink.finished()
        return min(self.num_epoch if worker in done else self._worker_epochs.get(worker, 0)
                   for worker in range(self.num_tasks))

    def _end_epoch(self, weights, epoch, logs, samples):
        """Validates and calls back one epoch's end (``logs``: the steps' mean loss and
        metrics; ``samples``: those trained into ``weights``); returns whether training
        goes on."""
        logs = dict(logs)
        try:
            self.validator.evaluate(weights, epoch, samples, logs.pop("loss", None), logs)
            if not self.validator.stop_requested:
                self.validator.epoch_begin(epoch + 1)
                rate = self.validator.learning_rate()
                if rate is not None:  # the workers take it at their next pull
                    self.server.center.optimizer_learning_rate = rate
        # Any, KeyboardInterrupt and SystemExit too: the user's callbacks run here, on a
        # thread that they would end silently while the training went on; train() raises it.
        except BaseException as error:  # noqa: B036
            self.end_of_epoch_error = (epoch, error)
            logger.error("The end of epoch %d failed (validation or a callback): %s; "
                         "stopping the workers", epoch, error)
            self._stop_workers()
            return False
        if self.validator.stop_requested:
            self.stopped_by_callback = f"a callback stopped the training after epoch {epoch}"
            logger.info("Stopping the workers: %s", self.stopped_by_callback)
            self._stop_workers()
            return False
        return True

    def _stop_workers(self):
        cancel_jobs(self.spark, self.job_tag)
        self._done.set()

    def _checkpoint(self):
        if self.server.num_updates == self._checkpointed_updates:
            return  # nothing new since the last one
        try:
            updates = save_checkpoint(self.checkpoint_dir, self.server, self.name)
            self._checkpointed_updates = updates
            logger.info("Checkpoint at %s updates in %s", updates, self.checkpoint_dir)
        except Exception as error:  # a full disk must not kill the training it protects
            logger.warning("Could not write a checkpoint to %s: %s", self.checkpoint_dir, error)

    def _check_stall(self):
        never = float("inf")
        idle = self.server.transport.idle_workers(self.worker_timeout, startup_limit=never)
        if idle:
            worker, seconds = idle[0]
            self.stalled = (f"worker {worker} sent nothing for {seconds:.0f} s "
                            f"(worker_timeout={self.worker_timeout})")
        else:
            # A worker that hangs before its first step (compiling it, reading its first
            # rows) or while it compiles a step is named too, after an allowance that
            # compiles on a busy executor fit in.
            startup = max(self.worker_timeout, self.STARTUP_TIMEOUT)
            idle = self.server.transport.idle_workers(never, startup_limit=startup)
            if not idle:
                return False
            worker, seconds = idle[0]
            self.stalled = (f"worker {worker} sent nothing for {seconds:.0f} s while "
                            f"starting or compiling a step (allowed: {startup:g} s; "
                            f"worker_timeout={self.worker_timeout} counts between steps)")
        logger.error("Stopping the training: %s", self.stalled)
        cancel_jobs(self.spark, self.job_tag)
        return True
