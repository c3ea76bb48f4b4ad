"""The loss a `LossEvaluator` computes: a name, or the Keras loss a model was compiled
with, read as a `LossSpec` (the loss and its arguments), or refused where Spark cannot
compute it as Keras's ``evaluate`` does."""

import collections
import json

from distkeras.keras_io.compile_config import serialize_keras_object

LOSSES = ("categorical_crossentropy", "sparse_categorical_crossentropy",
          "binary_crossentropy", "mse", "mean_squared_error", "mae", "mean_absolute_error",
          "huber", "log_cosh")
# Keras's long names of the regression losses, read as their short ones.
_ALIASES = {"mean_squared_error": "mse", "mean_absolute_error": "mae"}
HUBER_DELTA = 1.0  # keras.losses.huber's default
# Keras's loss classes, by the name of the loss they compute here.
_CLASSES = {"CategoricalCrossentropy": "categorical_crossentropy",
            "SparseCategoricalCrossentropy": "sparse_categorical_crossentropy",
            "BinaryCrossentropy": "binary_crossentropy", "MeanSquaredError": "mse",
            "MeanAbsoluteError": "mae", "Huber": "huber", "LogCosh": "log_cosh"}
# Keras's reductions whose value is the same whatever the batch size (evaluate's loss is
# the mean over batches, weighted by their sizes, of each batch's reduced loss): the sum
# of the weighted losses over the number of rows, or over the sum of the weights.
_REDUCTIONS = {"sum_over_batch_size": False, "mean": False, "mean_with_sample_weight": True}

# A loss as computed here: its name (one of LOSSES), whether the predictions are logits,
# the labels' smoothing, the class index left out (sparse categorical cross-entropy),
# Huber's delta, and whether a weighted mean divides by the weights' sum.
LossSpec = collections.namedtuple(
    "LossSpec", "name from_logits label_smoothing ignore_class delta per_weight")


def loss_text(value):
    """The ``loss`` Param's value as text: a name as it is, a Keras loss (an object, a
    function, or its config) as the JSON of its Keras config, so that the evaluator
    saves and copies as Spark's do and the loss is rebuilt with all its arguments."""
    if isinstance(value, str):
        return value

    try:
        return json.dumps(serialize_keras_object(value))
    except (TypeError, ValueError) as error:
        raise TypeError(f"`loss` must be a loss name or a Keras loss. Received: "
                        f"loss={value!r}") from error


def resolve_loss(text, from_logits, from_logits_set):
    """The `LossSpec` that ``text`` (the ``loss`` Param) names, or a ValueError for a loss or
    an argument whose value this evaluator cannot compute as Keras's ``evaluate`` does.

    Args:
        text: A name of LOSSES, a Keras loss name or class name, or a Keras loss's
            config as JSON.
        from_logits: The ``fromLogits`` Param.
        from_logits_set: Whether it was set (it then has to agree with the loss's own).
    """
    if text in LOSSES:
        return LossSpec(_ALIASES.get(text, text), from_logits, 0.0, None, HUBER_DELTA, False)
    import keras

    try:
        loss = keras.losses.get(json.loads(text) if text.startswith("{") else text)
    except (TypeError, ValueError) as error:
        raise ValueError(f"`loss` must be one of {LOSSES} or a Keras loss of one of the "
                         f"classes {sorted(_CLASSES)}. Received: loss={text!r}") from error
    if not isinstance(loss, keras.losses.Loss):  # a function: Keras's own, by its name
        name = getattr(loss, "__name__", None)
        if name not in LOSSES:
            raise ValueError(f"`loss` must be one of {LOSSES} or a Keras loss of one of the "
                             f"classes {sorted(_CLASSES)}. Received: loss={text!r}")
        return LossSpec(_ALIASES.get(name, name), from_logits, 0.0, None, HUBER_DELTA, False)
    # Only Keras's own classes: a subclass may compute anything in `call`.
    name = _CLASSES.get(type(loss).__name__) \
        if type(loss).__module__.startswith("keras.") else None
    if name is None:
        raise ValueError(
            f"LossEvaluator computes the losses {sorted(_CLASSES)} (Keras's classes, with "
            f"their arguments) in Spark; it cannot compute {type(loss).__name__}, whose "
            "value only Keras knows. Score such rows with the model's own `evaluate` on "
            "collected data.")
    arguments = getattr(loss, "_fn_kwargs", {})
    if arguments.get("axis", -1) != -1:
        raise ValueError(f"LossEvaluator reads the classes on the last axis; {type(loss).__name__}"
                         f" has axis={arguments['axis']}.")
    if loss.reduction not in _REDUCTIONS:
        # Keras's `evaluate` reports the mean over batches of each batch's loss: a sum (or
        # no reduction) depends on the batch size, which a DataFrame does not have.
        raise ValueError(
            f"LossEvaluator computes a loss reduced to a mean (reduction one of "
            f"{sorted(_REDUCTIONS)}); {type(loss).__name__} has "
            f"reduction={loss.reduction!r}, whose value in Keras's `evaluate` depends on the "
            "batch size.")
    own = bool(arguments.get("from_logits", False))
    if from_logits_set and "from_logits" in arguments and own != from_logits:
        raise ValueError(f"`from_logits={from_logits}` contradicts the loss's own "
                         f"from_logits={own} ({type(loss).__name__}); set one of them.")
    return LossSpec(name, own or from_logits, float(arguments.get("label_smoothing") or 0.0),
                    arguments.get("ignore_class"), float(arguments.get("delta", HUBER_DELTA)),
                    _REDUCTIONS[loss.reduction])
