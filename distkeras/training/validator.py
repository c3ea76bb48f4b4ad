"""The driver's per-epoch validation: the `Validator` and the epoch logs it is given.

Each evaluation is one record of ``trainer.get_validation_history()``: ``epoch``,
``samples`` (trained so far), ``timestamp``, ``loss`` (the epoch's mean step loss, where
known), ``val_loss`` and ``val_<metric>``. The Keras callbacks get ``fit``'s epoch logs.
"""

import logging
import threading
import time

import numpy as np

from distkeras.data import sample_weights
from distkeras.data.feed import model_outputs, output_keys
from distkeras.training.callbacks import LEARNING_RATE_CALLBACKS, keras_callback_list
from distkeras.training.epoch_metrics import exact_logs

logger = logging.getLogger(__name__)


# Keys of a step record that describe the step rather than measure it.
_STEP_KEYS = frozenset({"worker_id", "iteration", "timestamp", "batch_size", "epoch",
                        "attempt"})


def epoch_logs(records, metric_states=()):
    """The epoch's loss and metrics as ``fit``'s epoch logs hold them.

    Each metric whose workers reported its state (``metric_states``: the epoch's reports,
    see `distkeras.training.epoch_metrics`) gets its result over the state of all the
    epoch's steps; any other measured value, the mean over step records, each step weighing
    its ``batch_size`` (1 where a record has none): an epoch's smaller last batch counts for
    its rows. A value that is NaN in one step is NaN. Steps of a failed task that Spark's
    retry trained again (``superseded``) do not count."""
    logs = _step_means(records)
    logs.update(exact_logs(metric_states))
    return logs


def _step_means(records):
    """The mean of each measured value over step records (see `epoch_logs`)."""
    values = {}
    for record in records:
        if record.get("superseded"):
            continue
        size = record.get("batch_size")
        size = float(size) if isinstance(size, (int, float, np.number)) and size > 0 else 1.0
        for name, value in record.items():
            if name not in _STEP_KEYS and isinstance(value, (int, float, np.number)) \
                    and not isinstance(value, bool):
                series = values.setdefault(name, ([], []))
                series[0].append(float(value))
                series[1].append(size)
    return {name: float(np.average(series, weights=sizes))
            for name, (series, sizes) in values.items()}


class Validator:
    """Runs at the end of each epoch on the driver: evaluates the weights reached on the
    validation rows (one record each) and calls the Keras callbacks with the logs.

    The callbacks see ``model`` holding those weights: ``EarlyStopping`` may set its
    ``stop_training``, ``ModelCheckpoint`` saves it, ``CSVLogger`` writes the logs. Only
    ``on_train_begin``, ``on_epoch_begin`` (`epoch_begin`; for the parameter-server
    trainers, as the previous epoch's end is seen), ``on_epoch_end`` and ``on_train_end``
    are called.

    Args:
        model: A compiled `keras.Model` of the trained architecture (its weights are
            replaced at every evaluation).
        x: Validation inputs, or None (callbacks then get the training loss only).
        y: Validation targets.
        batch_size: Rows per model call.
        callbacks: `keras.callbacks.Callback` instances (see `check_callbacks`).
        num_epoch: Epochs of the training (the callbacks' ``params``).
        sample_weight: The validation rows' weights, or None.
    """

    def __init__(self, model, x=None, y=None, batch_size=1024, callbacks=(), num_epoch=1,
                 sample_weight=None):
        self.model = model
        self.x = x
        # By key for a dict model, as in training (`feed.model_outputs`).
        self.y = model_outputs(y, output_keys(model), False) if isinstance(y, list) else y
        # Shaped to weigh every step of an output of several axes, as in training.
        self.sample_weight = None if sample_weight is None else sample_weights.per_row(
            sample_weight, [tuple(tensor.shape[1:]) for tensor in model.outputs])
        self.batch_size = batch_size
        self.records = []
        self.user_callbacks = list(callbacks or ())
        self.callbacks = keras_callback_list(callbacks, model, num_epoch)
        # TerminateOnNaN watches each batch's loss, and no batch ends here: it is shown the
        # epoch's mean step loss instead (NaN as soon as one step's loss was).
        self._batch_loss_callbacks = [callback for callback in callbacks or ()
                                      if type(callback).__name__ == "TerminateOnNaN"]
        self.num_epoch = num_epoch
        self.stopped_epoch = None
        # The last epoch's logs (loss, metrics, val_*), which `fit` hands to
        # `on_train_end`; as there, without what callbacks added to their own copy.
        self.last_logs = None
        # The validation of the weights `end` returned (see `returned_record`).
        self.returned_record = None
        # The monitor's thread evaluates epoch ends while the trainer's may end the run.
        self._lock = threading.RLock()

    @property
    def sets_learning_rate(self):
        """Whether a callback sets the optimizer's learning rate (``LearningRateScheduler``,
        ``ReduceLROnPlateau``)."""
        return any(type(callback).__name__ in LEARNING_RATE_CALLBACKS
                   for callback in self.user_callbacks)

    def learning_rate(self):
        """The learning rate that the callbacks left on the driver's model (the workers
        take it for the next epoch), or None without a callback that sets one."""
        if not self.sets_learning_rate:
            return None
        return float(np.asarray(self.model.optimizer.learning_rate))

    @property
    def stop_requested(self):
        """Whether a callback asked to stop (``model.stop_training``)."""
        return bool(getattr(self.model, "stop_training", False))

    def set_steps_per_epoch(self, steps):
        """Gives the callbacks ``params["steps"]``, as `fit` does: the minibatches of an
        epoch, over all workers (each partition's last one may be partial, so a
        distributed epoch may take a few more)."""
        if self.callbacks is not None:
            self.callbacks.set_params({"verbose": 0, "epochs": self.num_epoch,
                                       "steps": steps})

    def begin(self):
        """Calls the callbacks' ``on_train_begin``."""
        self.model.stop_training = False
        if self.callbacks is not None:
            self.callbacks.on_train_begin()

    def epoch_begin(self, epoch):
        """Calls the callbacks' ``on_epoch_begin`` before ``epoch`` (1-based) starts."""
        with self._lock:
            if self.callbacks is not None:
                self.callbacks.on_epoch_begin(epoch - 1)

    def evaluate(self, weights, epoch, samples, loss=None, metrics=None):
        """Evaluates ``weights`` reached after ``epoch`` (1-based) and calls the callbacks.

        Args:
            weights: The weights reached.
            epoch: The epoch that ended (1-based).
            samples: Samples trained so far.
            loss: The epoch's mean step loss, or None.
            metrics: The epoch's mean step value of each other training metric (``fit``'s
                logs hold them too: ``EarlyStopping(monitor="accuracy")``), or None.

        Returns:
            The validation record, or None without validation rows.
        """
        with self._lock:
            self.model.set_weights(list(weights))
            extra = {} if loss is None else {"loss": float(loss)}  # the epoch's training loss
            record = None if self.x is None else \
                self.evaluate_model(self.model, epoch, samples, **extra)
            logs = {name: float(value) for name, value in (metrics or {}).items()}
            logs.update({key: value for key, value in (record or {}).items()
                         if key.startswith("val_")})
            if loss is not None:
                logs["loss"] = float(loss)
            if self.callbacks is not None:
                if loss is not None:
                    for callback in self._batch_loss_callbacks:
                        callback.on_batch_end(0, {"loss": float(loss)})
                self.callbacks.on_epoch_end(epoch - 1, logs)  # Keras counts epochs from 0
                self.last_logs = logs
                if self.stop_requested and self.stopped_epoch is None:
                    self.stopped_epoch = epoch
                    logger.info("A callback stopped the training after epoch %d", epoch)
            return record

    def end(self, model, samples, loss=None, metrics=None, finalize=None):
        """Ends the training: evaluates the trained ``model`` as the last epoch's result,
        then ``finalize(model)`` where given (the weights `fit` ends with: an optimizer's
        moving averages with ``use_ema=True``, which `fit` sets after the last epoch's
        end; it returns whether it changed them), calls the callbacks' ``on_train_end`` and gives ``model`` the weights they leave,
        and the learning rate that a ``ReduceLROnPlateau`` or ``LearningRateScheduler``
        callback left (as after ``fit``: one that the last epoch's end lowered applies to
        training further).

        After a callback stopped the training, ``model`` gets the weights of the epoch it
        stopped after (the workers went on a little before they were stopped), or the
        best epoch's with ``EarlyStopping(restore_best_weights=True)``: always weights
        that a validation record describes.
        """
        with self._lock:
            if self.stopped_epoch is None:
                self.evaluate(model.get_weights(), self.num_epoch, samples, loss, metrics)
            # What the last record describes.
            evaluated = None if self.x is None else self.model.get_weights()
            # Only where finalize changed the weights: after a callback stopped the
            # training, this model holds the stopped epoch's, ``model`` later ones.
            if finalize is not None and finalize(model):
                self.model.set_weights(model.get_weights())  # what on_train_end sees
            if self.callbacks is not None:
                # As fit does: the logs of the last epoch that ended (the one a callback
                # stopped after), not None.
                self.callbacks.on_train_end(self.last_logs)
                model.set_weights(self.model.get_weights())
                if self.sets_learning_rate:
                    model.optimizer.learning_rate = self.learning_rate()
            self.returned_record = self._returned_record(evaluated, samples)

    def _returned_record(self, evaluated, samples):
        """The validation of the weights the callbacks left on the model at the train's
        end, or None without validation rows.

        The last record, where they are the weights it evaluated; else (an
        ``EarlyStopping(restore_best_weights=True)`` put back its best epoch's, also
        when no epoch stopped the training) the model evaluated again, not added to the
        records: ``epoch`` is that best epoch's, or None for weights another callback set.
        """
        if evaluated is None or not self.records:
            return None
        restored = self.model.get_weights()
        if len(restored) == len(evaluated) and all(
                np.array_equal(now, then) for now, then in zip(restored, evaluated)):
            return self.records[-1]
        logs = self.model.evaluate(self.x, self.y, batch_size=self.batch_size, verbose=0,
                                   sample_weight=self.sample_weight, return_dict=True)
        return {"epoch": self._restored_epoch(), "samples": int(samples),
                "timestamp": time.time(),
                **{f"val_{name}": float(np.asarray(value)) for name, value in logs.items()}}

    def _restored_epoch(self):
        """The epoch (1-based) whose weights an ``EarlyStopping(restore_best_weights=
        True)`` restored, or None."""
        for callback in self.user_callbacks:
            if type(callback).__name__ == "EarlyStopping" and \
                    getattr(callback, "restore_best_weights", False) and \
                    getattr(callback, "best_weights", None) is not None:
                return int(callback.best_epoch) + 1
        return None

    def evaluate_model(self, model, epoch, samples, **extra):
        """Evaluates a compiled model as it is; appends and returns the record."""
        logs = model.evaluate(self.x, self.y, batch_size=self.batch_size, verbose=0,
                              sample_weight=self.sample_weight, return_dict=True)
        record = {"epoch": epoch, "samples": int(samples), "timestamp": time.time(), **extra}
        record.update({f"val_{name}": float(np.asarray(value)) for name, value in logs.items()})
        self.records.append(record)
        logger.info("Validation after epoch %s (%d samples): %s", epoch, samples,
                    ", ".join(f"{key} {value:.4f}" for key, value in record.items()
                              if key.startswith("val_")))
        return record

