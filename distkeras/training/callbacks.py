"""The Keras callbacks of ``train(callbacks=...)``: which can work here, and their list.

`distkeras.training.validator` calls them back on the driver, at epoch ends only (the
workers run the batches): `check_callbacks` refuses one that would change nothing,
silently, and warns of options that do nothing here.
"""

import logging
import re

logger = logging.getLogger(__name__)


# Callbacks that change the optimizer's learning rate between epochs: the trainers hand the
# rate they leave on the driver's model to their workers' optimizers.
LEARNING_RATE_CALLBACKS = ("LearningRateScheduler", "ReduceLROnPlateau")
# Callbacks that act on `fit`'s own loop or on the optimizer's internals, with what to
# use instead.
_REFUSED_CALLBACKS = {
    "BackupAndRestore": " To go on after an interrupted run, pass train(df, "
                        "checkpoint_dir=..., resume=True) to a parameter-server trainer "
                        "(ADAG, DOWNPOUR, ...) or AllReduceTrainer, or save each epoch's model with "
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
    steps and workers (see `distkeras.training.epoch_metrics`); a class of the user's is not
    known to.

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
    # accumulating metrics are added up over them (`metric_sums.additive`).
    if isinstance(metrics, keras.metrics.Metric) and \
            type(metrics).result is not keras.metrics.Mean.result and \
            not type(metrics).__module__.startswith("keras."):
        # Keras numbers each further instance of a name made in this process ("auc_2");
        # a worker's compile makes the first, whose logs say "auc".
        yield re.sub(r"_\d+$", "", metrics.name) if made_here else metrics.name



def keras_callback_list(callbacks, model, num_epoch):
    """A `keras.callbacks.CallbackList` over ``model``, or None without callbacks."""
    import keras

    if not callbacks:
        return None
    return keras.callbacks.CallbackList(list(callbacks), model=model, epochs=num_epoch,
                                        verbose=0)
