"""A Keras model as the bytes of a `.keras` archive, and as a file on any Hadoop path.

The weights and the architecture travel this way to the executors, to the job server and
back: JSON and HDF5 in a zip, read in Keras's safe mode, never pickled.
"""

import os
import sys
import tempfile

import numpy as np

from distkeras.data import storage


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



def defer_tensorflow_import():
    """Keeps Keras's serializer from importing TensorFlow before something else does
    (see `tensorflow_only_once_imported`)."""
    tensorflow_only_once_imported("keras.src.saving.serialization_lib")


def serialize_model(model):
    """Serializes a Keras model to the bytes of a `.keras` archive.

    Args:
        model: A `keras.Model`.

    Returns:
        The archive as `bytes`: architecture as JSON, weights as HDF5, no pickle.
    """
    import keras

    defer_tensorflow_import()
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

    defer_tensorflow_import()
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
    defer_tensorflow_import()
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



def save_model(model, path):
    """Saves a Keras model as a `.keras` archive at ``path`` (any Hadoop filesystem path).

    The write is atomic: readers see the old model or the new one, never half of one.
    """
    storage.write_bytes(path, serialize_model(model))


def load_model(path, compile=True, custom_objects=None):
    """Loads a `.keras` archive from ``path`` (any Hadoop filesystem path), safe_mode=True.

    Raises:
        FileNotFoundError: Naming the path, when it does not exist.
        ValueError: When the file is no `.keras` archive (cut short, or another format).
    """
    data = storage.read_bytes(path)
    check_keras_archive(data)
    return deserialize_model(data, compile=compile, custom_objects=custom_objects)


def check_keras_archive(data):
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

