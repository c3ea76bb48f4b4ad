"""Trainers: the driver side. Validate, start the parameter server, run the Spark job,
collect the history and return a compiled Keras model.

Every trainer is used the same way::

    trainer = ADAG(keras_model=mlp, worker_optimizer="adam", loss="categorical_crossentropy",
                   metrics=["accuracy"], num_workers=2, batch_size=32, communication_window=12)
    model = trainer.train(dataframe)

The checks of a trainer's settings are in `distkeras.training_checks`, and the plumbing of
its Spark jobs (the task function, the replies, the driver's addresses, the runs' labels)
in `distkeras.training_jobs`. `TrainingError`, defined in `distkeras.errors`, is
re-exported here: users catch it as ``distkeras.trainers.TrainingError``.
"""

import contextlib
import copy
import logging
import math
import threading
import time

import numpy as np

from distkeras import affinity
from distkeras import algorithms
from distkeras import batch_statistics
from distkeras import compat
from distkeras import custom_objects
from distkeras.data import dataframes
from distkeras import epoch_metrics
from distkeras.epochs import Replay
from distkeras import model_state
from distkeras import networking
from distkeras import parameter_servers
from distkeras.data import parquet_source
from distkeras.data import sample_weights
from distkeras import step_history
from distkeras import validation
from distkeras import workers
from distkeras.errors import TrainingError
from distkeras.monitor import TrainingMonitor, report_returned_validation, resolve_verbose
from distkeras.training_checks import (_check_columns, _check_communication_window,
                                       _check_int, _check_number,
                                       _check_optimizer_tracks_trainable, _compiled_with,
                                       _compiled_without_loss, _default_metrics,
                                       _is_classification_loss, _steps_taken, _uses_ema)
from distkeras.training_jobs import (UNRETRYABLE, _arrow_training_job, _begin_run, _end_run,
                                     _feed_batch_rows, _joined_replies,
                                     _raise_reported_failure, _register_user_module,
                                     _worker_error_message, bind_address, driver_address,
                                     warn_if_speculative, warn_if_uneven)
from distkeras.utils import average_history, check_compile_arguments

logger = logging.getLogger(__name__)


# With validation or callbacks, workers report (and the monitor looks) this often, so that
# the end of an epoch is seen within about this long.
VALIDATING_REPORT_SECONDS = 0.1


class Trainer(compat.TrainerAccessors):
    """Base of every trainer: stores the settings and the results of the last run.

    Args:
        keras_model: The `keras.Model` to train (left untouched; training uses a copy).
        worker_optimizer: The Keras optimizer of every replica (name, instance or config);
            None: the one ``keras_model`` was compiled with.
        loss: The Keras loss (name, instance or config); None: the one ``keras_model`` was
            compiled with.
        metrics: Metrics recorded at every step, as for ``model.compile``: a list, a list
            per output, or a dict by output name. None: those ``keras_model`` was compiled
            with; for a model not compiled, an accuracy if it has one output trained
            with a classification loss (binary accuracy, at the loss's threshold, for a
            binary cross-entropy on logits or on several units), none otherwise.
        loss_weights: Optional loss weights for multi-output models; None: those
            ``keras_model`` was compiled with, if any.
        features_col: Input column, or a list of columns for a multi-input model (in the
            order of ``model.inputs``), or a dict keyed by the inputs' names.
        label_col: Target column, or a list of columns for a multi-output model (in the
            order of ``model.outputs``), or a dict keyed by the outputs' names; None for
            a model compiled with ``loss=None``, trained as ``fit(x)`` without targets.
        batch_size: Rows per minibatch.
        num_epoch: Passes over the data.
    """

    # Whether the returned weights are an average no replica trained with (an elastic
    # center, a mean): their BatchNormalization statistics are then measured again
    # (`batch_statistics`), as no replica's describe them.
    averages_weights = False

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 loss_weights=None, features_col="features", label_col="label",
                 batch_size=32, num_epoch=1):
        self.master_model = keras_model
        self.worker_optimizer = worker_optimizer
        self.loss = loss
        self.metrics = list(metrics) if isinstance(metrics, tuple) else metrics
        self.loss_weights = loss_weights
        self.features_col = features_col
        self.label_col = label_col
        self.batch_size = batch_size
        self.num_epoch = num_epoch
        self.training_time = None
        self.history = []
        self._validator = None
        self.verbose = 1
        self._progress_total = None
        self._run_lock = threading.RLock()

    def __getstate__(self):
        import types

        state = dict(self.__dict__)
        state.pop("_run_lock", None)  # a lock cannot be copied or pickled: a new one
        # The last run's validator and parameter server hold locks, sockets and threads:
        # a copy keeps what `get_validation_history()` and `get_staleness()` return.
        validator = state.get("_validator")
        if validator is not None:
            state["_validator"] = types.SimpleNamespace(records=list(validator.records))
        server = state.get("parameter_server")
        if server is not None:
            state["parameter_server"] = types.SimpleNamespace(
                staleness=list(getattr(server, "staleness", [])))
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._run_lock = threading.RLock()

    # -- configuration ------------------------------------------------------------------

    def get_config(self):
        """The trainer's settings as a JSON-able dict (the model is not included)."""
        from distkeras.utils import serialize_keras_object

        return {
            "worker_optimizer": serialize_keras_object(self.worker_optimizer),
            "loss": serialize_keras_object(self.loss),
            "metrics": serialize_keras_object(self.metrics),
            "loss_weights": self.loss_weights,
            "features_col": self.features_col,
            "label_col": self.label_col,
            "batch_size": self.batch_size,
            "num_epoch": self.num_epoch,
        }

    @classmethod
    def from_config(cls, config, keras_model=None):
        """Builds a trainer from `get_config()` output and a model."""
        return cls(keras_model=keras_model, **config)

    def validate_arguments(self):
        """Raises a clear error for any setting out of range."""
        import keras

        if not isinstance(self.master_model, keras.Model):
            raise TypeError(
                "`keras_model` must be a keras.Model. "
                f"Received: keras_model={type(self.master_model).__name__}")
        self._use_compiled_settings()
        required = ["worker_optimizer"]
        if not _compiled_without_loss(self.master_model):
            required.append("loss")
        for name in required:
            if getattr(self, name) is None:
                example = "'adam'" if name == "worker_optimizer" else \
                    "'categorical_crossentropy'"
                raise ValueError(f"`{name}` is required, for example {name}={example}, unless "
                                 "keras_model is compiled (its own is then used).")
        _check_int("batch_size", self.batch_size)
        _check_int("num_epoch", self.num_epoch)
        # A dict keyed by the model's input (output) names, as `fit` takes x (y), becomes
        # the list of its columns in the model's order.
        self.features_col = dataframes.columns_by_name(
            self.features_col, self.master_model, "inputs", "features_col")
        self.label_col = dataframes.columns_by_name(
            self.label_col, self.master_model, "outputs", "label_col")
        _check_columns("features_col", self.features_col)
        if self.label_col is None:
            self._check_no_labels()
        else:
            _check_columns("label_col", self.label_col)

    def _check_no_labels(self):
        """``label_col=None`` trains as ``fit(x)`` does, without targets: only a model
        whose loss is its own (compiled with ``loss=None``), which Keras trains so."""
        if not _compiled_without_loss(self.master_model) or self.loss is not None:
            raise ValueError(
                "label_col=None trains without targets, as fit(x) does: only a model whose "
                "loss is its own (compiled with loss=None, its loss from add_loss, its "
                f"train_step or compute_loss). This one trains with loss={self.loss!r}: "
                "name its target column (an autoencoder's features: label_col='features').")

    def _use_compiled_settings(self):
        """Takes the optimizer, loss, metrics and loss weights that were not given from
        the model, when it was compiled (what its `fit` would train with), and its
        weighted metrics (``compile(weighted_metrics=...)``) always; metrics not
        given for a model not compiled are an accuracy for one output trained with a
        classification loss (`_default_metrics`), else none (an accuracy of a regression
        reads 0)."""
        model = self.master_model
        # Not a setting of its own: only a compiled model's, measured as its fit would.
        self._weighted_metrics = None
        if getattr(model, "compiled", False):
            compiled = _compiled_with(model)
            self._weighted_metrics = compiled.get("weighted_metrics") or None
            if self.worker_optimizer is None:
                self.worker_optimizer = model.optimizer
            if self.loss is None:
                self.loss = model.loss
            if self.metrics is None:
                self.metrics = compiled.get("metrics") or []
            if self.loss_weights is None:
                self.loss_weights = compiled.get("loss_weights")
        if self.metrics is None:
            outputs = getattr(model, "outputs", None) or [None]
            self.metrics = _default_metrics(self.loss, model) if len(outputs) == 1 and \
                _is_classification_loss(self.loss) else []

    # -- results ------------------------------------------------------------------------

    def get_training_time(self):
        """Wall-clock seconds of the last `train()`."""
        return self.training_time

    def get_history(self):
        """One record per training step of the last `train()`.

        Returns:
            A list of dicts with ``worker_id``, ``iteration``, ``timestamp``,
            ``batch_size``, ``epoch``, the loss and the metrics.

        Notes:
            When Spark retried a worker's failed task, the records of its steps carry
            ``attempt``: the worker's attempts in the order they started, from 0. Those of
            the failed attempt's steps that the retry trained again carry
            ``superseded=True``. Their commits were applied to the center, but they do not
            count in the progress, the epochs' ends, `get_averaged_history` or
            `get_executor_history`.
        """
        return list(self.history)

    def get_averaged_history(self):
        """The history averaged over workers, step by step within each epoch.

        Returns:
            A dict of numpy arrays by name (``iteration``, ``epoch``, ``loss``, each
            metric, ``timestamp``, ...); see `distkeras.utils.average_history`.
        """
        return average_history(self.history)

    def get_executor_history(self, worker_id):
        """The step records of one worker, of its final attempt where Spark retried it.

        Args:
            worker_id: The worker's partition index.

        Returns:
            The worker's records, as `get_history` gives them. An id without records (a
            typo, or a worker whose partition had no rows) gives an empty list and a
            warning naming the ids that have records.
        """
        records = [record for record in self.history
                   if record["worker_id"] == worker_id and not record.get("superseded")]
        if not records and self.history:
            known = sorted({record["worker_id"] for record in self.history})
            logger.warning("get_executor_history(%r): no records of that worker; the workers "
                           "with records are %s (a worker whose partition had no rows has "
                           "none).", worker_id, known)
        return records

    # -- training -----------------------------------------------------------------------

    def train(self, dataframe, shuffle=False, verbose="auto", checkpoint_dir=None,
              checkpoint_every=60.0, resume=False, sample_weight_col=None, class_weight=None,
              validation_data=None, callbacks=None):
        """Trains on a Spark DataFrame and returns a compiled `keras.Model`.

        Args:
            dataframe: Rows with the feature and label columns.
            shuffle: Whether to shuffle the rows before each epoch. The orders are drawn
                from numpy's global generator: ``keras.utils.set_random_seed(n)``
                repeats them, as for ``fit``.
            verbose: Progress of the training (samples done, running loss and, where the
                workers exchange weights, commits per second), as in Keras: 1 a progress bar,
                2 a line every 30 seconds and at the end (for logs), 0 nothing; ``"auto"``
                is 1 in a terminal or a notebook and 2 elsewhere.
            checkpoint_dir: Parameter-server trainers only: a folder (any Hadoop path) where
                the center variable is saved every ``checkpoint_every`` seconds and at the end
                (also when the training fails or is interrupted).
            checkpoint_every: Seconds between two checkpoints.
            resume: Start from the checkpoint in ``checkpoint_dir`` (if there is one) instead
                of the model's weights. The epochs run again in full from those weights.
            sample_weight_col: A numeric column weighing each row's loss (as Keras's
                ``sample_weight``).
            class_weight: A dict from class index to the weight of that class's rows (as
                Keras's ``class_weight``; classes not named weigh 1). Multiplies with
                ``sample_weight_col``. Single-output models.
            validation_data: A DataFrame with the same columns, numpy arrays ``(x, y)``
                or ``(x, y, sample_weight)`` as for Keras's ``fit``, or a fraction of
                ``dataframe``'s rows to hold out at random; its rows are evaluated on the
                driver after each epoch and at the end (`get_validation_history()`).
            callbacks: Keras callbacks run on the driver at the end of each epoch (see
                `validation.Validator`), with ``val_*`` logs when ``validation_data`` is
                given and the training ``loss``: ``EarlyStopping`` stops the workers and
                returns the model (with ``restore_best_weights``, the best epoch's),
                ``ModelCheckpoint`` and ``CSVLogger`` save what they see.

        Returns:
            The trained model, compiled with ``worker_optimizer``, ``loss`` and ``metrics``.

        Raises:
            ValueError: A setting, a column or the model does not fit the data; raised on
                the driver, before any Spark job, naming what to change.
            distkeras.errors.InvalidDataError: A row no retry can train on (a null, NaN,
                an array of the wrong length, a label out of range), naming the column.
            distkeras.errors.TrainingError: A worker or the parameter server failed, or a
                worker stalled past ``worker_timeout``.
            distkeras.errors.DataSourceError: A file of a plain Parquet scan, which the
                workers read themselves (docs/parquet-feed.md), is gone.
        """
        # One run at a time: a run keeps its state on the trainer (copies of a Spark ML
        # estimator share one, and CrossValidator may fit them in parallel threads).
        # Reentrant: KerasEstimator holds it while its training Params are set.
        with self.__dict__.setdefault("_run_lock", threading.RLock()):
            run, self._label = _begin_run(type(self).__name__)
            try:
                return self._run(dataframe, shuffle, verbose, checkpoint_dir,
                                 checkpoint_every, resume, sample_weight_col, class_weight,
                                 validation_data, callbacks)
            finally:
                _end_run(run)

    def _run_label(self):
        """The name of this run in its progress, Spark jobs and result lines (see
        `_begin_run`); the class name outside `train()`."""
        return getattr(self, "_label", None) or type(self).__name__

    def _run(self, dataframe, shuffle, verbose, checkpoint_dir, checkpoint_every, resume,
             sample_weight_col, class_weight, validation_data, callbacks):
        self.verbose = resolve_verbose(verbose)
        self.checkpoint_dir, self.checkpoint_every, self.resume = \
            checkpoint_dir, checkpoint_every, resume
        self.validate_arguments()
        self._validate_checkpointing()
        dataframes.check_spark_dataframe(dataframe)
        callbacks = validation.check_callbacks(
            callbacks, type(self).__name__,
            learning_rate_callbacks=isinstance(
                self, (SingleTrainer, AveragingTrainer, AsynchronousDistributedTrainer)))
        dataframe, validation_frame = (dataframe, None) if validation_data is None \
            else validation.split(dataframe, validation_data)
        label_shapes = dataframes.validate(
            dataframe, self.master_model, self.features_col, self.label_col)
        self._check_settings(dataframe, label_shapes, sample_weight_col, class_weight)
        frame = dataframes.training_frame(dataframe, self.features_col, self.label_col,
                                          sample_weight_col)
        with custom_objects.scope(self._custom_objects):
            # Collecting and counting are Spark jobs of their own: done before the clock.
            self._validator = self._make_validator(validation_frame, callbacks)
            self._progress_total = self._samples_for_progress(frame) \
                if self.verbose or self._validator else None
            if self._validator is not None and self._progress_total:
                self._validator.set_steps_per_epoch(
                    math.ceil(self._progress_total / self.num_epoch / self.batch_size))
            start = time.time()
            self.history = []
            # The workers' metric state per epoch (`epoch_metrics`), for the epoch logs.
            self._metric_states = []
            if self._validator is not None:
                self._validator.begin()
            try:
                model = self._train(frame, label_shapes, shuffle)
            finally:
                self.training_time = time.time() - start
                self.history.sort(
                    key=lambda r: (r["timestamp"], r["worker_id"], r["iteration"]))
            model = self._compile(model)
            if self.averages_weights:
                batch_statistics.measure_again(model, dataframe, self.features_col,
                                               self.label_col)
            validated = len(self.get_validation_history())
            self._validate_returned(model)
            report_returned_validation(self._run_label(),
                                       self._returned_validation(validated),
                                       self.verbose)
            return model

    def _returned_validation(self, validated):
        """The validation records of the returned model(s): the one the validator says
        describes the weights its callbacks left (an ``EarlyStopping`` that restored its
        best epoch's), else those evaluated after the first ``validated`` records."""
        returned = getattr(self._validator, "returned_record", None)
        return [returned] if returned is not None else \
            self.get_validation_history()[validated:]

    def _check_settings(self, dataframe, label_shapes, sample_weight_col, class_weight):
        """Checks here what would fail on every executor; keeps what the workers need (the
        custom objects, the weight column, the class weights)."""
        self._custom_objects = self._find_custom_objects()
        output_shapes = [tuple(tensor.shape[1:]) for tensor in self.master_model.outputs]
        check_compile_arguments(self.worker_optimizer, self.loss, self.metrics, label_shapes,
                                output_shapes, self.loss_weights)
        if self.label_col is None and (sample_weight_col is not None
                                       or class_weight is not None):
            # fit(x, sample_weight=w) drops the weights (y is None: x alone reaches the step).
            raise ValueError(
                "sample_weight_col and class_weight weigh the rows' targets: with "
                "label_col=None there are none (Keras's fit(x) drops sample weights without y). "
                "Name a label column, or leave the weights out.")
        self._sample_weight_col = sample_weight_col
        self._class_table = sample_weights.validate(
            dataframe, sample_weight_col, class_weight,
            dataframes.as_column_list(self.features_col)
            + dataframes.as_column_list(self.label_col), label_shapes, output_shapes)

    def _make_validator(self, validation_frame, callbacks):
        """A `validation.Validator` for the validation rows and the callbacks, or None
        without either."""
        if validation_frame is None and not callbacks:
            return None
        from distkeras.utils import deserialize_model, serialize_model

        if callbacks and isinstance(self, EnsembleTrainer):
            raise ValueError("EnsembleTrainer trains independent models: callbacks, which "
                             "watch one model, do not apply. Use validation_data alone.")
        if callbacks:
            validation.warn_of_step_mean_metrics(self.metrics)
        x = y = weights = None
        if isinstance(validation_frame, tuple):
            x, y, weights = self._validation_arrays(validation_frame)
        elif validation_frame is not None:
            x, y, weights = validation.collect(validation_frame, self.master_model,
                                               self.features_col, self.label_col,
                                               self._sample_weight_col)
            self._check_validation_labels(y)
        # Trainer's own: EnsembleTrainer's compiles a list.
        model = Trainer._compile(self, deserialize_model(serialize_model(self.master_model)))
        # In minibatches of the training's size, as `fit` validates (its
        # validation_batch_size defaults to batch_size): a loss summed per minibatch
        # (reduction="sum"), or averaged over the elements it does not ignore (ignore_class),
        # is a mean over minibatches whose value depends on their size.
        return validation.Validator(model, x, y, batch_size=self.batch_size,
                                    callbacks=callbacks, num_epoch=self.num_epoch,
                                    sample_weight=weights)

    def _validation_arrays(self, arrays):
        """Keras-style ``(x, y[, sample_weight])`` validation arrays as ``(x, y,
        sample_weight)``, checked against the model and the loss (class indices with a
        one-hot loss would fail at the first epoch's end)."""
        x, y, weights = validation.from_arrays(arrays, self.master_model)
        self._check_validation_labels(y)
        return x, y, weights

    def _check_validation_labels(self, y):
        """Checks the validation labels against the loss, as the training labels are
        (class indices with a one-hot loss, or one-hot labels with a sparse loss, would
        fail at the first epoch's end, after it trained).

        Args:
            y: The validation labels as the model is evaluated on them: an array, or a
                list of arrays for several outputs.

        Raises:
            ValueError: Saying that the validation data is at fault, and what to change.
        """
        if y is None:  # no targets (label_col=None), as for fit(x): nothing to check
            if self.label_col is not None or self.loss is not None:
                raise ValueError(
                    "validation_data holds no labels (y is None), but the model trains on "
                    f"label_col={self.label_col!r} with loss={self.loss!r}: give (x, y).")
            return
        labels = y if isinstance(y, list) else [y]
        output_shapes = [tuple(tensor.shape[1:]) for tensor in self.master_model.outputs]
        label_shapes = [label.shape[1:] if shape and shape[-1] > 1
                        and label.shape[1:] == shape[:-1] else shape
                        for label, shape in zip(labels, output_shapes)]
        try:
            check_compile_arguments(self.worker_optimizer, self.loss, self.metrics,
                                    label_shapes, output_shapes)
        except ValueError as error:
            raise ValueError(f"In validation_data: {error}") from error

    def _trained_so_far(self, worker_id=None, epochs=1):
        """Samples in the history (of one worker, if given) and the loss and metrics
        (`validation.epoch_logs`) of its last ``1 / epochs`` of them (the last epoch's, in
        time order)."""
        records = [record for record in self.history if not record.get("superseded")
                   and (worker_id is None or record["worker_id"] == worker_id)]
        counts = np.cumsum([record.get("batch_size", 0) for record in records])
        total = int(counts[-1]) if len(counts) else 0
        start = total * (epochs - 1) / epochs
        states = [] if worker_id is not None else epoch_metrics.of_epoch(
            getattr(self, "_metric_states", []), epochs - 1)
        return total, validation.epoch_logs(
            (record for record, count in zip(records, counts) if count > start), states)

    def _begin_epoch(self, epoch):
        """Calls the callbacks' ``on_epoch_begin`` before ``epoch`` (1-based), where the
        driver starts each epoch."""
        if self._validator is None:
            return
        try:
            self._validator.epoch_begin(epoch)
        except Exception as cause:  # the user's callback, as at an epoch's end
            raise TrainingError(f"The start of epoch {epoch} failed (a callback): "
                                f"{type(cause).__name__}: {cause}") from cause

    def _validate_epoch(self, weights, epoch, epoch_records=()):
        """Runs the end of ``epoch`` (1-based) on the weights reached, when validating or
        calling back; returns whether a callback asked to stop."""
        if self._validator is None:
            return False
        samples, _ = self._trained_so_far()
        logs = validation.epoch_logs(epoch_records, epoch_metrics.of_epoch(
            self._metric_states, epoch - 1))
        try:
            self._validator.evaluate(weights, epoch, samples, logs.pop("loss", None), logs)
        except Exception as cause:  # the user's callback: say where it failed, keep its error
            raise TrainingError(f"The end of epoch {epoch} failed (validation or a callback): "
                                f"{type(cause).__name__}: {cause}") from cause
        return self._validator.stop_requested

    def _validate_returned(self, model):
        """Evaluates the returned model (each member of a list, as `member` i), and ends
        its training (`_finalize_weights`) where `fit` does: after the last epoch's
        validation and callbacks, before the callbacks' ``on_train_end``."""
        if self._validator is None:
            if not isinstance(model, list):
                self._finalize_weights(model)
            return
        if isinstance(model, list):
            for member, each in enumerate(model):
                samples, _ = self._trained_so_far(member)
                self._validator.evaluate_model(each, self.num_epoch, samples, member=member)
            return
        epochs = self._validator.stopped_epoch or self.num_epoch
        samples, logs = self._trained_so_far(epochs=epochs)
        self._validator.end(model, samples, logs.pop("loss", None), logs,
                            finalize=self._finalize_weights)

    def _finalize_weights(self, model):
        """Gives the returned ``model`` the weights `fit` ends with, from its optimizer's
        state; returns whether it changed them (never here: the optimizer of the
        distributed trainers' model is fresh)."""
        return False

    def get_validation_history(self):
        """One record per evaluation of the validation data in the last `train()`.

        Returns:
            A list of dicts with ``epoch``, ``samples``, ``timestamp``, ``loss`` (the
            epoch's mean step loss, where known), ``val_loss`` and ``val_<metric>``.
        """
        validator = getattr(self, "_validator", None)
        return list(validator.records) if validator is not None else []

    def _find_custom_objects(self):
        """The user's own layers, losses, metrics the executors need; checked here first."""
        from distkeras.utils import serialize_keras_object, serialize_model

        compile_objects = (self.worker_optimizer, self.loss, self.metrics)
        found, unresolved = custom_objects.find(
            self.master_model, compile_objects + (self._weighted_metrics,))
        # Keras's own objects rebuild, but for those holding Python code (a Lambda's).
        if found or unresolved or custom_objects.holds_python_code(self.master_model):
            custom_objects.check_rebuildable(
                serialize_model(self.master_model),
                [serialize_keras_object(obj) for obj in compile_objects]
                + [self.loss_weights, serialize_keras_object(self._weighted_metrics)],
                found, unresolved)
        return found

    def _train(self, frame, label_shapes, shuffle):
        raise NotImplementedError

    def _learning_rate_of_callbacks(self):
        """The learning rate that ``LearningRateScheduler`` or ``ReduceLROnPlateau`` left
        on the driver's model (the workers' optimizers take it for the next epoch), or None
        without such a callback."""
        return None if self._validator is None else self._validator.learning_rate()

    def _own_callbacks(self):
        """The user's callbacks that are not Keras's own (LambdaCallback counts as own)."""
        callbacks = getattr(self._validator, "user_callbacks", ())
        return [callback for callback in callbacks
                if not type(callback).__module__.startswith("keras.")
                or type(callback).__name__ == "LambdaCallback"]

    def _slots_for_one_job(self, frame, num_tasks):
        """Whether Spark can run ``num_tasks`` tasks at once and keep them waiting at the
        epochs' ends: callbacks run meanwhile, and one of the user's own might start a
        Spark job, which needs a slot more (Keras's don't)."""
        slots = affinity.concurrent_task_slots(frame.sparkSession.sparkContext)
        needed = num_tasks + (1 if self._own_callbacks() else 0)
        return slots is not None and slots >= needed

    def _end_epoch_in_job(self, server, epoch, weights, failures):
        """The driver's end of ``epoch`` (1-based) while the workers of one job wait on
        ``server``: validation and callbacks, then the next epoch's start. Returns
        whether to stop; an error is kept in ``failures`` (and stops)."""
        if epoch >= self.num_epoch:
            return False  # the last: the returned model is validated at the end
        self.history = server.history_snapshot()
        self._metric_states = server.metric_states_snapshot()
        records = [record for record in self.history if record.get("epoch") == epoch - 1]
        try:
            if self._validate_epoch(list(weights), epoch, records):
                return True
            self._begin_epoch(epoch + 1)
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

    def _run_epoch_server(self, server, worker, layout, num_tasks, label_shapes,
                          description, replay, failures, barrier=False):
        """Runs every epoch in one Spark job whose workers meet ``server`` (an
        `AveragingServer`) at each epoch's end (the first epoch begun by the caller); the
        history ends up in ``self.history``.

        Raises:
            TrainingError: A worker's error, the driver's end of an epoch (kept in
                ``failures``) or the server's.
        """
        spark = layout.sparkSession
        server.host = bind_address(spark)
        server.expect_workers(num_tasks)
        self.parameter_server = server
        self._configure_worker(worker)
        job_group = self._new_job_group()
        server.start()
        worker.master_host, worker.master_port = driver_address(spark), server.port
        worker.token = server.token
        server.on_worker_failure = \
            lambda worker_id, error: spark.sparkContext.cancelJobGroup(job_group)
        monitor = TrainingMonitor(
            server, spark.sparkContext, job_group, self._progress_total, self.verbose,
            name=self._run_label(),
            validation_records=getattr(self._validator, "records", None))
        monitor.start()
        try:
            self._run_workers(layout, num_tasks, worker, label_shapes, description,
                              job_group, replay, barrier=barrier)
            server.wait_for_goodbyes(timeout=10.0)
        except TrainingError as error:
            _raise_reported_failure(server, error)
            raise
        finally:
            monitor.stop()
            server.stop()
            self.history = list(server.history)  # what was trained, even when it failed
            self._metric_states = list(server.metric_states)
        if failures:
            raise failures[0]
        if server.errors:
            raise TrainingError(f"The {type(server).__name__} failed: {server.errors[0]}")

    def _new_job_group(self):
        """A Spark job group of its own for one run of workers (to cancel them as one)."""
        return f"distkeras-{id(self)}-{time.time_ns()}"

    def _samples_for_progress(self, frame):
        """Samples the progress bar counts to; None where a trainer shows no bar."""
        return frame.count() * self.num_epoch

    @contextlib.contextmanager
    def _progress(self, spark, worker, samples, description, job_group, num_tasks=1):
        """A `HistoryServer` the sequential workers (no parameter server) report their
        steps to, with ``verbose`` and a `TrainingMonitor` drawing them, and for
        ``num_tasks`` of them (EnsembleTrainer's members, AveragingTrainer's replicas of
        an epoch) whatever the verbosity: a worker that meets rows no retry can train on
        tells it, and the driver stops the others at once, as the parameter-server
        trainers' do, rather than let them train to their end before the error. Yields
        the list the reported steps end up in.

        Raises:
            TrainingError: Naming the partition whose worker reported its failure.
        """
        reported = []
        progress = bool(self.verbose and samples)
        if not progress and num_tasks < 2:
            yield reported
            return
        server = parameter_servers.HistoryServer(self.master_model)
        server.host = bind_address(spark)
        server.expect_workers(num_tasks)
        server.on_worker_failure = \
            lambda worker_id, error: spark.sparkContext.cancelJobGroup(job_group)
        server.start()
        worker.progress_address = (driver_address(spark), server.port)
        worker.token = server.token
        monitor = TrainingMonitor(server, spark.sparkContext, job_group, samples,
                                  self.verbose, name=description, validation_records=getattr(
                                      self._validator, "records", None)) if progress else None
        if monitor is not None:
            monitor.start()
        try:
            yield reported
            server.wait_for_goodbyes(timeout=10.0)  # the last records, sent at the end
        except TrainingError as error:
            _raise_reported_failure(server, error)
            raise
        finally:
            if monitor is not None:
                monitor.stop()
            server.stop()
            reported.extend(server.history)
            self._metric_states.extend(server.metric_states)

    def _validate_checkpointing(self):
        if self.checkpoint_dir is not None or self.resume:
            raise ValueError(
                f"{type(self).__name__} keeps no center variable to checkpoint: "
                "checkpoint_dir and resume need a parameter-server trainer (ADAG, DOWNPOUR, "
                "AEASGD, EAMSGD, DynSGD, Experimental or your own).")

    def _compile(self, model):
        from distkeras.utils import (compile_arguments, optimizer_as_compiled,
                                     serialize_keras_object)

        # From configs, so the returned model never shares optimizer state with objects the
        # user passed in; the optimizer as the workers had it (see `optimizer_as_compiled`).
        model.compile(**compile_arguments(
            optimizer_as_compiled(self._workers_optimizer(), self.master_model),
            serialize_keras_object(self.loss),
            serialize_keras_object(self.metrics), self.loss_weights,
            serialize_keras_object(getattr(self, "_weighted_metrics", None)), model=model),
            **self._execution_options())
        # Built now, as after `fit`: a saved model then holds the optimizer's variables,
        # and loading it does not warn that their number differs.
        model.optimizer.build(model.trainable_variables)
        return model

    def _workers_optimizer(self):
        """The optimizer (a name, an instance or a config) the workers and the returned
        model train with: ``worker_optimizer``."""
        return self.worker_optimizer

    def _execution_options(self):
        """How the given model, if compiled, runs its later `fit`, `evaluate` and `predict`
        (``jit_compile``, ``steps_per_execution``, ``run_eagerly``): the returned model keeps
        them, and the workers run their steps with its ``jit_compile`` and ``run_eagerly``
        (a Python side effect in ``train_step`` or a layer's ``call`` then happens at every
        step, as in its `fit`; JAX's window of steps in one compiled call needs both on).
        A ``steps_per_execution`` above 1 makes them run each window in one compiled call
        (see `jax_steps.CallLength`)."""
        model = self.master_model
        if not getattr(model, "compiled", False):
            return {}
        config = model.get_compile_config() or {}
        return {name: config[name] for name in ("jit_compile", "steps_per_execution",
                                                "run_eagerly") if name in config}

    def _configure_worker(self, worker):
        """Fills the worker's unset settings from the trainer's."""
        import keras

        from distkeras.utils import optimizer_as_compiled, serialize_keras_object

        defaults = {
            "optimizer": optimizer_as_compiled(self._workers_optimizer(), self.master_model),
            "loss": self.loss,
            "loss_weights": self.loss_weights, "metrics": self.metrics,
            "features_col": self.features_col, "label_col": self.label_col,
            "batch_size": self.batch_size, "num_epoch": self.num_epoch,
        }
        for name, value in defaults.items():
            if getattr(worker, name, None) is None:
                setattr(worker, name, serialize_keras_object(value))
        worker.backend = keras.backend.backend()
        worker.custom_objects = dict(getattr(self, "_custom_objects", None) or {})
        worker.weighted_metrics = serialize_keras_object(
            getattr(self, "_weighted_metrics", None))
        worker.execution_options = {
            name: value for name, value in self._execution_options().items()
            if name in ("jit_compile", "run_eagerly", "steps_per_execution")}
        worker.sample_weight_col = getattr(self, "_sample_weight_col", None)
        # The `.keras` bytes leave them out: without them each worker's Dropout would draw
        # from its executor's own seed (see `model_state.seed_states`).
        worker.seed_states = model_state.seed_states(self.master_model)
        worker.class_table = getattr(self, "_class_table", None)
        _register_user_module(worker)

    def _run_workers(self, frame, num_tasks, worker, label_shapes, description,
                     job_group=None, replay=None, barrier=False):
        """Runs one Spark task per partition of ``frame`` (``num_tasks`` of them, as laid
        out by `dataframes.lay_out`), each over its partition as ``replay`` (an
        `epochs.Replay`; default: once); returns the workers' messages. With ``barrier``,
        Spark starts the tasks together (and restarts them together)."""
        import pyarrow as pa  # noqa: F401  (fail early on the driver if Arrow is missing)

        context = frame.sparkSession.sparkContext
        if job_group is not None:
            context.setJobGroup(job_group, description, interruptOnCancel=True)
        else:
            context.setJobDescription(description)
        worker.workers_per_machine = affinity.workers_per_machine(context, num_tasks)
        job = frame.mapInArrow(_arrow_training_job(worker, label_shapes,
                                                   replay or Replay()),
                               "worker_id long, chunk int, chunks int, payload binary",
                               barrier=barrier)
        if barrier:
            # Spark restarts a failed barrier stage only when a shuffle follows it (it
            # aborts a failed barrier result stage): the workers' small replies take one.
            job = job.repartition(1)
        try:
            with _feed_batch_rows(frame.sparkSession):
                rows = job.collect()
        except KeyboardInterrupt:
            if job_group is not None:
                context.cancelJobGroup(job_group)
            raise
        except Exception as error:  # Spark wraps the worker's exception; surface it
            raise TrainingError(
                f"Training failed on an executor: {_worker_error_message(error)}") from error
        finally:
            context.setLocalProperty("spark.jobGroup.id", None)
            context.setJobDescription(None)
        messages = [networking.decode_message(reply)
                    for reply in _joined_replies(rows, num_tasks)]
        for message in messages:
            if UNRETRYABLE in message:
                raise TrainingError(f"Training failed on an executor: {message[UNRETRYABLE]}")
        warn_if_uneven(messages)
        return messages


class SingleTrainer(Trainer):
    """One replica trained on all the data in one Spark task: the baseline.

    Takes `Trainer`'s arguments. Positional arguments come in dist-keras's order
    (``features_col``, ``label_col``, ``num_epoch``, ``batch_size`` after ``metrics``).

    Notes:
        With validation data or callbacks, the driver evaluates and calls back at every
        epoch's exact end, as Keras's ``fit`` does. The task waits there on an
        `EpochServer`, then goes on with its weights and optimizer state. With no task
        slot to spare for a callback of the user's own, each epoch is a Spark task of its
        own instead, going on from the last one's.

        ``EarlyStopping`` stops before the next epoch starts. A learning rate that
        ``ReduceLROnPlateau`` or ``LearningRateScheduler`` sets applies to the next epoch.

        The dist-keras order lets code written for dist-keras train as written.
    """

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 features_col="features", label_col="label", num_epoch=1, batch_size=32,
                 loss_weights=None):
        super().__init__(keras_model, worker_optimizer, loss, metrics,
                         loss_weights=loss_weights, features_col=features_col,
                         label_col=label_col, batch_size=batch_size, num_epoch=num_epoch)

    def allocate_worker(self):
        return workers.SequentialWorker(self.master_model)

    def _train(self, frame, label_shapes, shuffle):
        from distkeras.utils import deserialize_model, serialize_model

        model = deserialize_model(serialize_model(self.master_model))
        self._optimizer_state = None
        self._trained_optimizer = None  # the returned model's, once it holds the state
        self.parameter_server = None  # the one task's `EpochServer`, when it runs
        lent_state = self._lent_optimizer_state()
        if self._validator is None:
            layout = dataframes.lay_out(frame, 1, shuffle)
            worker = self.allocate_worker()
            if lent_state is not None:
                worker.optimizer_state = lent_state
            message = self._run_sequential(layout, worker, label_shapes,
                                           self._run_label(), self._progress_total,
                                           Replay(self.num_epoch, shuffle))
            model.set_weights(list(message["weights"]))
            return model
        if lent_state is not None:
            model_state.set_optimizer_state(self._validator.model, lent_state)
        if self.num_epoch > 1 and type(self).allocate_worker is SingleTrainer.allocate_worker \
                and self._slots_for_one_job(frame, 1):
            return self._train_in_one_task(frame, label_shapes, shuffle)
        with dataframes.kept_for_epochs(frame, self.num_epoch):
            return self._train_epoch_by_epoch(model, frame, label_shapes, shuffle)

    def allocate_epoch_worker(self):
        """The worker of the one task that runs every epoch when the driver acts at epoch
        ends (a `workers.SequentialEpochWorker`)."""
        return workers.SequentialEpochWorker(self.master_model)

    def _train_in_one_task(self, frame, label_shapes, shuffle):
        """Every epoch in one Spark task that replays its data from local disk; at each
        epoch's end the worker waits on an `EpochServer` while the driver validates and
        calls back, with the optimizer's state on the validator's model (callbacks see it,
        and may change its learning rate)."""
        driver_model = self._validator.model
        if not driver_model.optimizer.built:
            driver_model.optimizer.build(driver_model.trainable_variables)

        def end_epoch(epoch, weights, optimizer_state):
            """The driver's end of ``epoch`` (1-based): whether to stop, and the optimizer
            state to go on with."""
            model_state.set_optimizer_state(driver_model, list(optimizer_state))
            stop = self._end_epoch_in_job(server, epoch, weights, failures)
            return stop, model_state.get_optimizer_state(driver_model)

        failures = []
        self._begin_epoch(1)  # before the state is read: a callback may set the learning rate
        server = parameter_servers.EpochServer(
            self.master_model, model_state.get_optimizer_state(driver_model),
            on_epoch_end=end_epoch)
        self._run_epoch_server(
            server, self.allocate_epoch_worker(), dataframes.lay_out(frame, 1, shuffle), 1,
            label_shapes, f"distkeras {self._run_label()} ({self.num_epoch} epochs)",
            Replay(self.num_epoch, shuffle), failures)
        self._optimizer_state = list(server.optimizer_state)
        model_state.set_optimizer_state(driver_model, self._optimizer_state)
        return server.get_model()

    def _lent_optimizer_state(self):
        """The state of the optimizer a compiled model lent, when it has taken steps (a
        model `fit` or trained here before): training goes on from it, as `fit` would.
        None otherwise."""
        optimizer = getattr(self.master_model, "optimizer", None)
        if optimizer is None or self.worker_optimizer is not optimizer or \
                not optimizer.built or _steps_taken(optimizer) == 0:
            return None
        _check_optimizer_tracks_trainable(self.master_model)
        return model_state.get_optimizer_state(self.master_model)

    def _run_sequential(self, layout, worker, label_shapes, description, samples=None,
                        replay=None):
        """Runs one configured `SequentialWorker` task over ``samples`` samples; adds its
        steps to the history and keeps its optimizer's state."""
        self._configure_worker(worker)
        worker.return_optimizer_state = True
        job_group = self._new_job_group()
        with self._progress(layout.sparkSession, worker, samples, description,
                            job_group) as reported:
            (message,) = self._run_workers(layout, 1, worker, label_shapes,
                                           f"distkeras {description}", job_group, replay)
        self.history.extend(reported)
        self.history.extend(step_history.history_records(step_history.unpack_history(message)))
        self._metric_states.extend(epoch_metrics.unpack(message, message["worker_id"]))
        if message.get("optimizer_state") is not None:
            self._optimizer_state = list(message["optimizer_state"])
        return message


    def _compile(self, model):
        """The returned model's optimizer holds the trained one's state (its step count,
        its moments), as after `fit`: training it further goes on where this ended."""
        model = super()._compile(model)
        if getattr(self, "_optimizer_state", None) is not None:
            try:
                model_state.set_optimizer_state(model, self._optimizer_state)
            except ValueError as error:  # a custom worker compiled another optimizer
                logger.warning("The returned model's optimizer starts afresh: %s", error)
            else:
                self._trained_optimizer = model.optimizer
        return model

    def _finalize_weights(self, model):
        """An optimizer with ``use_ema=True`` leaves its moving averages as the weights,
        as `fit` does once its last epoch was validated and called back (so that epoch's
        record, ``ModelCheckpoint`` and ``EarlyStopping`` see the trained weights)."""
        if getattr(self, "_trained_optimizer", None) is model.optimizer:
            return model_state.finalize_weights(model)
        return False

    def _train_epoch_by_epoch(self, model, frame, label_shapes, shuffle):
        """One Spark task per epoch, each starting from the last one's weights and
        optimizer state; the epoch's end is validated and called back before the next.

        The validator's model holds the optimizer's state between epochs, so the callbacks
        see it (``ModelCheckpoint`` saves it) and may change its learning rate.
        """
        from distkeras.utils import serialize_model

        driver_model = self._validator.model
        for epoch in range(1, self.num_epoch + 1):
            self._begin_epoch(epoch)
            self._optimizer_state = model_state.get_optimizer_state(driver_model)
            worker = self.allocate_worker()
            if not isinstance(worker, workers.SequentialWorker):
                raise TypeError(f"{type(self).__name__}.allocate_worker() must return a "
                                f"SequentialWorker. Received: {type(worker).__name__}")
            worker.master_model = serialize_model(model)  # this epoch's starting weights
            worker.optimizer_state = self._optimizer_state
            # Numbered on from the last epoch's steps: not from the count of records, which
            # holds a retried task's superseded ones too.
            worker.iteration = 1 + max((record["iteration"] for record in self.history
                                        if not record.get("superseded")), default=0)
            steps_before, states_before = len(self.history), len(self._metric_states)
            message = self._run_sequential(
                dataframes.lay_out(frame, 1, shuffle), worker, label_shapes,
                f"{self._run_label()} epoch {epoch}/{self.num_epoch}",
                self._progress_total // self.num_epoch if self._progress_total else None)
            model.set_weights(list(message["weights"]))
            model_state.set_optimizer_state(driver_model, self._optimizer_state)
            epoch_records = self.history[steps_before:]
            for record in epoch_records + self._metric_states[states_before:]:
                record["epoch"] = epoch - 1  # counted from 0, as AveragingTrainer's
            # The last epoch: the returned model, at the end.
            if epoch < self.num_epoch and \
                    self._validate_epoch(model.get_weights(), epoch, epoch_records):
                break
        return model


class DistributedTrainer(Trainer, compat.DistributedAccessors):
    """A trainer that runs ``num_workers`` replicas, one Spark task each.

    Takes `Trainer`'s arguments as well; the ones below are its own.

    Args:
        num_workers: Replicas trained in parallel.
        parallelism_factor: Partitions per worker (more, smaller tasks).
    """

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 num_workers=2, batch_size=32, features_col="features", label_col="label",
                 num_epoch=1, loss_weights=None, parallelism_factor=1):
        super().__init__(keras_model, worker_optimizer, loss, metrics, loss_weights,
                         features_col, label_col, batch_size, num_epoch)
        self.num_workers = num_workers
        self.parallelism_factor = parallelism_factor

    # Whether the workers' weights are combined (a center, a mean): an optimizer's moving
    # averages (use_ema=True), each worker's own, are then left out.
    exchanges_weights = True

    def get_config(self):
        config = super().get_config()
        config.update(num_workers=self.num_workers, parallelism_factor=self.parallelism_factor)
        return config

    def validate_arguments(self):
        super().validate_arguments()
        _check_int("num_workers", self.num_workers)
        if _uses_ema(self.worker_optimizer) and self.exchanges_weights:
            logger.warning(
                "%s: the worker optimizer's use_ema=True keeps moving averages in each "
                "worker, which are not exchanged: the returned model holds the trained "
                "weights, not their moving averages (SingleTrainer, and each member of "
                "an EnsembleTrainer, return them, as fit does).", type(self).__name__)
        _check_int("parallelism_factor", self.parallelism_factor)

    def num_partitions(self):
        return self.num_workers * self.parallelism_factor


class AsynchronousDistributedTrainer(DistributedTrainer, compat.AsynchronousAccessors):
    """Workers train asynchronously against a parameter server on the driver.

    An `algorithms.Algorithm`'s trainer is an `AlgorithmTrainer` (see `trainer_for`).
    Otherwise (the escape hatch), subclasses define `allocate_worker()` and may define
    `allocate_parameter_server()` (default: `DeltaParameterServer`, ``C += delta``).

    Takes `DistributedTrainer`'s arguments as well; the ones below are its own.

    Args:
        communication_window: Local steps between two commits.
        master_port: Parameter server port; 0 (default) lets the OS choose.
        learning_rate: Used by update rules that have one (AEASGD's elastic rate, ...).
            The classes whose rule has none and that set ``sets_worker_learning_rate``
            (DOWNPOUR, ADAG, DynSGD) give it to the workers' Keras optimizer instead, in
            place of its own rate (dist-keras's DOWNPOUR took a learning rate too).
        worker_timeout: Seconds a worker may stay silent between its steps before the
            training stops with an error naming it (None: wait forever). Before its first
            step and while it compiles a step (a short last batch's) a worker may take
            `TrainingMonitor.STARTUP_TIMEOUT` (120 s, or worker_timeout if longer).
        overlap_communication: Algorithms that commit, then pull (all built-ins but
            AEASGD, EAMSGD and Experimental): exchange with the server on a background
            thread while the next window trains, applying the worker's own update locally
            instead of waiting to pull it back (see `WindowedWorker`). The same path for
            one worker; with several, others' commits arrive a window later.
        reuse_server_buffers: Algorithms that add commits as sent (DOWNPOUR, ADAG, AEASGD,
            EAMSGD), opt-in: their parameter server reads commits into one buffer per
            worker and writes each new center into memory it used before
            (`parameter_servers._AddingServer`): the same centers bit for bit, for less
            server CPU per commit on large models (docs/scaling.md).
    """

    default_window = 5
    # Whether `learning_rate` is the workers' Keras optimizer's (for rules without one).
    sets_worker_learning_rate = False

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 num_workers=2, batch_size=32, features_col="features", label_col="label",
                 num_epoch=1, communication_window=None, master_port=0, loss_weights=None,
                 parallelism_factor=1, learning_rate=None, worker_timeout=None,
                 overlap_communication=False, reuse_server_buffers=False):
        super().__init__(keras_model, worker_optimizer, loss, metrics, num_workers,
                         batch_size, features_col, label_col, num_epoch, loss_weights,
                         parallelism_factor)
        self.communication_window = (self.default_window_for(num_workers)
                                     if communication_window is None else communication_window)
        self.master_port = master_port
        self.learning_rate = learning_rate
        self.worker_timeout = worker_timeout
        self.overlap_communication = overlap_communication
        self.reuse_server_buffers = reuse_server_buffers
        self.parameter_server = None

    @classmethod
    def default_window_for(cls, num_workers):
        """The ``communication_window`` used when none is given, for ``num_workers``."""
        return cls.default_window

    def get_config(self):
        config = super().get_config()
        config.update(communication_window=self.communication_window,
                      master_port=self.master_port, learning_rate=self.learning_rate,
                      worker_timeout=self.worker_timeout,
                      overlap_communication=self.overlap_communication)
        if self.reuse_server_buffers:  # only DOWNPOUR's and ADAG's constructors take it
            config.update(reuse_server_buffers=True)
        return config

    def validate_arguments(self):
        super().validate_arguments()
        _check_communication_window(self.communication_window)
        # A TCP port: 0 lets the OS pick one. A larger number would fail only when the
        # server binds, as an OverflowError naming no argument.
        _check_int("master_port", self.master_port, minimum=0, maximum=65535)
        if self.learning_rate is not None:
            _check_number("learning_rate", self.learning_rate)
        if self.worker_timeout is not None:
            _check_number("worker_timeout", self.worker_timeout)
        if not isinstance(self.overlap_communication, bool):
            raise ValueError("`overlap_communication` must be True or False. Received: "
                             f"overlap_communication={self.overlap_communication!r}")
        if not isinstance(self.reuse_server_buffers, bool):
            raise ValueError("`reuse_server_buffers` must be True or False. Received: "
                             f"reuse_server_buffers={self.reuse_server_buffers!r}")

    def _workers_optimizer(self):
        """``worker_optimizer``, with ``learning_rate`` as its rate where the class
        `sets_worker_learning_rate`."""
        if not self.sets_worker_learning_rate or self.learning_rate is None:
            return self.worker_optimizer
        from distkeras.ml.estimators import optimizer_config

        return optimizer_config(self.worker_optimizer, self.learning_rate, self.master_model)

    def allocate_worker(self):
        """Returns the worker that every task runs; subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} must implement allocate_worker().")

    def allocate_parameter_server(self):
        """Returns the parameter server; `DeltaParameterServer` unless overridden."""
        return parameter_servers.DeltaParameterServer(
            self.master_model, self.master_port, reuse_buffers=self.reuse_server_buffers)

    def _validate_checkpointing(self):
        if self.resume and self.checkpoint_dir is None:
            raise ValueError("resume=True needs the checkpoint_dir to resume from.")
        if self.checkpoint_dir is not None:
            _check_number("checkpoint_every", self.checkpoint_every)

    def _restore(self, server):
        """Puts the last checkpoint's center and update count into a fresh server."""
        from distkeras.checkpoints import load_checkpoint

        checkpoint = load_checkpoint(self.checkpoint_dir, server.weight_spec)
        if checkpoint is None:
            logger.warning("No checkpoint in %s: starting from the model's weights.",
                           self.checkpoint_dir)
            return
        written_by = checkpoint.get("trainer")
        if written_by and written_by != type(self).__name__:
            # The weights fit (they were checked), but the update rule that made them differs.
            logger.warning("The checkpoint in %s was written by %s; resuming it with %s.",
                           self.checkpoint_dir, written_by, type(self).__name__)
        server.center_variable = checkpoint["center"]
        server.num_updates = int(checkpoint["num_updates"])
        logger.info("Resuming from %s (%s updates)", self.checkpoint_dir, server.num_updates)

    def _hand_learning_rate_to(self, server):
        """Lets ``server`` send the workers the learning rate that the callbacks set (the
        monitor updates it at each epoch's end), when a callback sets one.

        Raises:
            ValueError: When the server's pull replies are its own, so the rate would
                never reach the workers.
        """
        rate = self._learning_rate_of_callbacks()
        if rate is None:
            return
        pulls = ("handle_pull", "handle_pull_unless_own")
        if not isinstance(server, parameter_servers.SocketParameterServer) or any(
                getattr(type(server), name) is not getattr(
                    parameter_servers.SocketParameterServer, name) for name in pulls):
            raise ValueError(
                f"{type(server).__name__} answers pulls with a handle_pull of its own, so "
                "the learning rate that ReduceLROnPlateau or LearningRateScheduler sets "
                "cannot reach the workers. Use a learning rate schedule in "
                "`worker_optimizer` (keras.optimizers.schedules) instead.")
        server.optimizer_learning_rate = rate

    def get_staleness(self):
        """Per commit, ``(worker_id, updates by others since that worker's pull)``."""
        return list(self.parameter_server.staleness) if self.parameter_server else []

    def _configure_worker(self, worker):
        super()._configure_worker(worker)
        server = self.parameter_server
        worker.master_host = self._worker_host
        worker.master_port = server.port
        worker.token = server.token
        if getattr(worker, "communication_window", None) is None:
            worker.communication_window = self.communication_window
        if getattr(worker, "learning_rate", None) is None:
            worker.learning_rate = self.learning_rate
        if self._validator is not None:
            # Epoch ends are seen in the history the workers send: send it more often.
            worker.HISTORY_EVERY_SECONDS = VALIDATING_REPORT_SECONDS
        if self.overlap_communication:
            worker.overlap_communication = True
            checker = getattr(worker, "_check_overlap", None)
            if checker is None:
                raise ValueError(f"{type(worker).__name__} cannot overlap communication. "
                                 "Use overlap_communication=False (the CLI: leave out "
                                 "--overlap-communication).")
            checker()  # a clear error on the driver, before any Spark job

    def _train(self, frame, label_shapes, shuffle):
        spark = frame.sparkSession
        warn_if_speculative(spark.sparkContext, type(self).__name__)
        layout = dataframes.lay_out(frame, self.num_partitions(), shuffle)
        server = self.allocate_parameter_server()
        if isinstance(server, parameter_servers.SocketParameterServer):
            server.host = bind_address(spark)
            server.expect_workers(self.num_partitions())
        self._worker_host = driver_address(spark)
        self.parameter_server = server
        if self.resume:
            self._restore(server)
        job_group = self._new_job_group()
        self._begin_epoch(1)  # the monitor begins the later ones as the epochs end
        self._hand_learning_rate_to(server)
        updates_before = server.num_updates  # a resumed run starts from the checkpoint's
        server.start()
        monitor = None
        stopped_early = True  # until the workers' job has ended as it should
        try:
            worker = self.allocate_worker()
            self._configure_worker(worker)
            if isinstance(server, parameter_servers.SocketParameterServer):
                # A worker that met an error no retry gets past says so, and a handler of
                # the server that raised would raise again for every retry: stop them all.
                server.on_worker_failure = \
                    lambda worker_id, error: spark.sparkContext.cancelJobGroup(job_group)
                server.on_error = lambda error: spark.sparkContext.cancelJobGroup(job_group)
                monitor = TrainingMonitor(server, spark.sparkContext, job_group,
                                          self._progress_total, self.verbose,
                                          self.worker_timeout, type(self).__name__,
                                          self.checkpoint_dir, self.checkpoint_every,
                                          validator=self._validator,
                                          num_epoch=self.num_epoch,
                                          num_tasks=self.num_partitions(),
                                          label=self._run_label(),
                                          interval=VALIDATING_REPORT_SECONDS
                                          if self._validator is not None else 0.5)
                monitor.start()
            self._run_workers(layout, self.num_partitions(), worker, label_shapes,
                              f"distkeras {self._run_label()} ({self.num_workers} workers)",
                              job_group, Replay(self.num_epoch, shuffle))
            # Every task has ended; let the server read what the workers sent last (their
            # final history and goodbye) before it closes the connections.
            if isinstance(server, parameter_servers.SocketParameterServer):
                server.wait_for_goodbyes(timeout=10.0)
            stopped_early = False
        except TrainingError as error:
            _raise_reported_failure(server, error)
            if getattr(server, "errors", None):
                # The workers' errors (a closed connection) only echo the server's.
                raise TrainingError(
                    f"The {type(server).__name__} failed: {server.errors[0]}") from error
            if monitor is not None and monitor.stalled:
                raise TrainingError(f"Training stopped: {monitor.stalled}.") from error
            if monitor is None or not (monitor.stopped_by_callback or
                                       monitor.end_of_epoch_error):
                raise
            # The monitor stopped the workers at an epoch's end: a callback asked to
            # (EarlyStopping; the center is the result) or one failed (raised below).
            stopped_early = bool(monitor.end_of_epoch_error)
        finally:
            if monitor is not None:
                monitor.stop()
            server.stop()
            # What was trained, even when it failed or was interrupted.
            self.history = list(getattr(server, "history", []))
            self._metric_states = list(getattr(server, "metric_states", []))
            if stopped_early:
                self._checkpoint_stopped_training(server, updates_before)
        if monitor is not None and monitor.end_of_epoch_error:
            epoch, cause = monitor.end_of_epoch_error
            if not isinstance(cause, Exception):
                raise cause  # a callback's KeyboardInterrupt or SystemExit, as fit raises it
            raise TrainingError(f"The end of epoch {epoch} failed (validation or a callback): "
                                f"{type(cause).__name__}: {cause}") from cause
        if getattr(server, "errors", None):
            raise TrainingError(f"The parameter server failed: {server.errors[0]}")
        if self.checkpoint_dir is not None:
            from distkeras.checkpoints import save_checkpoint

            save_checkpoint(self.checkpoint_dir, server, type(self).__name__)
        self._warn_if_nothing_committed(server.num_updates - updates_before, server, worker)
        if monitor is None or not monitor.stopped_by_callback:
            self._warn_if_trained_short(worker)
        return server.get_model()

    def _checkpoint_stopped_training(self, server, updates_before):
        """Saves the center that a training stopped early (a worker's error, a stall, a
        callback's error, Ctrl-C) had reached, when it has a ``checkpoint_dir``:
        ``resume=True`` then goes on from there, not from the last periodic checkpoint (or,
        before the first, from the model's weights).

        Args:
            server: The stopped parameter server.
            updates_before: Its update count when this run started (nothing new to save
                when it has not moved).
        """
        if self.checkpoint_dir is None or server.num_updates == updates_before:
            return
        from distkeras.checkpoints import save_checkpoint

        try:
            updates = save_checkpoint(self.checkpoint_dir, server, type(self).__name__)
        except Exception as error:  # the training's own error is the one to raise
            logger.warning("Could not write the last checkpoint to %s: %s",
                           self.checkpoint_dir, error)
            return
        logger.warning("The training stopped early; its center after %d updates is saved in "
                       "%s: train(..., checkpoint_dir=..., resume=True) goes on from it.",
                       updates, self.checkpoint_dir)

    def _warn_if_trained_short(self, worker):
        """Warns when the workers reported fewer samples than the rows times ``num_epoch``:
        a custom ``optimize()`` that returned before its data ran out leaves ``train()``
        returning normally (epoch-end callbacks fired too) a model trained on part of it.
        A warning, not an error: a fixed step budget can be deliberate.

        Args:
            worker: The worker the trainer allocated (its class is the one to name).
        """
        expected = self._progress_total  # rows x num_epoch; None: not counted, not checked
        if not expected:
            return
        trained = sum(int(record.get("batch_size", 0)) for record in self.history)
        if trained >= expected:
            return
        logger.warning(
            "%s: the workers trained on %d samples, not the %d of %d epochs over the rows "
            "(%.1f%%): %s.optimize() returned before get_next_minibatch() ran out of data, "
            "so the returned model was trained on part of it. Loop until "
            "get_next_minibatch() raises StopIteration (docs/optimizers.md, \"Write your "
            "own optimizer\") unless a fixed number of steps is what you meant.",
            type(self).__name__, trained, expected, self.num_epoch,
            100.0 * trained / expected, type(worker).__name__)

    def _warn_if_nothing_committed(self, num_updates, server, worker):
        """Warns when no commit reached the center (the model returned is the one given),
        or when some were refused (those workers' training is not in it)."""
        refused = getattr(server, "refused", 0)
        if num_updates and refused:
            by_worker = getattr(server, "refused_by_worker", {})
            logger.warning(
                "%s: the parameter server refused %d commits (NaN or infinite values, or "
                "values that would make the center infinite) from workers %s; the "
                "returned model holds the other %d, so it lacks those "
                "workers' training since their first refusal. A NaN loss usually means a "
                "learning rate too high or values too large for float32 in that worker's "
                "data (NaN or infinite values stop the training as they are fed); Keras's "
                "fit would have returned NaN weights.",
                type(self).__name__, refused, dict(sorted(by_worker.items())), num_updates)
            return
        if num_updates or not self.history:
            return
        if refused:
            logger.warning(
                "%s applied none of its workers' commits (the parameter server refused %d, "
                "logged above): the returned model holds the initial weights.",
                type(self).__name__, refused)
            return
        # A custom worker's loop (the seed's) commits only every `communication_window`
        # steps; on a partition with fewer minibatches, nothing reaches the center.
        steps = max(record.get("iteration", 0) for record in self.history)
        logger.warning(
            "%s trained %d steps on its workers but applied no commit to the center "
            "variable: the returned model holds the initial weights. The workers took at "
            "most %d steps (communication_window=%s). Commit in %s.optimize() more often, "
            "or commit the last, unfinished window in finish() as the built-in workers do "
            "(docs/optimizers.md, \"Write your own optimizer\").",
            type(self).__name__, len(self.history), steps,
            getattr(worker, "communication_window", None), type(worker).__name__)


def _algorithm_init(algorithm):
    """A trainer's ``__init__`` for ``algorithm``: `AsynchronousDistributedTrainer`'s
    arguments with the algorithm's hyperparameters after ``communication_window``, where
    AEASGD, EAMSGD and Experimental always had theirs (an inspectable signature: the
    command line's flags come from it)."""
    import inspect

    base = inspect.signature(AsynchronousDistributedTrainer.__init__).parameters
    hyper = {parameter.name: parameter for parameter in algorithm.hyperparameters}
    parameters = []
    for name, parameter in base.items():
        if name in hyper:
            continue  # the algorithm's own, with its default, after communication_window
        parameters.append(parameter)
        if name == "communication_window":
            parameters.extend(inspect.Parameter(name, parameter.kind, default=given.default)
                              for name, given in hyper.items())
    signature = inspect.Signature(parameters)

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        values = dict(bound.arguments)
        del values["self"]
        own = {name: values.pop(name) for name in hyper if name != "learning_rate"}
        AsynchronousDistributedTrainer.__init__(self, **values)
        for name, value in own.items():
            setattr(self, name, value)

    __init__.__signature__ = signature
    return __init__


class AlgorithmTrainer(AsynchronousDistributedTrainer):
    """The trainer of an `Algorithm` (``algorithm``, a class): its workers and server run it.

    Takes `AsynchronousDistributedTrainer`'s arguments and the algorithm's
    hyperparameters (after ``communication_window``); `trainer_for` makes one.
    """

    algorithm = None

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        algorithm = vars(cls).get("algorithm")
        if algorithm is None:
            return
        cls.default_window = algorithm.default_window
        cls.sets_worker_learning_rate = algorithm.sets_worker_learning_rate
        cls.averages_weights = algorithm.averages_weights
        if "__init__" not in vars(cls):
            cls.__init__ = _algorithm_init(algorithm)

    @classmethod
    def default_window_for(cls, num_workers):
        return cls.algorithm.default_window_for(num_workers)

    def _workers_optimizer(self):
        """`AsynchronousDistributedTrainer`'s; given no ``learning_rate`` and an optimizer
        by name, Keras's default rate for it times the algorithm's
        `worker_learning_rate_factor` (an optimizer instance or config keeps its rate)."""
        factor = self.algorithm.worker_learning_rate_factor(self.communication_window)
        given = self.sets_worker_learning_rate and self.learning_rate is not None
        rate = None if given or factor == 1.0 else \
            default_learning_rate(self.worker_optimizer)
        if rate is None:
            return super()._workers_optimizer()
        from distkeras.ml.estimators import optimizer_config

        return optimizer_config(self.worker_optimizer, rate * factor, self.master_model)

    def hyperparameter_values(self):
        """The algorithm's hyperparameters as given to this trainer, by name."""
        return {parameter.name: getattr(self, parameter.name)
                for parameter in self.algorithm.hyperparameters}

    def make_algorithm(self):
        """The algorithm that the workers and the server run, with this trainer's
        hyperparameters."""
        return self.algorithm(**self.hyperparameter_values())

    def get_config(self):
        config = super().get_config()
        config.update(self.hyperparameter_values())
        return config

    def validate_arguments(self):
        super().validate_arguments()
        self.algorithm(**self.hyperparameter_values()).validate()
        if self.reuse_server_buffers and not self.algorithm.adds_commits_as_sent:
            raise ValueError(
                f"`reuse_server_buffers` is for rules that add commits as sent; "
                f"{type(self).__name__}'s does not. Leave it False.")

    def allocate_worker(self):
        return workers.WindowedWorker(self.master_model, algorithm=self.make_algorithm())

    def allocate_parameter_server(self):
        return parameter_servers.AlgorithmServer(
            self.master_model, self.master_port, reuse_buffers=self.reuse_server_buffers,
            algorithm=self.make_algorithm())


def default_learning_rate(optimizer):
    """Keras's default learning rate for an optimizer given by name (``"adam"``), or None
    for an instance or a config: its rate was chosen, and is left as it is."""
    import keras

    if not isinstance(optimizer, str):
        return None
    optimizer = keras.optimizers.get(optimizer)
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def trainer_for(algorithm, name=None):
    """A trainer class (an `AlgorithmTrainer`) for an `Algorithm` class.

    Args:
        algorithm: The `algorithms.Algorithm` subclass.
        name: The class name (default: the algorithm's, plus ``Trainer``). Assign the
            class to that name in the algorithm's module, so that it pickles.

    Returns:
        The new trainer class, documented by the algorithm's docstring.
    """
    return type(name or f"{algorithm.__name__}Trainer", (AlgorithmTrainer,),
                {"algorithm": algorithm, "__doc__": algorithm.__doc__,
                 "__module__": algorithm.__module__})


class DOWNPOUR(AlgorithmTrainer):
    """DOWNPOUR (Dean et al. 2012): workers commit ``W - W_pull``; the server adds it.

    Takes `AsynchronousDistributedTrainer`'s arguments; ``communication_window`` is 5 by
    default. The rule: `algorithms.downpour.DOWNPOUR`.
    """

    algorithm = algorithms.DOWNPOUR


class ADAG(AlgorithmTrainer):
    """ADAG (Hermans 2017): workers commit ``(W - W_pull) / window``; the server adds it.

    Takes `AsynchronousDistributedTrainer`'s arguments; ``communication_window`` is the
    number of workers, at most 12, by default. The rule: `algorithms.adag.ADAG`.
    """

    algorithm = algorithms.ADAG


class DynSGD(AlgorithmTrainer):
    """DynSGD (Jiang et al. 2017): each commit is divided by its staleness.

    Takes `AsynchronousDistributedTrainer`'s arguments; ``communication_window`` is 5 by
    default. The rule: `algorithms.dynsgd.DynSGD`.
    """

    algorithm = algorithms.DynSGD


class AEASGD(AlgorithmTrainer):
    """Asynchronous elastic averaging SGD (Zhang, Choromanska & LeCun 2015).

    Takes `AsynchronousDistributedTrainer`'s arguments, ``rho`` (5.0) and
    ``learning_rate`` (0.1, multiplying the elastic force; ``rho * learning_rate`` must
    be at most 1); ``communication_window`` is 32 by default. The rule:
    `algorithms.aeasgd.AEASGD`.
    """

    algorithm = algorithms.AEASGD


def carries_momentum(optimizer):
    """Whether a Keras optimizer (an instance, a name or a config) keeps a moving average
    of its gradients: Adam and its kin (a ``beta_1``), SGD or RMSprop with a momentum."""
    import keras

    if isinstance(optimizer, (str, dict)):
        optimizer = keras.optimizers.get(copy.deepcopy(optimizer))
    if hasattr(optimizer, "beta_1"):
        return True
    return bool(getattr(optimizer, "momentum", 0.0))


class EAMSGD(AEASGD):
    """EAMSGD: AEASGD plus local Nesterov momentum, as in the EASGD paper.

    Takes `AEASGD`'s arguments and ``momentum``, the local momentum, in [0, 1) (0 gives
    AEASGD). ``momentum=None`` (the default) is 0.9, the paper's setting, for a worker
    optimizer without momentum of its own (plain SGD, Adagrad, RMSprop without momentum),
    and 0 for one that has it (Adam and its kin, SGD or RMSprop with momentum). The rule:
    `algorithms.eamsgd.EAMSGD`.

    Notes:
        On top of Adam's own moving average of the gradients, a momentum of 0.9 made the
        zoo's MLP 12 points less accurate than `fit` (0.706 against 0.829; 0.824 with
        momentum 0): hence the default of 0 there.
    """

    algorithm = algorithms.EAMSGD

    def local_momentum(self):
        """The momentum the workers use: ``momentum``, or where None the default for the
        worker optimizer (see the class's docstring)."""
        if self.momentum is not None:
            return self.momentum
        momentum = 0.0 if carries_momentum(self.worker_optimizer) else 0.9
        logger.info("EAMSGD: local momentum %s for the worker optimizer %s (pass momentum= "
                    "to choose)", momentum, type(self.worker_optimizer).__name__)
        return momentum

    def make_algorithm(self):
        return self.algorithm(**dict(self.hyperparameter_values(),
                                     momentum=self.local_momentum()))

    def allocate_worker(self):
        return workers.EAMSGDWorker(self.master_model, algorithm=self.make_algorithm())


class Experimental(AlgorithmTrainer):
    """The research scaffold: ADAG's commit, damped by the disagreement on the server.

    Takes `AsynchronousDistributedTrainer`'s arguments; ``communication_window`` is the
    number of workers, at most 5, and ``learning_rate`` 1.0 by default. The rule:
    `algorithms.experimental.Experimental`.
    """

    algorithm = algorithms.Experimental


class DiLoCo(AlgorithmTrainer):
    """DiLoCo, asynchronous: H local steps (the window, 20 by default), then an outer
    Nesterov step on the center along the change, divided by its staleness + 1.

    Takes `AsynchronousDistributedTrainer`'s arguments, ``outer_learning_rate`` (0.7) and
    ``outer_momentum`` (0.5). The rule: `algorithms.diloco.DiLoCo`.
    """

    algorithm = algorithms.DiLoCo


class FedAdam(AlgorithmTrainer):
    """FedAdam, asynchronous: the server moves the center by Adam along each worker's
    change over its window (10 steps by default).

    Takes `AsynchronousDistributedTrainer`'s arguments, ``server_learning_rate`` (0.003),
    ``beta_1`` (0.9), ``beta_2`` (0.99) and ``epsilon`` (0.001). The rule:
    `algorithms.fedadam.FedAdam`.
    """

    algorithm = algorithms.FedAdam


def _next_iterations(records):
    """``{worker_id: the iteration after its last}`` over step records (those of a failed
    task that Spark's retry trained again, ``superseded``, left out)."""
    last = {}
    for record in records:
        if not record.get("superseded"):
            worker = record["worker_id"]
            last[worker] = max(last.get(worker, 0), int(record["iteration"]))
    return {worker: iteration + 1 for worker, iteration in last.items()}


class AveragingTrainer(DistributedTrainer):
    """Model averaging: each epoch, one replica per partition, then the weights' mean.

    Takes `DistributedTrainer`'s arguments. Positional arguments come in dist-keras's
    order (``features_col``, ``label_col``, ``num_epoch``, ``batch_size``, ``num_workers``
    after ``metrics``), so code written for dist-keras trains as written.

    Notes:
        Every epoch starts all replicas from the last average, each with a fresh
        optimizer, at the learning rate a ``LearningRateScheduler`` or
        ``ReduceLROnPlateau`` callback set.

        With several epochs and a slot for every worker, all epochs run in one Spark job.
        A callback of the user's own needs one more slot, for a Spark job it might start.
        Each worker replays its partition from local disk, and the workers meet at each
        epoch's end on the driver's `AveragingServer`: a barrier stage, so they run at
        once. Otherwise each epoch is a Spark job of its own, and the driver averages the
        results.
    """

    averages_weights = True

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 features_col="features", label_col="label", num_epoch=1, batch_size=32,
                 num_workers=2, loss_weights=None, parallelism_factor=1):
        super().__init__(keras_model, worker_optimizer, loss, metrics,
                         num_workers=num_workers, batch_size=batch_size,
                         features_col=features_col, label_col=label_col,
                         num_epoch=num_epoch, loss_weights=loss_weights,
                         parallelism_factor=parallelism_factor)

    def allocate_worker(self, model):
        """The worker of one epoch's job (each epoch a Spark job)."""
        return workers.SequentialWorker(model)

    def allocate_averaging_worker(self):
        """The worker of the one job that runs every epoch."""
        return workers.AveragingWorker(self.master_model)

    def _train(self, frame, label_shapes, shuffle):
        self.parameter_server = None  # the one job's `AveragingServer`, when it runs
        if self.num_epoch > 1 and self._slots_for_one_job(frame, self.num_partitions()):
            layout = dataframes.lay_out(frame, self.num_partitions(), shuffle)
            if self._runs_as_barrier_stage(frame, layout, shuffle):
                return self._train_in_one_job(frame, layout, label_shapes, shuffle)
            logger.info("AveragingTrainer: the DataFrame's partitions cannot run as one "
                        "barrier stage (coalesce() or union() before the training): one "
                        "Spark job per epoch.")
        with dataframes.kept_for_epochs(frame, self.num_epoch):
            return self._train_epoch_by_epoch(frame, label_shapes, shuffle)

    def _runs_as_barrier_stage(self, frame, layout, shuffle):
        """Whether Spark accepts ``layout`` (`dataframes.lay_out` of ``frame``) as the
        input of a barrier stage. It refuses a stage whose RDDs do not all have the
        stage's number of partitions (a ``coalesce``, a ``union``), and the refusal
        stops the whole SparkContext (Spark 4)."""
        if shuffle or isinstance(layout, parquet_source.ParquetSource) or \
                (layout is not frame and self.num_partitions() > 1):
            return True  # laid out by a shuffle of its own, or read over spark.range
        if layout is not frame:
            return False  # coalesce(1)
        return dataframes.barrier_compatible(layout, self.num_partitions())

    def _train_in_one_job(self, frame, layout, label_shapes, shuffle):
        def end_epoch(epoch, center):
            """The driver's end of ``epoch`` (1-based); returns whether to stop."""
            stop = self._end_epoch_in_job(server, epoch, center, failures)
            server.learning_rate = self._learning_rate_of_callbacks()
            return stop

        failures = []
        self._begin_epoch(1)
        server = parameter_servers.AveragingServer(self.master_model, self.num_partitions(),
                                                   on_average=end_epoch)
        server.learning_rate = self._learning_rate_of_callbacks()
        self._run_epoch_server(
            server, self.allocate_averaging_worker(), layout, self.num_partitions(),
            label_shapes, f"distkeras {self._run_label()} ({self.num_workers} workers, "
            f"{self.num_epoch} epochs)", Replay(self.num_epoch, shuffle), failures,
            barrier=True)
        return server.get_model()

    def _train_epoch_by_epoch(self, frame, label_shapes, shuffle):
        from distkeras import update_rules
        from distkeras.networking import weights_array
        from distkeras.utils import deserialize_model, optimizer_config, serialize_model

        model = deserialize_model(serialize_model(self.master_model))
        for epoch in range(self.num_epoch):
            self._begin_epoch(epoch + 1)
            layout = dataframes.lay_out(frame, self.num_partitions(), shuffle,
                                        seed=None if not shuffle else epoch)
            worker = self.allocate_worker(model)
            self._configure_worker(worker)
            if self._learning_rate_of_callbacks() is not None:
                # The driver's optimizer: the worker's config, at the rate a callback set.
                worker.optimizer = optimizer_config(self._validator.model.optimizer,
                                                    self._validator.model)
            # Each worker's steps count on from its own last epoch's, as in the one-job
            # path (from the largest of all, the smaller partition's left gaps).
            worker.first_iterations = _next_iterations(self.history)
            description = f"{self._run_label()} epoch {epoch + 1}/{self.num_epoch}"
            job_group = self._new_job_group()
            samples = self._progress_total // self.num_epoch if self._progress_total else None
            states_before = len(self._metric_states)
            with self._progress(frame.sparkSession, worker, samples, description,
                                job_group, self.num_partitions()) as epoch_records:
                messages = self._run_workers(layout, self.num_partitions(), worker,
                                             label_shapes, f"distkeras {description}",
                                             job_group)
            # A replica whose partition was empty trained on nothing: it would pull the
            # average back to the epoch's starting weights.
            trained = [message for message in messages if message.get("samples") != 0]
            if trained:
                model.set_weights(list(update_rules.average_weights(
                    weights_array(message["weights"]) for message in trained)))
            epoch_records.extend(
                record for message in messages for record in
                step_history.history_records(step_history.unpack_history(message)))
            for message in messages:
                self._metric_states.extend(epoch_metrics.unpack(message,
                                                                message["worker_id"]))
            for record in epoch_records + self._metric_states[states_before:]:
                record["epoch"] = epoch
            self.history.extend(epoch_records)
            # The last epoch: the returned model, at the end.
            if epoch + 1 < self.num_epoch and \
                    self._validate_epoch(model.get_weights(), epoch + 1, epoch_records):
                break
        return model


class EnsembleTrainer(DistributedTrainer):
    """Trains ``num_ensembles`` independent models, one per partition of the data.

    Each member starts from its own random initial weights, seeded by ``seed`` plus its
    index, and trains on its share of the data. `train()` returns the list of models.

    Takes `Trainer`'s arguments as well; the ones below are its own. Positional arguments
    come in dist-keras's order (``features_col``, ``label_col``, ``batch_size``,
    ``num_ensembles`` after ``metrics``), so code written for dist-keras trains as
    written.

    Args:
        num_ensembles: Number of models.
        seed: Base seed for the members' initial weights (an integer from 0; member ``i``
            is seeded with ``seed + i``; default: 0).
    """

    exchanges_weights = False  # each member ends with its moving averages, as its fit

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 features_col="features", label_col="label", batch_size=32, num_ensembles=2,
                 loss_weights=None, num_epoch=1, seed=None):
        super().__init__(keras_model, worker_optimizer, loss, metrics,
                         num_workers=num_ensembles, batch_size=batch_size,
                         features_col=features_col, label_col=label_col,
                         num_epoch=num_epoch, loss_weights=loss_weights)
        self.num_ensembles = num_ensembles
        self.seed = seed

    def get_config(self):
        config = super().get_config()
        for key in ("num_workers", "parallelism_factor"):
            config.pop(key)
        config.update(num_ensembles=self.num_ensembles, seed=self.seed)
        return config

    def validate_arguments(self):
        # Checked under its own name: the user never gave `num_workers`.
        _check_int("num_ensembles", self.num_ensembles)
        if self.seed is not None:
            # Member i is seeded with seed + i, which numpy takes in [0, 2**32): a seed out
            # of it (or a float, a string) would fail only on the executors, in the job.
            _check_int("seed", self.seed, minimum=0, maximum=2**32 - self.num_ensembles)
        self.num_workers = self.num_ensembles
        super().validate_arguments()

    def allocate_worker(self):
        return workers.EnsembleWorker(self.master_model, seed=self.seed)

    def train(self, dataframe, shuffle=False, verbose="auto", **options):
        """Trains the members; returns a list of ``num_ensembles`` compiled models."""
        return super().train(dataframe, shuffle, verbose, **options)

    def _train(self, frame, label_shapes, shuffle):
        from distkeras.utils import deserialize_model, serialize_model

        layout = dataframes.lay_out(frame, self.num_ensembles, shuffle, seed=self.seed)
        worker = self.allocate_worker()
        self._configure_worker(worker)
        description = f"{self._run_label()} ({self.num_ensembles} models)"
        job_group = self._new_job_group()
        # One bar for all members: together they step through every row num_epoch times.
        reported = []
        try:
            with self._progress(frame.sparkSession, worker, self._progress_total,
                                description, job_group, self.num_ensembles) as reported:
                messages = self._run_workers(
                    layout, self.num_ensembles, worker, label_shapes,
                    f"distkeras {description}", job_group,
                    Replay(self.num_epoch, shuffle, self.seed))
        finally:
            self.history.extend(reported)  # what was trained, even when it failed
        models = []
        for message in sorted(messages, key=lambda m: m["worker_id"]):
            self.history.extend(
                step_history.history_records(step_history.unpack_history(message)))
            member = deserialize_model(serialize_model(self.master_model))
            member.set_weights(list(message["weights"]))
            models.append(member)
        trained = {record["worker_id"] for record in self.history}
        untrained = [index for index in range(len(models)) if index not in trained]
        if untrained:
            logger.warning(
                "EnsembleTrainer: member(s) %s had no rows (their partitions were empty) "
                "and are returned untrained, with their initial weights. Use fewer "
                "num_ensembles, or more rows.", untrained)
        return models

    def _compile(self, models):
        return [super(EnsembleTrainer, self)._compile(model) for model in models]
