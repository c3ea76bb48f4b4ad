"""A model's compile configuration as it travels: optimizers, losses and metrics as
JSON-able configs, rebuilt on the executors, and the driver's checks of what would fail
in every executor's ``compile``.
"""

import copy
import numbers

import numpy as np

from distkeras.keras_io.archives import defer_tensorflow_import


def serialize_keras_object(obj):
    """Turns an optimizer, loss or metric into something JSON-able (strings stay strings)."""
    import keras

    if obj is None or isinstance(obj, str):
        return obj
    defer_tensorflow_import()
    if isinstance(obj, (list, tuple)):
        return [serialize_keras_object(item) for item in obj]
    if isinstance(obj, dict) and "class_name" in obj:
        return obj
    if isinstance(obj, dict):
        return {key: serialize_keras_object(value) for key, value in obj.items()}
    return _with_loss_arguments(obj, keras.saving.serialize_keras_object(obj))


def _with_loss_arguments(obj, config):
    """``config`` with the constructor arguments that Keras's own loss leaves out of it.

    Keras's ``Huber``, ``CosineSimilarity`` and ``SparseCategoricalCrossentropy`` losses
    (and the ``CosineSimilarity`` metric) keep ``delta`` or ``axis`` out of
    ``get_config()``: ``Huber(delta=2.0)`` would be rebuilt on the executors (and in the
    returned model) as ``delta=1.0``, silently. They are put back from the arguments the
    loss or metric passes to its function.
    """
    import inspect

    import keras

    # Keras's built-in losses wrap a function and keep its arguments in `_fn_kwargs`.
    arguments = getattr(obj, "_fn_kwargs", None)
    if not isinstance(obj, (keras.losses.Loss, keras.metrics.Metric)) or \
            not isinstance(arguments, dict) or \
            not isinstance(config, dict) or not isinstance(config.get("config"), dict):
        return config
    accepted = inspect.signature(type(obj).__init__).parameters
    missing = {name: value for name, value in arguments.items()
               if name in accepted and name not in config["config"]}
    if not missing:
        return config
    return {**config, "config": {**config["config"],
                                 **keras.saving.serialize_keras_object(missing)}}


def compile_arguments(optimizer, loss, metrics, loss_weights=None, weighted_metrics=None,
                      model=None):
    """``model.compile`` keyword arguments from names, objects or config dicts.

    Config dicts may be full Keras configs or the short ``{"class_name": "SGD", "config":
    {...}}`` form; each is resolved by its own kind (optimizer, loss, metric), so the
    built-in names resolve without a module path. A fresh optimizer is made every time,
    with the weight decay exclusions that `optimizer_config` put in its config, for
    ``model`` (the model it will train; without one, only the exclusions by name).
    """
    import keras

    def resolve(getter, config):
        if isinstance(config, dict):
            return getter(copy.deepcopy(config))  # Keras's getters edit the dict they get
        return config

    optimizer = serialize_keras_object(optimizer)
    exclusions = None
    if isinstance(optimizer, dict) and _DECAY_EXCLUSIONS in optimizer:
        optimizer = dict(optimizer)
        exclusions = optimizer.pop(_DECAY_EXCLUSIONS)
    optimizer = resolve(keras.optimizers.get, optimizer)
    if exclusions:
        _exclude_from_weight_decay(optimizer, exclusions, model)
    if isinstance(loss, dict) and "class_name" in loss:
        loss = resolve(keras.losses.get, loss)
    elif isinstance(loss, dict):  # one loss per output name
        loss = {name: resolve(keras.losses.get, value) for name, value in loss.items()}
    elif isinstance(loss, list):
        loss = [resolve(keras.losses.get, value) for value in loss]

    def resolve_metrics(structure):  # a list, a list per output, or a dict by output
        if isinstance(structure, dict) and "class_name" not in structure:
            return {name: resolve_metrics(value) for name, value in structure.items()}
        if isinstance(structure, (list, tuple)):
            return [resolve_metrics(value) for value in structure]
        return resolve(keras.metrics.get, structure)

    return {"optimizer": optimizer, "loss": loss, "loss_weights": loss_weights,
            "metrics": resolve_metrics(metrics) if metrics else None,
            "weighted_metrics": resolve_metrics(weighted_metrics) if weighted_metrics else None}


def optimizer_as_compiled(optimizer, model):
    """The optimizer ``model.compile`` trains ``model`` with, as a config.

    Keras's ``compile`` wraps the optimizer of a ``mixed_float16`` model in a
    ``LossScaleOptimizer``. The model's own policy comes from the global policy where it
    was built; executors rebuild it under theirs (float32), so their ``compile`` would
    train without loss scaling, where float16 gradients underflow: the wrapping is done
    here, on the driver, where the model was built.

    Args:
        optimizer: A name, an optimizer or its config.
        model: The Keras model the optimizer trains.
    """
    import keras

    config = optimizer_config(optimizer, model)
    policy = getattr(getattr(model, "dtype_policy", None), "name", None)
    # A compiled model's own optimizer is already as its compile made it (perhaps with
    # auto_scale_loss=False).
    if policy != "mixed_float16" or optimizer is getattr(model, "optimizer", None) or (
            isinstance(config, dict) and config.get("class_name") == "LossScaleOptimizer"):
        return config
    exclusions = config.pop(_DECAY_EXCLUSIONS, None) if isinstance(config, dict) else None
    inner = keras.optimizers.get(copy.deepcopy(config))  # `get` edits the dict it gets
    wrapped = serialize_keras_object(keras.optimizers.LossScaleOptimizer(inner))
    return {**wrapped, _DECAY_EXCLUSIONS: exclusions} if exclusions else wrapped


# The key, beside Keras's own, under which an optimizer's config carries the weights that
# its `exclude_from_weight_decay()` left out: Keras keeps them out of `get_config()`.
_DECAY_EXCLUSIONS = "distkeras_weight_decay_exclusions"


def optimizer_config(optimizer, model):
    """``optimizer`` (a name, an instance or a config) as a config, with the weights its
    ``exclude_from_weight_decay()`` left out.

    Keras keeps those exclusions out of the optimizer's config, so an ``AdamW`` rebuilt
    from it (on every executor, and in the returned model) would decay the biases and
    normalization weights the user excluded, silently. They travel beside the config:
    ``var_names`` as the pattern Keras matches weight names with, and the variables of
    ``var_list`` as their positions in ``model.trainable_variables`` (a rebuilt model has
    them in the same order, where their paths may differ).

    Args:
        optimizer: A name, an optimizer or its config.
        model: The Keras model whose variables ``var_list`` named.
    """
    config = serialize_keras_object(optimizer)
    # A LossScaleOptimizer's inner optimizer decays the weights.
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    pattern = getattr(inner, "_exclude_from_weight_decay_pattern", None)
    keys = getattr(inner, "_exclude_from_weight_decay", None)
    if not isinstance(config, dict) or not hasattr(inner, "_var_key") or \
            (pattern is None and not keys):
        return config
    variables = getattr(model, "trainable_variables", None) or []
    positions = [index for index, variable in enumerate(variables)
                 if inner._var_key(variable) in (keys or ())]
    return {**config, _DECAY_EXCLUSIONS: {
        "var_names": None if pattern is None else pattern.pattern,
        "trainable_positions": positions}}


def with_learning_rate(optimizer, learning_rate, model):
    """The config of ``optimizer`` (a name, instance or config) with ``learning_rate``, a
    new object: the given optimizer stays as it was. Its weight decay exclusions (of
    ``model``'s weights) stay too (see `optimizer_config`)."""
    import keras

    if isinstance(optimizer, (str, dict)):
        optimizer = keras.optimizers.get(copy.deepcopy(optimizer))  # `get` edits a dict
    config = copy.deepcopy(optimizer_config(optimizer, model))
    # A LossScaleOptimizer (a mixed_float16 model's) takes no learning rate: the optimizer
    # it wraps does.
    settings = config["config"]
    if config.get("class_name") == "LossScaleOptimizer":
        settings = settings["inner_optimizer"]["config"]
    settings["learning_rate"] = learning_rate
    return config


def _exclude_from_weight_decay(optimizer, exclusions, model):
    """Gives a rebuilt optimizer the exclusions `optimizer_config` recorded; those by
    position need ``model``, the model the optimizer trains."""
    positions = exclusions.get("trainable_positions") or []
    variables = getattr(model, "trainable_variables", None) or []
    if positions and len(variables) <= max(positions):
        raise ValueError(
            f"The optimizer's weight decay exclusions name trainable weight {max(positions)}, "
            f"and the model it trains has {len(variables)} trainable weights.")
    pattern = exclusions.get("var_names")
    getattr(optimizer, "inner_optimizer", optimizer).exclude_from_weight_decay(
        var_list=[variables[index] for index in positions],
        var_names=[pattern] if pattern else None)


# Metric names that `model.compile` resolves itself, from the loss and the labels' shape.
_COMPILE_METRIC_NAMES = ("accuracy", "acc", "crossentropy", "ce")

# Losses that compare one-hot labels with the model's output, value by value.
_ONE_HOT_LOSSES = ("categorical_crossentropy", "categoricalcrossentropy",
                   "categorical_focal_crossentropy", "categoricalfocalcrossentropy")
# Losses that read one class index per row (per position of the output's last axis).
_SPARSE_LOSSES = ("sparse_categorical_crossentropy", "sparsecategoricalcrossentropy")
# Losses that compare each output unit with a label of the output's own shape.
BINARY_LOSSES = ("binary_crossentropy", "binarycrossentropy", "binary_focal_crossentropy",
                  "binaryfocalcrossentropy")
# Regression (and other element-wise) losses: they too compare each output unit with a
# label of the output's own shape. Given one scalar per row for several units, a worker
# took the scalars for class indices and stopped on the first that was not a whole
# number, calling it a class index; `fit` would broadcast the scalar to every unit.
_ELEMENTWISE_LOSSES = (
    "mse", "mean_squared_error", "meansquarederror", "mae", "mean_absolute_error",
    "meanabsoluteerror", "mape", "mean_absolute_percentage_error",
    "meanabsolutepercentageerror", "msle", "mean_squared_logarithmic_error",
    "meansquaredlogarithmicerror", "huber", "huber_loss", "log_cosh", "logcosh",
    "cosine_similarity", "cosinesimilarity", "poisson", "kl_divergence", "kld",
    "kldivergence", "kullback_leibler_divergence", "hinge", "squared_hinge", "squaredhinge")


def _names(value):
    if isinstance(value, dict) and "class_name" not in value:
        return list(value.values())
    return list(value) if isinstance(value, (list, tuple)) else [value]


def _flat_metrics(metrics):
    """Every metric in a list, a list per output or a dict by output name."""
    if isinstance(metrics, dict) and "class_name" not in metrics:
        metrics = list(metrics.values())
    if isinstance(metrics, (list, tuple)):
        return [metric for value in metrics for metric in _flat_metrics(value)]
    return [] if metrics is None else [metrics]


def _check_loss_weights(loss, loss_weights):
    """Keras takes a number, a list of numbers (as many as losses) or a dict of numbers
    by output name as loss weights; anything else fails its compile, on every executor."""
    if loss_weights is None:
        return
    values = loss_weights.values() if isinstance(loss_weights, dict) else \
        loss_weights if isinstance(loss_weights, (list, tuple)) else [loss_weights]
    if any(isinstance(value, bool) or not isinstance(value, numbers.Real) for value in values):
        raise ValueError(
            "`loss_weights` must be a number (one output), a list of numbers (one per loss) "
            "or a dict of numbers by output name, as in Keras's compile(). Received: "
            f"{loss_weights!r}")
    if not isinstance(loss_weights, (list, tuple)):
        return
    losses = len(loss) if isinstance(loss, (list, tuple)) or (
        isinstance(loss, dict) and "class_name" not in loss) else 1
    if len(loss_weights) != losses:
        raise ValueError(
            f"`loss_weights` holds {len(loss_weights)} weights for {losses} loss(es): Keras "
            "needs one weight per loss. Give one loss per output (loss=['mse', ...]) with "
            "one weight each, or a dict of weights by output name.")


def _check_metrics_structure(metrics, output_count):
    """Keras takes a flat list of metrics for several outputs only one per output."""
    if output_count <= 1 or not isinstance(metrics, (list, tuple)) or not metrics:
        return
    nested = any(isinstance(value, (list, tuple)) or value is None for value in metrics)
    if len(metrics) != output_count:
        shape = "a list of metric lists" if nested else "a flat list"
        raise ValueError(
            f"`metrics` is {shape} of {len(metrics)} for a model with {output_count} "
            f"outputs. Give one list per output (for example metrics=[['accuracy'], []]), "
            "a dict by output name (metrics={'output_name': ['accuracy']}), or none.")


def _loss_name(loss):
    if isinstance(loss, str):
        return loss.lower()
    name = getattr(loss, "__name__", None) or type(loss).__name__
    return name.lower()


def check_compile_arguments(optimizer, loss, metrics, label_shapes=(), output_shapes=(),
                            loss_weights=None):
    """Raises a clear error, on the driver, for what would fail on every executor.

    Names are resolved as Keras resolves them (a typo fails here, naming the argument,
    not in a Spark task); a one-hot or binary loss given scalar labels for an output of
    several units, and a sparse loss given label vectors, are refused.

    Args:
        optimizer: The worker optimizer as the user gave it.
        loss: The loss (name, object, or a list or dict of them per output).
        metrics: The metrics.
        label_shapes: Per output, the shape of a label row (``()`` for scalars).
        output_shapes: Per output, the model's output shape (without the batch).

    Raises:
        ValueError: Naming the argument and the value that cannot be used.
    """
    import keras

    checks = [("worker_optimizer", "keras.optimizers", keras.optimizers.get, [optimizer]),
              ("loss", "keras.losses", keras.losses.get, _names(loss)),
              ("metrics", "keras.metrics", keras.metrics.get,
               [m for m in _flat_metrics(metrics) if m not in _COMPILE_METRIC_NAMES])]
    _check_metrics_structure(metrics, len(output_shapes))
    _check_loss_weights(loss, loss_weights)
    for argument, module, getter, values in checks:
        for value in values:
            if not isinstance(value, str):
                continue
            try:
                getter(value)
            except ValueError as error:
                raise ValueError(f"`{argument}`: Keras does not know {value!r} ({error}). "
                                 f"Check the spelling against {module}.") from error
    if isinstance(loss, dict) and "class_name" not in loss:
        return  # losses by output name: Keras matches them to the outputs itself
    losses = _names(loss)
    if len(losses) == 1 and len(output_shapes) > 1:
        losses = losses * len(output_shapes)
    for index, (each, labels, output) in enumerate(zip(losses, label_shapes, output_shapes)):
        name = _loss_name(each)
        output = tuple(output)
        # Class indices: one number per row, or per step of an output of several axes.
        indices = bool(output) and tuple(labels) == output[:-1] and output[-1] > 1
        units = int(np.prod(output or (1,)))
        kind = "scalars (class indices)" if labels == () else \
            f"class indices of shape {tuple(labels)}"
        if indices and name in _ONE_HOT_LOSSES:
            raise ValueError(
                f"The labels of output {index} are {kind} but the loss "
                f"{name!r} expects one-hot labels of shape {tuple(output)}. Use "
                "loss='sparse_categorical_crossentropy', or one-hot encode the labels first "
                "(distkeras.transformers.OneHotTransformer).")
        if (labels == () or indices) and units > 1 and name in BINARY_LOSSES:
            raise ValueError(
                f"The labels of output {index} are {kind} but the loss {name!r} compares "
                f"each of the output's {units} values with a label of shape {tuple(output)}. "
                "For two classes give the model one sigmoid unit (Dense(1, "
                "activation='sigmoid')); for class indices and a softmax output use "
                "loss='sparse_categorical_crossentropy'.")
        if (labels == () or indices) and units > 1 and name in _ELEMENTWISE_LOSSES:
            one = "scalars" if labels == () else f"of shape {tuple(labels)}"
            raise ValueError(
                f"The labels of output {index} are {one} but the loss {name!r} compares "
                f"each of the output's {units} values with a label of shape {tuple(output)}. "
                f"Give a label column holding {units} values per row (an array, for "
                "example F.array of the target columns), or give the model an output of "
                "one unit (Dense(1)) for one target per row.")
        if labels != () and tuple(labels) == tuple(output) and output and output[-1] > 1 \
                and name in _SPARSE_LOSSES:
            raise ValueError(
                f"The labels of output {index} are vectors of shape {tuple(output)} (one-hot?) "
                f"but the loss {name!r} expects class indices, one number per row. Use "
                "loss='categorical_crossentropy' with one-hot labels, or a column of class "
                "indices (0, 1, ...: pyspark.ml.feature.StringIndexer gives them).")

