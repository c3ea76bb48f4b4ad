"""Custom Keras objects (layers, losses, metrics, activations) a model needs on executors.

A model travels to the executors as a `.keras` archive, which names its custom classes and
functions but does not hold their code. Keras finds them at load time in its registry of
`@keras.saving.register_keras_serializable()` objects, or in ``custom_objects``. An executor
has neither: it never ran the notebook or script that defined them. So the driver finds the
objects its model, loss and metrics name, and they travel with the Spark task (PySpark's own
task serialization, as any UDF's code does; the weights and the architecture still travel as
the `.keras` archive, and nothing here touches the parameter server's wire). The executor
rebuilds the model inside `scope()`.
"""

import contextlib
import logging
import sys

from distkeras.keras_io.archives import deserialize_model
from distkeras.keras_io.compile_config import compile_arguments, serialize_keras_object

logger = logging.getLogger(__name__)

_HOW_TO_FIX = (
    "Define it at the top level of your script or notebook, or register it with "
    "`@keras.saving.register_keras_serializable()`, so that distkeras can send it to the "
    "executors with the model.")


def _is_keras_module(module):
    return isinstance(module, str) and (module == "keras" or module.startswith("keras."))


def _referenced_names(config, names):
    """Adds to ``names`` every custom object name in a serialized Keras config."""
    if isinstance(config, (list, tuple)):
        for item in config:
            _referenced_names(item, names)
        return
    if not isinstance(config, dict):
        return
    if "class_name" in config and "config" in config:
        if config["class_name"] == "function" and isinstance(config["config"], str):
            if not _is_keras_module(config.get("module")) and \
                    "." not in config["config"].split(">")[-1]:
                names.add(config["config"])
        elif not _is_keras_module(config.get("module")):
            names.add(config.get("registered_name") or config["class_name"])
    for value in config.values():
        _referenced_names(value, names)


def _live_objects(model, compile_objects):
    """Custom classes and functions reachable from the model and the compile arguments."""
    import keras

    found = {}

    def add(obj):
        target = obj if isinstance(obj, type) or _is_function(obj) else type(obj)
        if _is_keras_module(getattr(target, "__module__", None)):
            return
        name = getattr(target, "__name__", None)
        if name is None:
            return
        found.setdefault(name, target)
        found.setdefault(keras.saving.get_registered_name(target), target)

    for layer in model._flatten_layers(include_self=True, recursive=True):
        add(type(layer))
    stack = list(compile_objects)
    while stack:
        obj = stack.pop()
        if obj is None or isinstance(obj, (str, int, float, bool)):
            continue
        if isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
        else:
            add(obj)
    return found


def _is_function(obj):
    import types

    return isinstance(obj, (types.FunctionType, types.BuiltinFunctionType))


def find(model, compile_objects=()):
    """The custom objects ``model`` and the compile arguments need to be rebuilt.

    Args:
        model: The `keras.Model` to be sent to executors.
        compile_objects: The optimizer, loss, metrics as the user gave them (names,
            objects, functions or configs; lists and dicts of them).

    Returns:
        ``(objects, unresolved)``: a dict from the names Keras looks up (class or function
        name, and registered name) to the objects, empty for a model of Keras's own layers
        and losses; and the custom names referenced that no object was found for.
    """
    import keras

    names = set()
    _referenced_names(serialize_keras_object(model), names)
    for obj in compile_objects:
        _referenced_names(serialize_keras_object(obj), names)
    live = _live_objects(model, compile_objects)
    registry = keras.saving.get_custom_objects()
    main = _user_main_namespace()
    objects, unresolved = {}, []
    for name in sorted(names):
        source = next((source for source in (registry, live, main)
                       if callable(source.get(name))), None)
        if source is None:
            unresolved.append(name)
        else:
            objects[name] = source[name]
    for name, obj in live.items():  # a class that Keras names by its registered name
        objects.setdefault(name, obj)
    _ship_modules_by_value(objects.values())
    if objects:
        logger.debug("Custom objects sent to the executors: %s", sorted(objects))
    return objects, unresolved


def _user_main_namespace():
    """What the user's own script or notebook defined at its top level, or ``{}``.

    Only a ``__main__`` without a module spec is the user's (``python script.py``, a
    notebook kernel). One run with ``python -m`` is a module; ``python -m distkeras.cli`` in
    particular runs Punchcard's jobs, whose configs come from clients: a name in them must
    never pick one of that process's own functions.
    """
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None:
        return {}
    return {name: value for name, value in vars(main).items()
            if getattr(value, "__module__", None) == "__main__"}


def _ship_modules_by_value(objects):
    """Sends the code of objects from the user's own modules with the task.

    Spark pickles a class or function by reference when its module is importable on the
    driver, and an executor may not have the user's ``my_layers.py``. Installed packages
    (under site-packages) stay by reference: executors are expected to have them.
    """
    from pyspark import cloudpickle

    for obj in objects:
        module = sys.modules.get(getattr(obj, "__module__", None) or "")
        path = getattr(module, "__file__", None) or ""
        if module is None or module.__name__ == "__main__" or \
                module.__name__.split(".")[0] == "distkeras" or \
                "site-packages" in path or "dist-packages" in path:
            continue
        cloudpickle.register_pickle_by_value(module)


def scope(objects):
    """A context in which Keras finds ``objects`` when it rebuilds a model or a loss."""
    import keras

    if not objects:
        return contextlib.nullcontext()
    return keras.saving.custom_object_scope(objects)


# Keras's own objects that hold Python code rather than a config (a `Lambda` layer's
# lambda, a wrapped torch module): they load only with safe_mode=False.
_CODE_HOLDERS = frozenset({"__lambda__", "TorchModuleWrapper"})


def holds_python_code(model):
    """Whether ``model``'s config holds Python code (a `Lambda` layer's lambda, a
    `TorchModuleWrapper`'s module), which executors refuse to load: distkeras rebuilds
    models with ``safe_mode=True``, whatever the driver's `keras.config` says."""
    def search(config):
        if isinstance(config, (list, tuple)):
            return any(search(item) for item in config)
        if not isinstance(config, dict):
            return False
        return config.get("class_name") in _CODE_HOLDERS or \
            any(search(value) for value in config.values())

    return search(serialize_keras_object(model))


def check_rebuildable(model_bytes, compile_config, objects, unresolved=()):
    """Raises a clear error, on the driver, when executors could not rebuild the model.

    Args:
        model_bytes: The model's `.keras` archive.
        compile_config: ``(optimizer, loss, metrics, loss_weights[, weighted_metrics])`` as
            serialized configs, or None for a model that is not compiled there
            (prediction).
        objects: The objects `find` returned.
        unresolved: The names `find` found no object for (named in the error).

    Raises:
        ValueError: Naming what Keras could not find and how to make it findable.
    """
    how_to_fix = (f"Not found on the driver: {', '.join(unresolved)}. " if unresolved
                  else "") + _HOW_TO_FIX
    with scope(objects):
        try:
            model = deserialize_model(model_bytes)
        except (TypeError, ValueError) as error:
            if "safe_mode=False" in str(error):  # Keras's advice does not reach executors
                raise ValueError(
                    f"The model could not be rebuilt from its .keras archive, as every "
                    f"executor must: {str(error).split('. ')[0]}. distkeras rebuilds models "
                    "with safe_mode=True whatever keras.config says on the driver (no code "
                    "travels inside a model archive). Replace the lambda or the wrapped "
                    "module with built-in layers, or with a custom Layer subclass "
                    f"(get_config() for its arguments). {_HOW_TO_FIX}") from error
            raise ValueError(
                "The model could not be rebuilt from its .keras archive, as every executor "
                f"must: {error}. A subclassed model or a custom layer needs `get_config()` "
                f"for its constructor arguments. {how_to_fix}") from error
        if compile_config is None:
            return
        try:
            compile_arguments(*compile_config, model=model)
        except (TypeError, ValueError) as error:
            raise ValueError(
                "The optimizer, loss or metrics could not be rebuilt from their configs, as "
                f"every executor must: {error}. {how_to_fix}") from error
