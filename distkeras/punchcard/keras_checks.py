"""What Keras builds of a Punchcard submission: its model archive and its trainer.

Run in a `model_check` child process under resource limits, never in the server's own:
loading a model allocates what the client's configuration declares.
"""

import re
import tempfile

from distkeras.keras_io.archives import declared_weight_bytes, deserialize_model
from distkeras.keras_io.compile_config import check_compile_arguments
from distkeras.punchcard.refusals import (ARCHIVE_EXPANSION_FLOOR, MAX_ARCHIVE_EXPANSION,
                                          BadRequest, decode_model, registered_trainer_class,
                                          scan_configs, unpack_limit)


def check_keras_parts(model_text, trainer_class_name, config, workers):
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

    Returns:
        The trainer config to run (``num_workers`` set to ``workers``).

    Raises:
        BadRequest: Saying what was wrong.
    """
    import keras

    model_bytes = decode_model(model_text)
    scan_configs(model_bytes, config, frozenset(keras.saving.get_custom_objects()))
    trainer_class = registered_trainer_class(trainer_class_name)
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
    return config


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
