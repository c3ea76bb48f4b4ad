"""dist-keras's helpers under their dist-keras import path: a model as `.keras` bytes, a
compile configuration as it travels, the step history, and DataFrame helpers.

A thin face: the names live in `distkeras.keras_io.archives` (a model's bytes and files),
`distkeras.keras_io.compile_config` (optimizers, losses and metrics as configs, and their
checks), `distkeras.training.history` (the step history), `distkeras.tools.dataframes`
(`shuffle`, `precache`) and `distkeras.tools.legacy_utils` (dist-keras's small helpers).
"""

from distkeras.keras_io.archives import (declared_weight_bytes, deserialize_model, load_model,
                                         save_model, serialize_model,
                                         tensorflow_only_once_imported)
from distkeras.keras_io.compile_config import (check_compile_arguments,
                                               compile_arguments, optimizer_as_compiled,
                                               optimizer_config, serialize_keras_object)
from distkeras.tools.dataframes import precache, shuffle
from distkeras.training.history import average_history, load_history, save_history
from distkeras.tools.legacy_utils import (get_os_username, history_executor,
                                          history_executors_average, json_to_dataframe_row,
                                          new_dataframe_row, pickle_object,
                                          set_keras_base_directory, to_one_hot_encoded_dense,
                                          uniform_weights, unpickle_object)

# dist-keras's names, for scripts written for it: a model travels as a .keras archive
# (bytes) instead of its JSON and weights, so the two round-trip with each other only.
serialize_keras_model = serialize_model
deserialize_keras_model = deserialize_model

__all__ = ["tensorflow_only_once_imported", "serialize_model", "deserialize_model",
           "declared_weight_bytes", "save_model", "load_model", "serialize_keras_object",
           "compile_arguments", "optimizer_as_compiled", "optimizer_config",
           "check_compile_arguments", "average_history", "save_history", "load_history",
           "shuffle", "precache", "serialize_keras_model", "deserialize_keras_model",
           "get_os_username", "history_executor", "history_executors_average",
           "json_to_dataframe_row", "new_dataframe_row", "pickle_object",
           "set_keras_base_directory", "to_one_hot_encoded_dense", "uniform_weights",
           "unpickle_object"]
