"""One run of `train()`: the state it owns from its start to its results.

A `Run` is made by each `train()` call and owned by it alone: the settings it resolved,
the validator, the step history, the workers' metric states, the server, the optimizer's
state, the timings. Two calls on one trainer (threads) each own one, so they need no lock.
At its end the run leaves a `RunResults`, plain data that the trainer's getters read and
that pickles and copies with the trainer.
"""

import dataclasses
from typing import Optional

import numpy as np

from distkeras.errors import TrainingError
from distkeras.training import epoch_metrics
from distkeras.training.validator import epoch_logs


@dataclasses.dataclass(frozen=True)
class RunResults:
    """What a finished run leaves on its trainer (plain data: it pickles).

    Attributes:
        history: The step records (see `Trainer.get_history`).
        training_time: Wall-clock seconds of the run.
        validation_history: The validator's records (see `get_validation_history`).
        staleness: Per commit, ``(worker_id, updates by others since its pull)``.
        num_updates: The commits the parameter server applied (0 without one).
        returned_validation: The validation records of the returned model(s).
    """

    history: list = dataclasses.field(default_factory=list)
    training_time: Optional[float] = None
    validation_history: list = dataclasses.field(default_factory=list)
    staleness: list = dataclasses.field(default_factory=list)
    num_updates: int = 0
    returned_validation: list = dataclasses.field(default_factory=list)


class Run:
    """The state of one `train()`; the plan (`plans.Plan`) trains through it.

    Args:
        settings: The run's `settings.Settings`.
        label: The run's name in its progress, Spark jobs and result lines.
        verbose: The resolved verbosity (0, 1 or 2).
        checkpoint_dir: As `train()` takes it.
        checkpoint_every: As `train()` takes it.
        resume: As `train()` takes it.
        name: The trainer's class name, for messages and checkpoints.
        workers_optimizer: The optimizer the workers train with and the returned model
            is compiled with (`worker_setup.workers_optimizer`); None: the settings'
            ``worker_optimizer``.
    """

    def __init__(self, settings, label, verbose, checkpoint_dir=None,
                 checkpoint_every=60.0, resume=False, name="Trainer", workers_optimizer=None):
        self.settings = settings
        self.name = name
        self.workers_optimizer = settings.worker_optimizer if workers_optimizer is None \
            else workers_optimizer
        self.label = label
        self.verbose = verbose
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.resume = resume
        self.validator = None
        self.progress_total = None  # samples the progress counts to, where counted
        self.history = []
        self.metric_states = []  # the workers' metric state per epoch (`epoch_metrics`)
        self.training_time = None
        self.server = None  # the run's parameter server, epoch or averaging server
        self.optimizer_state = None  # SingleTrainer's: the trained optimizer's state
        self.trained_optimizer = None  # the returned model's, once it holds that state
        self.custom_objects = {}
        self.sample_weight_col = None
        self.class_table = None
        self.worker_host = None  # the driver's address the workers reach a server at
        self.returned_records = []  # the validation records of the returned model(s)

    # -- results ------------------------------------------------------------------------

    def validation_history(self):
        """The validator's records so far (a new list)."""
        return list(self.validator.records) if self.validator is not None else []

    def results(self):
        """The `RunResults` this run leaves on its trainer."""
        server = self.server
        return RunResults(history=list(self.history), training_time=self.training_time,
                          validation_history=self.validation_history(),
                          staleness=list(getattr(getattr(server, "center", None), "staleness",
                                                 None) or []),
                          num_updates=getattr(server, "num_updates", 0) if server else 0,
                          returned_validation=list(self.returned_records))

    def returned_validation(self, validated):
        """The validation records of the returned model(s): the one the validator says
        describes the weights its callbacks left (an ``EarlyStopping`` that restored its
        best epoch's), else those evaluated after the first ``validated`` records."""
        returned = getattr(self.validator, "returned_record", None)
        return [returned] if returned is not None else self.validation_history()[validated:]

    # -- epoch ends ---------------------------------------------------------------------

    def trained_so_far(self, worker_id=None, epochs=1):
        """Samples in the history (of one worker, if given) and the loss and metrics
        (`epoch_logs`) of its last ``1 / epochs`` of them (the last epoch's, in
        time order)."""
        records = [record for record in self.history if not record.get("superseded")
                   and (worker_id is None or record["worker_id"] == worker_id)]
        counts = np.cumsum([record.get("batch_size", 0) for record in records])
        total = int(counts[-1]) if len(counts) else 0
        start = total * (epochs - 1) / epochs
        states = [] if worker_id is not None else epoch_metrics.of_epoch(
            self.metric_states, epochs - 1)
        return total, epoch_logs(
            (record for record, count in zip(records, counts) if count > start), states)

    def begin_epoch(self, epoch):
        """Calls the callbacks' ``on_epoch_begin`` before ``epoch`` (1-based), where the
        driver starts each epoch."""
        if self.validator is None:
            return
        try:
            self.validator.epoch_begin(epoch)
        except Exception as cause:  # the user's callback, as at an epoch's end
            raise TrainingError(f"The start of epoch {epoch} failed (a callback): "
                                f"{type(cause).__name__}: {cause}") from cause

    def validate_epoch(self, weights, epoch, epoch_records=()):
        """Runs the end of ``epoch`` (1-based) on the weights reached, when validating or
        calling back; returns whether a callback asked to stop."""
        if self.validator is None:
            return False
        samples, _ = self.trained_so_far()
        logs = epoch_logs(epoch_records, epoch_metrics.of_epoch(
            self.metric_states, epoch - 1))
        try:
            self.validator.evaluate(weights, epoch, samples, logs.pop("loss", None), logs)
        except Exception as cause:  # the user's callback: say where it failed, keep its error
            raise TrainingError(f"The end of epoch {epoch} failed (validation or a callback): "
                                f"{type(cause).__name__}: {cause}") from cause
        return self.validator.stop_requested

    def end_epoch_in_job(self, server, epoch, weights, failures):
        """The driver's end of ``epoch`` (1-based) while the workers of one job wait on
        ``server``: validation and callbacks, then the next epoch's start. Returns
        whether to stop; an error is kept in ``failures`` (and stops)."""
        if epoch >= self.settings.num_epoch:
            return False  # the last: the returned model is validated at the end
        self.history = server.sink.history_snapshot()
        self.metric_states = server.sink.metric_states_snapshot()
        records = [record for record in self.history if record.get("epoch") == epoch - 1]
        try:
            if self.validate_epoch(list(weights), epoch, records):
                return True
            self.begin_epoch(epoch + 1)
        except TrainingError as error:
            failures.append(error)
            return True
        except BaseException as interrupt:  # noqa: B036 - see below
            # A callback's KeyboardInterrupt or SystemExit: this runs on a server thread,
            # where it would only end that thread while the training went on; kept,
            # it stops the workers and train() raises it, as fit lets it through.
            failures.append(interrupt)
            return True
        return False

    def learning_rate_of_callbacks(self):
        """The learning rate that ``LearningRateScheduler`` or ``ReduceLROnPlateau`` left
        on the driver's model (the workers' optimizers take it for the next epoch), or None
        without such a callback."""
        return None if self.validator is None else self.validator.learning_rate()

    def own_callbacks(self):
        """The user's callbacks that are not Keras's own (LambdaCallback counts as own)."""
        callbacks = getattr(self.validator, "user_callbacks", ())
        return [callback for callback in callbacks
                if not type(callback).__module__.startswith("keras.")
                or type(callback).__name__ == "LambdaCallback"]

    def validation_records(self):
        """The validator's live list of records, for the monitor; None without one."""
        return getattr(self.validator, "records", None)
