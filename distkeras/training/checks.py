"""Checks of a trainer's settings, made on the driver before any Spark job.

Column names, and the loss, metrics and optimizer a trainer takes from a compiled model
(what its `fit` would train with). The checks of numbers are `distkeras.algorithms.arguments`.
"""

import numpy as np

from distkeras.keras_io import compile_config
from distkeras.keras_io.compile_config import serialize_keras_object


def is_classification_loss(loss):
    """Whether a loss (a name, a Keras loss or function, or its config) classifies: a
    cross-entropy, hinge or focal loss, for which accuracy means something."""
    if isinstance(loss, dict):
        name = str(loss.get("class_name", ""))
    elif isinstance(loss, str):
        name = loss
    else:
        name = getattr(loss, "__name__", None) or type(loss).__name__
    name = name.lower()
    return any(kind in name for kind in ("crossentropy", "hinge", "focal"))


def compiled_with(model):
    """The arguments a compiled ``model``'s ``compile`` was given, as objects.

    Not `get_compile_config()`: Keras's configs of some losses and metrics leave out
    arguments (``CosineSimilarity(axis=0)``'s axis), which `utils.serialize_keras_object`
    puts back from the objects only.
    """
    given = getattr(getattr(model, "_compile_config", None), "config", None)
    return dict(given) if isinstance(given, dict) else (model.get_compile_config() or {})


def compiled_without_loss(model):
    """Whether ``model`` was compiled with ``loss=None``, as Keras allows for a model whose
    loss is its own: layers' ``add_loss`` (an autoencoder's reconstruction penalty), or
    a ``train_step`` or ``compute_loss`` of its class. Its workers compile it so too."""
    return bool(getattr(model, "compiled", False)) and getattr(model, "loss", None) is None


def binary_loss_logits(loss):
    """Whether a loss (a name, a Keras loss or function, or its config) is a binary
    cross-entropy (focal or not), and whether it reads logits: ``(is_binary, from_logits)``."""
    if isinstance(loss, dict):
        name = str(loss.get("class_name", ""))
        config = loss.get("config") or {}
    else:
        name = loss if isinstance(loss, str) else \
            getattr(loss, "__name__", None) or type(loss).__name__
        config = loss.get_config() if hasattr(loss, "get_config") else {}
    return name.lower() in compile_config.BINARY_LOSSES, bool(config.get("from_logits", False))


def default_metrics(loss, model):
    """The metrics of a one-output model that was given none and classifies: accuracy.

    ``"accuracy"`` is what Keras's ``compile`` resolves from the labels' shape: for a
    binary cross-entropy over several sigmoid units (multi-hot labels) it becomes
    categorical accuracy (the argmax of the labels matched, meaningless there), and for
    logits it thresholds them at 0.5 rather than 0. Those get Keras's binary accuracy,
    thresholded where the loss puts probability 0.5, still logged as ``accuracy``.
    """
    import keras

    binary, from_logits = binary_loss_logits(loss)
    units = (tuple(model.outputs[0].shape) or (1,))[-1] if getattr(model, "outputs", None) \
        else 1
    if not binary or not (from_logits or (units or 1) > 1):
        return ["accuracy"]
    # A config, not an instance: each compile (workers, validation, the returned model)
    # then builds its own metric rather than sharing one's state.
    return [serialize_keras_object(keras.metrics.BinaryAccuracy(
        name="accuracy", threshold=0.0 if from_logits else 0.5))]


def uses_ema(optimizer):
    """Whether a worker optimizer (an instance, a config dict or a name) has use_ema=True."""
    if isinstance(optimizer, dict):
        return bool(optimizer.get("config", {}).get("use_ema", False))
    return bool(getattr(optimizer, "use_ema", False))


def steps_taken(optimizer):
    """The minibatches a built optimizer has taken, counting those it only accumulated.

    With ``gradient_accumulation_steps``, Keras's ``iterations`` is a tensor (not a
    variable) that counts the updates applied: a model `fit` for fewer minibatches than
    one accumulation holds gradients all the same. Its own step variable counts each.
    """
    steps = getattr(optimizer, "_iterations", None)
    if steps is None:
        steps = optimizer.iterations
    return int(np.asarray(steps))


def check_optimizer_tracks_trainable(model):
    """Refuses, as `fit` does, a model whose trainable weights changed since its optimizer
    was built (layers frozen or unfrozen without compiling again).

    Its state (moments per trainable weight) fits the old split only: on an executor this
    failed as 'The optimizer has N variables; the state given has M', after every attempt.
    """
    tracked = getattr(model.optimizer, "_trainable_variables", None)
    if tracked is None:
        return
    current = model.trainable_variables
    if [id(variable) for variable in tracked] != [id(variable) for variable in current]:
        raise ValueError(
            f"The model has {len(current)} trainable weights, and its optimizer was built "
            f"for {len(tracked)}: layers were frozen or unfrozen (`trainable`) after the "
            "model was compiled. Call `model.compile(...)` again after changing "
            "`trainable`, as Keras's `fit` requires.")


def check_columns(name, value):
    """Refuses a column setting that is not a name or a non-empty list of names (a dict
    keyed by the model's names has become the list by now)."""
    names = list(value) if isinstance(value, (list, tuple)) else [value]
    if not names or not all(isinstance(column, str) and column for column in names):
        none = " (or None, for a model compiled with loss=None, trained as fit(x))" \
            if name == "label_col" else ""
        raise TypeError(f"`{name}` must be a column name, a list of column names (one per "
                        "model input or output, in the model's order) or a dict keyed by the "
                        f"model's input or output names{none}. Received: {name}={value!r}")
