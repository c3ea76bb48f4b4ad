"""What Keras builds of a Punchcard submission: its model archive and its trainer.

Run in a `model_check` child process under resource limits, never in the server's own:
loading a model allocates what the client's configuration declares.
"""

import contextlib
import re
import tempfile
import types

from distkeras.keras_io.archives import declared_weight_bytes, deserialize_model
from distkeras.keras_io.compile_config import check_compile_arguments
from distkeras.punchcard.refusals import (ARCHIVE_EXPANSION_FLOOR, MAX_ARCHIVE_EXPANSION,
                                          BadRequest, decode_model, registered_trainer_class,
                                          scan_configs, unpack_limit)
from distkeras.punchcard import config_scan


def check_keras_parts(model_text, trainer_class_name, config, workers, activation_bytes=None):
    """Checks what Keras builds of a submission: the model archive and the trainer.

    The configurations are scanned as JSON first (`config_scan`: no code references, no
    oversized metric state), the declared weights counted, then the model loaded
    (``safe_mode=True``) and the trainer built. Run in a `model_check` child process
    by the server: building allocates what the client's configuration declares.

    Args:
        model_text: The base64 `.keras` archive.
        trainer_class_name: The registered trainer class's name.
        config: The trainer's JSON config.
        workers: The job's number of workers.
        activation_bytes: The most memory the model's activations for one batch may take
            (`check_activations`); None: no limit.

    Returns:
        The trainer config to run (``num_workers`` set to ``workers``).

    Raises:
        BadRequest: Saying what was wrong.
    """
    import keras

    model_bytes = decode_model(model_text)
    scan_configs(model_bytes, config, frozenset(keras.saving.get_custom_objects()))
    trainer_class = registered_trainer_class(trainer_class_name)
    with resolution_checked():
        return _check_built(model_bytes, trainer_class, config, workers, activation_bytes)


def _check_built(model_bytes, trainer_class, config, workers, activation_bytes):
    _check_declared_weights(model_bytes)
    try:
        # Compiled, as the job's process loads it (`cli`): a model compiled with
        # loss=None trains on its own loss, which the trainer's checks read from it.
        model = deserialize_model(model_bytes, compile=True)
    except Exception as error:  # any failure to load is the client's archive's fault
        raise BadRequest(f"The model archive was refused: {_archive_error(error)}") \
            from error
    config = dict(config)
    _check_compile_configs(config)
    try:
        built = trainer_class.from_config(config, keras_model=model)
        for attribute in ("num_workers", "num_ensembles"):
            if attribute in built.get_config():
                config[attribute] = workers
        built = trainer_class.from_config(config, keras_model=model)
        settings = built.settings()  # a compiled model's optimizer, loss, metrics resolved
        check_compile_arguments(settings.worker_optimizer, settings.loss, settings.metrics)
    except (TypeError, ValueError) as error:
        raise BadRequest(f"Bad trainer configuration: {error}") from error
    if activation_bytes:
        check_activations(model, built.get_config().get("batch_size", 32), activation_bytes)
    return config


def activation_estimate(model, batch_size):
    """The bytes of every output of the model's layers and operations for one batch of
    ``batch_size`` rows (nested models' too): what one training step holds for its
    backward pass, at the least. A dimension the model leaves open (a sequence's length)
    counts as 1."""
    import math

    import numpy as np

    total, pending, seen = 0, [model], set()
    while pending:
        operation = pending.pop()
        if id(operation) in seen:
            continue
        seen.add(id(operation))
        pending.extend(getattr(operation, "operations", None) or
                       getattr(operation, "layers", None) or [])
        for node in getattr(operation, "_inbound_nodes", []):
            for tensor in node.outputs:
                dtype = str(tensor.dtype)
                size = 2 if dtype == "bfloat16" else np.dtype(dtype).itemsize
                total += math.prod(d or 1 for d in tensor.shape[1:]) * size
    return total * batch_size


def check_activations(model, batch_size, limit):
    """Refuses a model whose activations for one batch (`activation_estimate`) take more
    than ``limit`` bytes: its job could not train it in the memory it is given."""
    needed = activation_estimate(model, batch_size)
    if needed > limit:
        raise BadRequest(
            f"The model's activations for one batch of {batch_size} rows take about "
            f"{needed / 2**30:,.1f} GiB (its layers' outputs x batch_size, in their dtypes), "
            f"more than a job of this server may use ({limit / 2**30:,.1f} GiB, punchcard "
            "--job-memory-mb). Use a smaller batch_size or smaller layers.")


def _check_declared_weights(data):
    """Refuses an archive whose configuration declares far more weights than it holds.

    Building the model to load it allocates every weight its configuration declares,
    whatever the archive carries: a few kilobytes declaring Dense(200000) after
    Dense(200000) would take 160 GB of this server's memory. The weights are counted
    without allocating them (`utils.declared_weight_bytes`) and may take no more than the
    archive's files may unpack to: an archive that ``keras.saving.save_model`` wrote
    holds every weight, uncompressed.
    """
    try:
        values, nbytes = declared_weight_bytes(data)
    except Exception as error:  # any failure to build is the client's archive's fault
        raise BadRequest(f"The model archive was refused: {_archive_error(error)}") \
            from error
    limit = unpack_limit(data)
    if nbytes > limit:
        raise BadRequest(
            f"The model archive was refused: its configuration declares {values} weight "
            f"values ({nbytes} bytes), more than this server builds for an archive of "
            f"{len(data)} bytes ({limit} bytes of weights at most: {MAX_ARCHIVE_EXPANSION} "
            f"times the archive, or {ARCHIVE_EXPANSION_FLOOR >> 20} MiB). An archive that "
            "keras.saving.save_model writes holds all its weights; send the model "
            "itself, saved that way.")


# Keras's words for a class or function it cannot find: "Could not locate class 'X'".
_UNKNOWN_OBJECT = re.compile(r"Could not locate (\w+) '([^']+)'")


def _archive_error(error):
    """Why an archive did not load, in a few lines: Keras's errors for an unknown class
    hold the whole model's configuration, twice, around the one name that matters."""
    if isinstance(error, ObjectRefused):
        return str(error)
    unknown = _UNKNOWN_OBJECT.search(str(error))
    if unknown:
        kind, name = unknown.groups()
        return (f"it uses the {kind} {name!r}, which this server does not know. A custom "
                "layer, activation, loss or metric must be registered "
                "(@keras.saving.register_keras_serializable()) in a package installed on "
                "the server: code sent by a client is never run. Ask the server's "
                "administrator to install yours, or use built-in Keras objects.")
    if "safe_mode=False" in str(error):
        # Keras advises loading unsafely, which a client cannot ask of this server.
        return ("it holds Python code (a `Lambda` layer's function or another lambda), which "
                "this server never runs: archives load with safe_mode=True. Replace the "
                "lambda with built-in layers, or with a custom layer registered "
                "(@keras.saving.register_keras_serializable()) in a package installed on "
                "the server.")
    return _short(_without_temp_paths(error), 1000)


def _without_temp_paths(error):
    """An error's message without the server's temporary paths (which say nothing useful
    to a client, and something about the server)."""
    return re.sub(re.escape(tempfile.gettempdir()) + r"/[^\s'\",;)]*", "<the archive>",
                  str(error))


def _check_compile_configs(config):
    """Refuses the trainer's optimizer, loss or metrics when Keras cannot rebuild them.

    Names were checked with the trainer; this resolves the configuration objects the same
    way the job will (`keras.optimizers.get` and friends, in safe mode, with the classes
    registered on this server). Keras imports nothing outside its own packages for this.
    """
    import copy

    import keras

    optimizer = config.get("worker_optimizer")
    checks = (("worker_optimizer", keras.optimizers.get,
               [] if optimizer is None or isinstance(optimizer, str) else [optimizer]),
              ("loss", keras.losses.get, _config_leaves(config.get("loss"))),
              ("metrics", keras.metrics.get, _config_leaves(config.get("metrics"))))
    for field, getter, values in checks:
        for value in values:
            try:
                resolved = getter(copy.deepcopy(value))  # getters edit their argument
            except Exception as error:  # whatever Keras raises, the config is unusable
                raise BadRequest(f"Bad trainer configuration: Keras cannot rebuild "
                                 f"'{field}' from {_short(value)} ({_short(error)}). Give a "
                                 "name, or the config of a built-in or server-registered "
                                 "Keras object.") from error
            if resolved is None:
                raise BadRequest(f"Bad trainer configuration: '{field}' holds "
                                 f"{_short(value)}, which names no Keras object.")


def _short(value, limit=200):
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _config_leaves(value):
    """The objects of an optimizer, loss or metrics setting that are not names."""
    if value is None or isinstance(value, str):
        return []
    if isinstance(value, list):
        return [leaf for item in value for leaf in _config_leaves(item)]
    if isinstance(value, dict) and "class_name" not in value:  # one entry per output
        return [leaf for item in value.values() for leaf in _config_leaves(item)]
    return [value]


class ObjectRefused(BadRequest):
    """An object a configuration names that this server does not build or call."""


# Where Keras's classes a model may be built of live (keras.src.<section>...), and its
# functions a configuration may name. Operations (keras.ops) are checked by name too.
_CLASS_HOMES = ("layers", "models", "optimizers", "losses", "metrics", "initializers",
                "regularizers", "constraints", "dtype_policies", "quantizers", "random",
                "ops")
_FUNCTION_HOMES = ("activations", "losses", "metrics")
_NOT_MODELLING = frozenset({"get", "serialize", "deserialize"})


@contextlib.contextmanager
def resolution_checked():
    """Within it, every class or function Keras resolves from a configuration
    (``serialization_lib._retrieve_class_or_fn``, which every ``module``/``class_name``
    pair goes through) is checked where it lives (`check_resolved`) before Keras builds
    or calls it.

    Notes:
        The JSON scan (`config_scan`) refuses what it can see by name; this checks the
        object Keras found, whatever the spelling that led to it. Not thread-safe: the
        check child and the job's process load one model at a time.
    """
    # Not public: Keras's one resolver of configuration names.
    from keras.src.saving import serialization_lib

    original = serialization_lib._retrieve_class_or_fn

    def checked(name, registered_name, module, obj_type, full_config, custom_objects=None):
        found = original(name, registered_name, module, obj_type, full_config,
                         custom_objects=custom_objects)
        check_resolved(found, f"{module}.{name}", custom_objects)
        return found

    serialization_lib._retrieve_class_or_fn = checked
    try:
        yield
    finally:
        serialization_lib._retrieve_class_or_fn = original


def check_resolved(found, spelled, custom_objects=None):
    """Refuses an object Keras resolved from a configuration unless this server builds it.

    Built: Keras's layers, models, optimizers, losses, metrics and their parts (by the
    module the class is defined in), other than code-holding layers and operations that
    call functions; called: activations, losses, metrics, `config_scan`'s keras.ops math.
    Objects registered on this server (``custom_objects``, Keras's global registry) pass.

    Args:
        found: The class or function.
        spelled: How the configuration named it, for the message.
        custom_objects: The objects registered for this load.

    Raises:
        ObjectRefused: Naming it and where it lives.
    """
    import keras

    registered = list((custom_objects or {}).values()) + \
        list(keras.saving.get_custom_objects().values())
    if any(found is value for value in registered):
        return
    home = getattr(found, "__module__", None) or ""
    section = home[len("keras.src."):].split(".")[0] if home.startswith("keras.src.") else None
    name = getattr(found, "__name__", "")
    where = f"{_short(spelled, 100)} ({home}.{name})"
    if isinstance(found, type):
        code = tuple(getattr(keras.layers, layer, None) for layer in _CODE_LAYER_CLASSES)
        if section not in _CLASS_HOMES or \
                issubclass(found, tuple(layer for layer in code if layer is not None)) or \
                (section == "ops" and name in config_scan.CALLING_OPS):
            raise ObjectRefused(
                f"it names {where}, which this server does not build: only Keras's layers, models, optimizers, losses, metrics and "
                "their parts (no Lambda or other layer that runs code).")
        return
    if isinstance(found, types.FunctionType) and name not in _NOT_MODELLING and (
            section in _FUNCTION_HOMES or (section == "ops" and name in config_scan.OPS_MATH)):
        return
    raise ObjectRefused(
        f"it names {where}, which this server does not call: only activations, losses, "
        "metrics and keras.ops math, or functions registered in a package installed on "
        "the server.")


_CODE_LAYER_CLASSES = ("Lambda", "TorchModuleWrapper", "TFSMLayer", "JaxLayer", "FlaxLayer")
