"""Validation during training, as Keras's ``fit(validation_data=...)`` reports it.

``train(df, validation_data=val_df)`` (or a fraction of ``df``, split off at random, or
numpy arrays ``(x, y)`` as for ``fit``) holds the validation rows on the driver as numpy
arrays and evaluates the model on them: the center variable as the workers' samples
complete each epoch (parameter-server trainers), the average after each epoch
(`AveragingTrainer`), the exact end of each epoch (`SingleTrainer`), and the returned
model at the end.
Each evaluation is one record of ``trainer.get_validation_history()``: ``epoch``,
``samples`` (trained so far), ``timestamp``, ``loss`` (the epoch's mean step loss, where
known), ``val_loss`` and ``val_<metric>``.
"""

import logging
import numbers
import re
import threading
import time

import numpy as np

from distkeras.data import dataframes
from distkeras.data import sample_weights
from distkeras.data.feed import (arrow_name, column_to_numpy, input_names, integer_dtype,
                                 model_inputs, model_outputs, output_keys, output_names)

logger = logging.getLogger(__name__)

SPLIT_COLUMN = "__distkeras_validation_draw"

# The validation rows are held on the driver; more than this many is refused rather than
# running the driver out of memory (250,000 Fashion-MNIST images are 784 MB as float32).
MAX_ROWS = 250_000


def split(dataframe, validation_data, seed=1234):
    """The training and validation DataFrames for ``validation_data``.

    Args:
        dataframe: The training DataFrame the user passed.
        validation_data: A DataFrame with the same columns, or a fraction in (0, 1) of
            ``dataframe``'s rows to hold out (each row drawn with a seeded random number,
            so cache ``dataframe`` for the same split every time it is read).
        seed: Seed of the draw.

    Returns:
        ``(training, validation)`` DataFrames.

    Raises:
        ValueError: For a fraction outside (0, 1) or another kind of value.
    """
    from pyspark.sql import DataFrame
    from pyspark.sql import functions as F

    if isinstance(validation_data, DataFrame) or \
            (type(validation_data).__module__ or "").startswith("pyspark.sql.connect"):
        dataframes.check_spark_dataframe(validation_data, "validation data")
        return dataframe, validation_data
    if isinstance(validation_data, list) and len(validation_data) in (2, 3):
        validation_data = tuple(validation_data)  # fit takes [x, y] as (x, y)
    if isinstance(validation_data, tuple):
        return dataframe, validation_data  # numpy arrays, as for fit: see `from_arrays`
    if isinstance(validation_data, bool) or not isinstance(validation_data, numbers.Real) \
            or not 0.0 < validation_data < 1.0:
        raise ValueError(
            "`validation_data` must be a Spark DataFrame with the training columns, a tuple "
            "(x, y) of numpy arrays as for Keras's fit, or a fraction between 0 and 1 of "
            f"the rows to hold out. Received: {_short(validation_data)}")
    drawn = dataframe.withColumn(SPLIT_COLUMN, F.rand(seed))
    training = drawn.where(F.col(SPLIT_COLUMN) >= validation_data).drop(SPLIT_COLUMN)
    validation = drawn.where(F.col(SPLIT_COLUMN) < validation_data).drop(SPLIT_COLUMN)
    return training, validation


def _short(value):
    text = repr(value)
    return text if len(text) <= 200 else text[:200] + "..."


def _fit_arrays(arrays, shapes, what):
    """Each numeric array with rows of its shape (flat rows are reshaped, as the
    DataFrame's are; a ``()`` shape takes the array as it is)."""
    fitted = []
    for index, (array, shape) in enumerate(zip(arrays, shapes)):
        array = np.asarray(array)
        name = what if len(arrays) == 1 else f"{what}[{index}]"
        if array.dtype == object or not (np.issubdtype(array.dtype, np.number)
                                         or array.dtype == bool):
            raise TypeError(f"validation_data's {name} must be a numeric numpy array. "
                            f"Received dtype {array.dtype}.")
        if array.ndim == 0:
            raise ValueError(f"validation_data's {name} must have one row per sample. "
                             f"Received a scalar.")
        size = int(np.prod(shape)) if shape else 1
        if shape == () or array.shape[1:] == tuple(shape):
            fitted.append(array)
        elif int(np.prod(array.shape[1:])) == size:
            fitted.append(array.reshape((len(array), *shape)))
        else:
            raise ValueError(
                f"validation_data's {name} has rows of shape {array.shape[1:]}; the model "
                f"expects {tuple(shape)}.")
    return fitted


def from_arrays(data, model):
    """Keras-style validation arrays ``(x, y)`` or ``(x, y, sample_weight)`` checked
    against ``model``, as ``(x, y, sample_weight)`` (None when not given).

    ``x`` (and ``y``) are a numpy array, or a list of them for a model with several inputs
    (outputs). Flat rows are reshaped to the model's shapes; labels may be class indices
    for an output of several classes (one per row, or one per step of an output of shape
    ``(steps, classes)``). ``sample_weight`` holds one number per row. ``(x,)`` or
    ``(x, None)`` hold no labels (a model trained with ``label_col=None``): ``y`` is then
    None, and so are the weights, as ``fit`` drops them without ``y``.

    Raises:
        ValueError: Naming what does not fit the model.
    """
    from distkeras.data.feed import check_class_indices

    if len(data) not in (1, 2, 3):
        raise ValueError(
            "`validation_data` as arrays must be a tuple (x, y) or (x, y, sample_weight), "
            "or (x,) for a model trained without labels, as for Keras's fit. Received a "
            f"tuple of {len(data)}.")
    x, y = (data[0], None) if len(data) == 1 else data[:2]
    xs = _by_name(x, [tensor.name for tensor in model.inputs], "x") \
        if isinstance(x, dict) else list(x) if isinstance(x, (list, tuple)) else [x]
    if len(xs) != len(model.inputs):
        raise ValueError(f"The model has {len(model.inputs)} inputs; validation_data holds "
                         f"{len(xs)} input arrays.")
    input_shapes = [tuple(int(dim) for dim in tensor.shape[1:]) for tensor in model.inputs]
    xs = [array.astype(integer_dtype(tensor) or np.float32, copy=False)
          for array, tensor in zip(_fit_arrays(xs, input_shapes, "x"), model.inputs)]
    labels = []
    if y is not None:
        ys = _by_name(y, output_names(model), "y") \
            if isinstance(y, dict) else list(y) if isinstance(y, (list, tuple)) else [y]
        output_shapes = [tuple(int(dim) for dim in tensor.shape[1:])
                         for tensor in model.outputs]
        if len(ys) != len(output_shapes):
            raise ValueError(f"The model has {len(output_shapes)} outputs; validation_data "
                             f"holds {len(ys)} label arrays.")
        for index, (array, shape) in enumerate(zip(ys, output_shapes)):
            array = np.asarray(array)
            name = "y" if len(ys) == 1 else f"y[{index}]"
            if array.ndim >= 1 and shape and shape[-1] > 1 and \
                    array.shape[1:] == shape[:-1]:  # class indices
                (array,) = _fit_arrays([array], [shape[:-1]], name)
                check_class_indices(array, shape[-1], f"validation_data's {name}")
                labels.append(array.astype(np.int32))
            else:
                (array,) = _fit_arrays([array], [shape], name)
                labels.append(array.astype(np.float32, copy=False))
    rows = {len(array) for array in xs + labels}
    if len(rows) != 1:
        raise ValueError(f"validation_data's arrays have different numbers of rows: "
                         f"{sorted(rows)}.")
    if rows == {0}:
        raise ValueError("The validation data has no rows.")
    weights = None if y is None or len(data) == 2 or data[2] is None else \
        _validation_weights(data[2], rows.pop())
    x = model_inputs(xs, input_names(model), len(xs) == 1)
    if y is None:
        return x, None, None
    return x, (labels[0] if len(labels) == 1 else labels), weights


def _by_name(arrays, names, what):
    """The arrays of a dict keyed by the model's input (output) names, in their order, as
    Keras's ``fit`` reads ``x`` (``y``) given as a dict."""
    missing = [name for name in names if name not in arrays]
    if missing or len(arrays) != len(names):
        raise ValueError(
            f"validation_data's {what} is a dict with keys {sorted(arrays)}; the model's "
            f"{'inputs' if what == 'x' else 'outputs'} are named {names}.")
    return [arrays[name] for name in names]


def _validation_weights(sample_weight, rows):
    """``sample_weight`` of ``validation_data`` as float32, one finite number >= 0 per row."""
    weights = np.asarray(sample_weight)
    if weights.dtype == object or not (np.issubdtype(weights.dtype, np.number)
                                       or weights.dtype == bool):
        raise TypeError("validation_data's sample_weight must be a numeric numpy array. "
                        f"Received dtype {weights.dtype}.")
    if weights.shape not in ((rows,), (rows, 1)):
        raise ValueError(f"validation_data's sample_weight must hold one number per row "
                         f"({rows} rows). Received shape {weights.shape}.")
    weights = weights.reshape(rows).astype(np.float32)
    if not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise ValueError("validation_data's sample_weight must be finite numbers >= 0.")
    return weights


def collect(validation, model, features_col, label_col, sample_weight_col=None):
    """The validation rows as numpy arrays ``(x, y, sample_weight)`` shaped for ``model``.

    ``sample_weight`` is the rows' ``sample_weight_col`` where the validation rows have
    that column (as Keras's ``validation_split`` keeps the training weights), else None.

    Raises:
        ValueError: When the rows do not fit the model (see `dataframes.validate`) or
            there are none.
    """
    try:
        label_shapes = dataframes.validate(validation, model, features_col, label_col)
    except (TypeError, ValueError) as error:
        raise type(error)(f"In the validation data: {error}") from error
    features = dataframes.as_column_list(features_col)
    labels = dataframes.as_column_list(label_col)
    if sample_weight_col is not None and sample_weight_col not in validation.columns:
        logger.info("The validation data has no %r column: its rows are not weighted.",
                    sample_weight_col)
        sample_weight_col = None
    # Dense vectors: the rows are held on the driver whole anyway, and `toArrow` fails
    # on a null vector struct (with an Arrow error that names no column).
    table = dataframes.training_frame(validation, features_col, label_col,
                                      sample_weight_col, sparse=False
                                      ).limit(MAX_ROWS + 1).toArrow()
    if table.num_rows == 0:
        raise ValueError("The validation data has no rows.")
    if table.num_rows > MAX_ROWS:
        raise ValueError(
            f"The validation data has more than {MAX_ROWS:,} rows; they are held on the "
            "driver. Pass a sample of them (`validation_df.sample(fraction=...)`) or a "
            "smaller fraction.")
    input_shapes = [tuple(int(dim) for dim in tensor.shape[1:]) for tensor in model.inputs]
    x = [_column(table, name, shape, integer_dtype(tensor))
         for name, shape, tensor in zip(features, input_shapes, model.inputs)]
    y = [_column(table, name, given) for name, given in zip(labels, label_shapes)]
    single_input = not isinstance(features_col, (list, tuple))
    single_output = not isinstance(label_col, (list, tuple))
    if label_col is None:  # no targets, as fit(x)'s validation_data=(x_val,)
        y, single_output = [None], True
    weights = None
    if sample_weight_col is not None:
        weights = _validation_weights(
            table.column(arrow_name(sample_weight_col)).to_numpy(zero_copy_only=False),
            table.num_rows)
    logger.info("Validating on %d rows held on the driver", table.num_rows)
    return model_inputs(x, input_names(model), single_input), \
        (y[0] if single_output else y), weights


def _column(table, name, shape, dtype=None):
    """Column ``name`` of the collected validation rows as `column_to_numpy` reads it; its
    errors (nulls, NaN, rows of the wrong length) say that the validation data holds them,
    not a training partition: a NaN would make every ``val_loss`` NaN, and an
    ``EarlyStopping`` or ``ModelCheckpoint`` on it see no epoch better than another."""
    try:
        return column_to_numpy(table.column(arrow_name(name)).combine_chunks(), shape, name,
                               dtype, finite=True)
    except ValueError as error:
        message = str(error).replace(" in this partition", "").replace(
            " (in one Arrow batch of this partition)", "")
        raise ValueError(f"In the validation data: {message}") from error


# Callbacks that change the optimizer's learning rate between epochs: the trainers hand the
# rate they leave on the driver's model to their workers' optimizers.
LEARNING_RATE_CALLBACKS = ("LearningRateScheduler", "ReduceLROnPlateau")
# Callbacks that act on `fit`'s own loop or on the optimizer's internals, with what to
# use instead.
_REFUSED_CALLBACKS = {
    "BackupAndRestore": " To go on after an interrupted run, pass train(df, "
                        "checkpoint_dir=..., resume=True) to a parameter-server trainer "
                        "(ADAG, DOWNPOUR, ...), or save each epoch's model with "
                        "keras.callbacks.ModelCheckpoint.",
    "SwapEMAWeights": "",
}


# What `Validator` calls back: `fit`'s epoch-level hooks. The batch-level ones run in
# `fit`'s own loop (and its validation's), which the workers replace.
_CALLED_HOOKS = ("on_train_begin", "on_train_end", "on_epoch_begin", "on_epoch_end")
_UNCALLED_HOOKS = ("on_batch_begin", "on_batch_end", "on_train_batch_begin",
                   "on_train_batch_end", "on_test_begin", "on_test_end",
                   "on_test_batch_begin", "on_test_batch_end")


def _defined_hooks(callback, hooks, outside_keras=False):
    """The ``hooks`` that ``callback`` defines: as arguments (a ``LambdaCallback``'s) or in
    its class, below `keras.callbacks.Callback` (``outside_keras``: in a class of the
    user's, not one of Keras's, which the trainers handle themselves)."""
    import keras

    defined = []
    for hook in hooks:
        if hook in vars(callback):
            defined.append(hook)
            continue
        owner = next(cls for cls in type(callback).__mro__ if hook in vars(cls))
        if owner is not keras.callbacks.Callback and not (
                outside_keras and owner.__module__.startswith("keras.")):
            defined.append(hook)
    return defined


def _check_batch_hooks(callback):
    """Refuses a callback of the user's that acts on batches only (it would do nothing,
    silently), and warns of one that also acts on epochs (its batch hooks never run)."""
    uncalled = _defined_hooks(callback, _UNCALLED_HOOKS, outside_keras=True)
    if not uncalled:
        return
    name = type(callback).__name__
    message = (f"{name}'s {', '.join(uncalled)} would never be called: train() calls "
               f"back only {', '.join(_CALLED_HOOKS)}, on the driver, as the workers run "
               "the batches")
    if not _defined_hooks(callback, _CALLED_HOOKS):
        raise ValueError(f"{message}; it would do nothing. Act on on_epoch_end's logs "
                         "(the epoch's loss and metrics), or on trainer.get_history() "
                         "(every step's) after train().")
    logger.warning("%s.", message)


def _warn_of_tensorboard_batch_options(callback):
    """Warns that a `TensorBoard`'s batch-level options do nothing here: it writes its
    epoch summaries, but its batch summaries and profiling run on batch ends, which the
    workers do not call back."""
    unheard = []
    if getattr(callback, "update_freq", "epoch") != "epoch":
        unheard.append(f"update_freq={callback.update_freq!r} (batch summaries)")
    if getattr(callback, "_start_batch", 0) > 0:
        unheard.append(f"profile_batch=({callback._start_batch}, {callback._stop_batch}) "
                       "(profiling)")
    if unheard:
        logger.warning(
            "TensorBoard's %s will not happen: train() calls callbacks back at epoch ends "
            "only, so it writes epoch summaries alone. Every step's loss and metrics are in "
            "trainer.get_history() after train().", " and ".join(unheard))


def check_callbacks(callbacks, trainer_name="This trainer", learning_rate_callbacks=False):
    """The Keras callbacks as a list, or a clear error for one that cannot work here.

    Args:
        callbacks: What `train()` was given: a list of callbacks, one callback or a
            `keras.callbacks.CallbackList`, as ``fit`` takes them.
        trainer_name: Named in the errors.
        learning_rate_callbacks: Whether the trainer applies a learning rate set by a
            callback (``LearningRateScheduler``, ``ReduceLROnPlateau``) to the next epoch.

    Raises:
        TypeError: For something that is not a `keras.callbacks.Callback`.
        ValueError: For a callback that would change nothing, silently (one of the
            user's that acts on batch ends only, for instance).
    """
    import keras

    callbacks = as_callback_list(callbacks)
    for callback in callbacks:
        if not isinstance(callback, keras.callbacks.Callback):
            raise TypeError("`callbacks` must be keras.callbacks.Callback instances. "
                            f"Received: {type(callback).__name__}")
        name = type(callback).__name__
        if name in _REFUSED_CALLBACKS:
            raise ValueError(f"{name} acts on Keras's own training loop, which does not run "
                             f"here: it would change nothing.{_REFUSED_CALLBACKS[name]}")
        if name == "ProgbarLogger":
            raise ValueError("ProgbarLogger draws Keras's own progress bar, per step: "
                             "train() draws its own (verbose=1 for a bar, 2 for lines).")
        if name == "ModelCheckpoint" and getattr(callback, "save_freq", "epoch") != "epoch":
            # It saves on batch ends only, which are not called back here: no file at all.
            raise ValueError(
                f"ModelCheckpoint(save_freq={callback.save_freq!r}) saves every "
                f"{callback.save_freq} batches, but train() calls callbacks back at epoch "
                "ends only: it would save nothing. Use save_freq='epoch' (the default).")
        if name == "TensorBoard":
            _warn_of_tensorboard_batch_options(callback)
        _check_batch_hooks(callback)
        if name in LEARNING_RATE_CALLBACKS and not learning_rate_callbacks:
            raise ValueError(
                f"{name} changes the learning rate, but {trainer_name}'s optimizers live in "
                "its workers: it would change nothing here. Use a learning rate schedule in "
                "`worker_optimizer` (keras.optimizers.schedules), or SingleTrainer or "
                "AveragingTrainer, which apply it.")
    return callbacks


def as_callback_list(callbacks):
    """``callbacks`` as a list: ``fit`` also takes one callback alone, or a
    `keras.callbacks.CallbackList` (whose callbacks are checked one by one)."""
    import keras

    if isinstance(callbacks, keras.callbacks.CallbackList):
        return list(callbacks.callbacks)
    if isinstance(callbacks, keras.callbacks.Callback):
        return [callbacks]
    return list(callbacks or [])


def warn_of_step_mean_metrics(metrics):
    """Warns that the callbacks' training value of each compile metric of the user's own
    class whose result is not a mean is the mean of its per-step values here, which
    differs from ``fit``'s (its ``val_`` value is exact). Keras's own metrics (``AUC``,
    ``Precision``, ``RootMeanSquaredError``, ...) get fit's value: their state adds up over
    steps and workers (see `distkeras.epoch_metrics`); a class of the user's is not known
    to.

    Args:
        metrics: The trainer's ``metrics``, as ``compile`` takes them (names, instances,
            functions; a list, or a list or dict per output).
    """
    names = sorted(set(_step_mean_metric_names(metrics)))
    if names:
        logger.warning(
            "In the callbacks' epoch logs, the training %s is the mean of per-step values, "
            "not fit's value over the whole epoch (metrics of your own classes are not known "
            "to add up over steps and workers, as Keras's own do); the validation values "
            "are exact: monitor %s.", " and ".join(names),
            " or ".join(f"val_{name}" for name in names))


def _step_mean_metric_names(metrics):
    """Names of the metrics in ``metrics`` of the user's own classes whose epoch value is
    not a mean of steps."""
    import keras

    if isinstance(metrics, dict) and "class_name" not in metrics:  # one entry per output
        metrics = list(metrics.values())
    if isinstance(metrics, (list, tuple)):
        for metric in metrics:
            yield from _step_mean_metric_names(metric)
        return
    made_here = isinstance(metrics, (str, dict))
    if made_here:  # a name ("AUC") or a config, as compile resolves them
        try:
            metrics = keras.metrics.get(metrics)
        except ValueError:  # a name compile resolves itself ("acc"): a mean
            return
    # Means (accuracy, mae, a function's wrapper) average exactly over steps; Keras's own
    # accumulating metrics are added up over them (`epoch_metrics.additive`).
    if isinstance(metrics, keras.metrics.Metric) and \
            type(metrics).result is not keras.metrics.Mean.result and \
            not type(metrics).__module__.startswith("keras."):
        # Keras numbers each further instance of a name made in this process ("auc_2");
        # a worker's compile makes the first, whose logs say "auc".
        yield re.sub(r"_\d+$", "", metrics.name) if made_here else metrics.name


# Keys of a step record that describe the step rather than measure it.
_STEP_KEYS = frozenset({"worker_id", "iteration", "timestamp", "batch_size", "epoch",
                        "attempt"})


def epoch_logs(records, metric_states=()):
    """The epoch's loss and metrics as ``fit``'s epoch logs hold them.

    Each metric whose workers reported its state (``metric_states``: the epoch's reports,
    see `distkeras.epoch_metrics`) gets its result over the state of all the epoch's steps;
    any other measured value, the mean over step records, each step weighing its
    ``batch_size`` (1 where a record has none): an epoch's smaller last batch counts for
    its rows. A value that is NaN in one step is NaN. Steps of a failed task that Spark's
    retry trained again (``superseded``) do not count."""
    from distkeras.epoch_metrics import exact_logs

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


def keras_callback_list(callbacks, model, num_epoch):
    """A `keras.callbacks.CallbackList` over ``model``, or None without callbacks."""
    import keras

    if not callbacks:
        return None
    return keras.callbacks.CallbackList(list(callbacks), model=model, epochs=num_epoch,
                                        verbose=0)
