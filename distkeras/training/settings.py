"""A trainer's settings as one run uses them: resolved once, frozen, never written back.

A trainer's constructor stores what the user passed; `resolve` turns those arguments into
the settings of one run: the optimizer, loss, metrics and loss weights a compiled model
lends where they were not given, the columns of a dict keyed by the model's inputs or
outputs as a list in the model's order, and the weighted metrics of a compiled model. The
trainer keeps what the user gave, so its `get_config()` is the same before and after
`train()`.
"""

import types

from distkeras.algorithms.arguments import check_int
from distkeras.data import frame_checks
from distkeras.training.checks import (check_columns, compiled_with,
                                       compiled_without_loss, default_metrics,
                                       is_classification_loss)


class Settings:
    """The frozen settings of one run, read as attributes (``settings.loss``).

    They carry the same names as the trainer's constructor arguments (``master_model``
    for the model), so code written against a trainer's attributes reads them unchanged.
    """

    __slots__ = ("_values",)

    def __init__(self, values):
        object.__setattr__(self, "_values", types.MappingProxyType(dict(values)))

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"The settings have no {name!r}.") from None

    def __setattr__(self, name, value):
        raise AttributeError(f"Settings are frozen: {name!r} cannot be set. Pass the value to "
                             "the trainer's constructor instead.")

    def __reduce__(self):
        return Settings, (dict(self._values),)

    def __repr__(self):
        shown = ", ".join(f"{name}={value!r}" for name, value in self._values.items()
                          if name != "master_model")
        return f"Settings({shown})"

    def as_dict(self):
        """The settings by name (a new dict)."""
        return dict(self._values)

    def replace(self, **changes):
        """A copy with ``changes``; the settings themselves stay as they are."""
        return Settings(dict(self._values, **changes))


def stored_arguments(trainer):
    """What the trainer's constructor (and dist-keras's setters) stored: its public
    attributes, the model among them as ``master_model``."""
    return {name: value for name, value in vars(trainer).items() if not name.startswith("_")}


def compiled_settings(model, worker_optimizer, loss, metrics, loss_weights):
    """The optimizer, loss, metrics and loss weights a run trains with, by name.

    Those not given are taken from ``model`` when it is compiled (what its `fit` would
    train with), and its weighted metrics (``compile(weighted_metrics=...)``) always.
    Metrics not given for a model not compiled are an accuracy for one output trained with
    a classification loss (`checks.default_metrics`), else none (an accuracy of
    a regression reads 0).

    Returns:
        A dict with ``worker_optimizer``, ``loss``, ``metrics``, ``loss_weights`` and
        ``weighted_metrics``.
    """
    weighted_metrics = None  # not a setting of its own: only a compiled model's
    if getattr(model, "compiled", False):
        compiled = compiled_with(model)
        weighted_metrics = compiled.get("weighted_metrics") or None
        if worker_optimizer is None:
            worker_optimizer = model.optimizer
        if loss is None:
            loss = model.loss
        if metrics is None:
            metrics = compiled.get("metrics") or []
        if loss_weights is None:
            loss_weights = compiled.get("loss_weights")
    if metrics is None:
        outputs = getattr(model, "outputs", None) or [None]
        metrics = default_metrics(loss, model) if len(outputs) == 1 and \
            is_classification_loss(loss) else []
    return {"worker_optimizer": worker_optimizer, "loss": loss, "metrics": metrics,
            "loss_weights": loss_weights, "weighted_metrics": weighted_metrics}


def resolve(trainer, overrides=None):
    """The settings of a run of ``trainer``: its stored arguments with ``overrides``, the
    compiled model's settings where not given, the columns in the model's order.

    Args:
        trainer: A `Trainer`; left as it is.
        overrides: Stored arguments to replace for this run only (a Spark ML estimator's
            training Params), by name.

    Returns:
        A `Settings`, checked for the settings every trainer has (`check_common`).

    Raises:
        TypeError, ValueError: Naming the setting to change.
    """
    values = dict(stored_arguments(trainer), **(overrides or {}))
    unknown = sorted(set(overrides or {}) - set(stored_arguments(trainer)))
    if unknown:
        raise ValueError(f"{type(trainer).__name__} has no setting {unknown[0]!r} to replace.")
    model = values.get("master_model")
    _check_model(model)
    values.update(compiled_settings(model, values.get("worker_optimizer"), values.get("loss"),
                                    values.get("metrics"), values.get("loss_weights")))
    check_common(values)
    # A dict keyed by the model's input (output) names, as `fit` takes x (y), becomes the
    # list of its columns in the model's order.
    values["features_col"] = frame_checks.columns_by_name(
        values["features_col"], model, "inputs", "features_col")
    values["label_col"] = frame_checks.columns_by_name(
        values["label_col"], model, "outputs", "label_col")
    check_columns("features_col", values["features_col"])
    if values["label_col"] is None:
        _check_no_labels(model, values["loss"])
    else:
        check_columns("label_col", values["label_col"])
    return Settings(values)


def _check_model(model):
    import keras

    if not isinstance(model, keras.Model):
        raise TypeError("`keras_model` must be a keras.Model. "
                        f"Received: keras_model={type(model).__name__}")


def check_common(values):
    """Checks the optimizer, the loss, ``batch_size`` and ``num_epoch`` (a dict by name)."""
    required = ["worker_optimizer"]
    if not compiled_without_loss(values["master_model"]):
        required.append("loss")
    for name in required:
        if values[name] is None:
            example = "'adam'" if name == "worker_optimizer" else "'categorical_crossentropy'"
            raise ValueError(f"`{name}` is required, for example {name}={example}, unless "
                             "keras_model is compiled (its own is then used).")
    check_int("batch_size", values["batch_size"])
    check_int("num_epoch", values["num_epoch"])


def _check_no_labels(model, loss):
    """``label_col=None`` trains as ``fit(x)`` does, without targets: only a model whose
    loss is its own (compiled with ``loss=None``), which Keras trains so."""
    if not compiled_without_loss(model) or loss is not None:
        raise ValueError(
            "label_col=None trains without targets, as fit(x) does: only a model whose "
            "loss is its own (compiled with loss=None, its loss from add_loss, its "
            f"train_step or compute_loss). This one trains with loss={loss!r}: "
            "name its target column (an autoencoder's features: label_col='features').")
