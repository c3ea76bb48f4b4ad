"""Model transport (`.keras` bytes) and history helpers."""

import logging
import numbers
import os
import sys
import tempfile

import numpy as np

logger = logging.getLogger(__name__)


class _TensorflowOnceImported:
    """Keras's lazy ``tensorflow`` module, "available" only once TensorFlow is imported.

    Keras's serializer asks whether TensorFlow is available before each of its checks for
    TensorFlow types, and asking imports TensorFlow whenever it is installed, on any
    backend: 2 seconds and about 600 MB in the driver and in every executor's Python worker
    that rebuilds a model. No object can be a TensorFlow type before TensorFlow is
    imported, so answering from ``sys.modules`` changes no result.
    """

    def __init__(self, lazy_module):
        self._lazy_module = lazy_module

    @property
    def available(self):
        return "tensorflow" in sys.modules and self._lazy_module.available

    def __getattr__(self, name):
        return getattr(self._lazy_module, name)


def tensorflow_only_once_imported(module_name):
    """Gives the Keras module ``module_name`` a `_TensorflowOnceImported` for its lazy
    ``tf`` (once; a Keras without it is left as it is)."""
    import importlib

    try:
        from keras.src.utils.module_utils import LazyModule

        module = importlib.import_module(module_name)
    except ImportError:
        return
    lazy_module = getattr(module, "tf", None)
    # Not `hasattr(lazy_module, "available")`: reading it imports TensorFlow.
    if isinstance(lazy_module, LazyModule):
        module.tf = _TensorflowOnceImported(lazy_module)


def _serialize_without_importing_tensorflow():
    tensorflow_only_once_imported("keras.src.saving.serialization_lib")


def serialize_model(model):
    """Serializes a Keras model to the bytes of a `.keras` archive.

    Args:
        model: A `keras.Model`.

    Returns:
        The archive as `bytes`: architecture as JSON, weights as HDF5, no pickle.
    """
    import keras

    _serialize_without_importing_tensorflow()
    with tempfile.TemporaryDirectory(prefix="distkeras-") as folder:
        path = os.path.join(folder, "model.keras")
        keras.saving.save_model(model, path)
        with open(path, "rb") as handle:
            return handle.read()


def deserialize_model(data, compile=False, custom_objects=None):
    """Rebuilds a Keras model from `.keras` bytes, with ``safe_mode=True``.

    Args:
        data: The bytes produced by `serialize_model`.
        compile: Whether to restore the compile configuration stored in the archive.
        custom_objects: Optional dict of registered custom classes.

    Returns:
        A `keras.Model`.
    """
    import keras
    # Not public: the scope that sets safe mode for the loads inside it.
    from keras.src.saving.serialization_lib import SafeModeScope

    _serialize_without_importing_tensorflow()
    with tempfile.TemporaryDirectory(prefix="distkeras-") as folder:
        path = os.path.join(folder, "model.keras")
        with open(path, "wb") as handle:
            handle.write(data)
        # Keras lets `enable_unsafe_deserialization()` override the argument; the scope
        # makes safe mode hold whatever this process's keras.config says.
        with SafeModeScope(True):
            return keras.saving.load_model(
                path, compile=compile, safe_mode=True, custom_objects=custom_objects
            )


def declared_weight_bytes(data):
    """The bytes of the weights a `.keras` archive's configuration declares, counted
    without allocating them.

    The model is built from the archive's ``config.json`` (in safe mode) inside a Keras
    ``StatelessScope``, where a variable keeps its shape and initializer but gets no value:
    a configuration declaring 40 billion weights costs its layers' Python objects only.

    Args:
        data: The bytes of a `.keras` archive.

    Returns:
        ``(values, nbytes)``: the number of weight values, and their bytes in their dtypes.

    Raises:
        ValueError: If the archive has no readable configuration; Keras's own errors if
            the model cannot be built from it.
    """
    import io
    import json
    import math
    import zipfile

    import keras
    # Not public: Keras's thread-local state (its deferred variables) and the scopes
    # that `keras.saving.load_model` builds a model from its configuration in.
    from keras.src.backend.common import global_state
    from keras.src.saving.serialization_lib import ObjectSharingScope, SafeModeScope

    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            config = json.loads(archive.read("config.json"))
    except (KeyError, zipfile.BadZipFile, UnicodeDecodeError, ValueError,
            RecursionError) as error:
        raise ValueError(f"it has no readable config.json ({error})") from error
    if not isinstance(config, dict):
        raise ValueError("its config.json is not a JSON object")
    config["compile_config"] = None  # as load_model(compile=False): no optimizer built
    _serialize_without_importing_tensorflow()
    # Variables made in a stateless scope wait in this list to be initialized when some
    # later scope ends: the count's must never be, so they go in a list of their own.
    deferred = global_state.get_global_attribute("uninitialized_variables")
    global_state.set_global_attribute("uninitialized_variables", [])
    try:
        with SafeModeScope(True), ObjectSharingScope(), \
                keras.StatelessScope(initialize_variables=False):
            model = keras.saving.deserialize_keras_object(config, safe_mode=True)
            weights = list(getattr(model, "weights", []))
    finally:
        global_state.set_global_attribute("uninitialized_variables", deferred)
    values = nbytes = 0
    for weight in weights:
        count = math.prod(int(dim) for dim in weight.shape)
        dtype = keras.backend.standardize_dtype(weight.dtype)
        values += count
        nbytes += count * (2 if dtype == "bfloat16" else np.dtype(dtype).itemsize)
    return values, nbytes


def serialize_keras_object(obj):
    """Turns an optimizer, loss or metric into something JSON-able (strings stay strings)."""
    import keras

    if obj is None or isinstance(obj, str):
        return obj
    _serialize_without_importing_tensorflow()
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
    import copy

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
    import copy

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


def average_history(records):
    """Averages per-step history records over workers, step by step within each epoch.

    Each worker's ``k``-th step of an epoch is averaged with the other workers' ``k``-th
    step of that epoch (their ``k``-th step overall, as dist-keras averaged, where they
    step alike). A worker numbers its steps on across epochs: with uneven partitions,
    one worker's step 120 may be in epoch 1 while another's is in epoch 2, and averaging
    by that number would mix the two epochs' losses.

    Args:
        records: Records as returned by ``Trainer.get_history()``.

    Returns:
        A dict of numpy arrays, one entry per averaged step, in training order:
        ``iteration`` (the averaged steps counted from 1 across epochs: each worker's own
        numbers where every worker takes as many steps), ``epoch`` (where the records
        carry it, from 0, as they do) and one entry per other recorded number (``loss``,
        the metrics, ``timestamp``), each averaged over the workers that took that step
        of that epoch (the one with the most rows alone, at the end of an epoch).
        The steps of a failed task that Spark's retry trained again (records marked
        ``superseded``) are left out: each worker counts with its final attempt.
    """
    records = [record for record in records if not record.get("superseded")]
    by_step = {}
    for (_, epoch), steps in _steps_by_worker_epoch(records).items():
        for step, record in enumerate(steps):
            by_step.setdefault((epoch, step), []).append(record)
    order = sorted(by_step)
    keys = sorted(
        {key for record in records for key, value in record.items()
         if key not in ("worker_id", "iteration", "attempt", "epoch")
         and isinstance(value, (int, float))}
    )
    averaged = {"iteration": np.arange(1, len(order) + 1, dtype=np.int64)}
    if any("epoch" in record for record in records):
        averaged["epoch"] = np.asarray([epoch for epoch, _ in order], dtype=np.int64)
    for key in keys:
        averaged[key] = np.asarray(
            [np.mean([r[key] for r in by_step[step] if key in r]) for step in order],
            dtype=np.float64,
        )
    return averaged


def _steps_by_worker_epoch(records):
    """Each worker's records of each epoch (0 where they say none), in the order it
    took the steps: ``{(worker_id, epoch): [record, ...]}``."""
    steps = {}
    for record in sorted(records, key=lambda r: r["iteration"]):
        key = (record.get("worker_id", 0), int(record.get("epoch", 0)))
        steps.setdefault(key, []).append(record)
    return steps


def save_model(model, path):
    """Saves a Keras model as a `.keras` archive at ``path`` (any Hadoop filesystem path).

    The write is atomic: readers see the old model or the new one, never half of one.
    """
    from distkeras import storage

    storage.write_bytes(path, serialize_model(model))


def load_model(path, compile=True, custom_objects=None):
    """Loads a `.keras` archive from ``path`` (any Hadoop filesystem path), safe_mode=True.

    Raises:
        FileNotFoundError: Naming the path, when it does not exist.
        ValueError: When the file is no `.keras` archive (cut short, or another format).
    """
    from distkeras import storage

    data = storage.read_bytes(path)
    _check_keras_archive(data)
    return deserialize_model(data, compile=compile, custom_objects=custom_objects)


def _check_keras_archive(data):
    """Refuses bytes that are no `.keras` archive before Keras reads them: Keras's own
    errors name its temporary copy ("File not found: filepath=/tmp/distkeras-...") or are
    a bare KeyError ("There is no item named 'config.json'")."""
    import io
    import zipfile

    how = "save the model with model.save('name.keras') or distkeras.utils.save_model"
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise ValueError(f"not a .keras archive (not a zip file: cut short, or another "
                         f"format); {how}")
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        if "config.json" not in archive.namelist():
            raise ValueError(f"not a .keras archive (it has no config.json); {how}")


def save_history(history, path):
    """Saves a trainer's history (a list of records) as JSON at ``path``, atomically."""
    import json

    from distkeras import storage

    storage.write_bytes(path, json.dumps(list(history)).encode("utf-8"))


def load_history(path):
    """Loads a history saved by `save_history`."""
    import json

    from distkeras import storage

    return json.loads(storage.read_bytes(path).decode("utf-8"))


def shuffle(dataframe, seed=None):
    """Returns ``dataframe``'s rows in a random order (dist-keras's ``utils.shuffle``).

    Every row moves through a Spark shuffle, as in dist-keras: cache or save the result
    to train on it several times in the same order. ``trainer.train(df, shuffle=True)``
    shuffles as it lays the rows out for the workers, without a separate step.

    Args:
        dataframe: A Spark DataFrame.
        seed: Seed of the random order (None: a new order at every call).

    Returns:
        A DataFrame with the same rows and columns.
    """
    from pyspark.sql import functions as F

    return dataframe.orderBy(F.rand(seed))


def precache(dataframe, num_workers=None):
    """Lays ``dataframe`` out in ``num_workers`` partitions, caches and computes it
    (dist-keras's ``utils.precache``); returns the cached DataFrame.

    A trainer then reads the rows from the executors' memory instead of computing them
    again (reading the Parquet, running the transformers) at every epoch and every run.

    Args:
        dataframe: A Spark DataFrame.
        num_workers: The partitions to lay it out in (the trainer's ``num_workers``);
            None keeps its partitions.
    """
    if num_workers is not None:
        from distkeras.training_checks import check_int

        check_int("num_workers", num_workers)
        dataframe = dataframe.repartition(num_workers)
    dataframe = dataframe.cache()
    dataframe.count()
    return dataframe


# dist-keras's names, for scripts written for it: a model travels as a .keras archive
# (bytes) instead of its JSON and weights, so the two round-trip with each other only.
serialize_keras_model = serialize_model
deserialize_keras_model = deserialize_model


# dist-keras's other helpers (`from distkeras.utils import *` in its examples).
from distkeras.legacy_utils import (  # noqa: E402,F401
    get_os_username, history_executor, history_executors_average, json_to_dataframe_row,
    new_dataframe_row, pickle_object, set_keras_base_directory, to_one_hot_encoded_dense,
    uniform_weights, unpickle_object)
