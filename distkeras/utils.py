"""dist-keras's helpers under their dist-keras import path, and a model and its history
saved on any Hadoop path.

A thin face: a model's bytes and files live in `distkeras.keras_io.archives`, the step
history in `distkeras.training.history`, `shuffle` and `precache` in
`distkeras.tools.dataframes`, and dist-keras's small helpers in
`distkeras.tools.legacy_utils` (see there).
"""

from distkeras.keras_io.archives import (deserialize_model, load_model, save_model,
                                         serialize_model)
from distkeras.tools.dataframes import precache, shuffle
from distkeras.training.history import load_history, save_history
from distkeras.tools.legacy_utils import (get_os_username, history_executor,
                                          history_executors_average, json_to_dataframe_row,
                                          new_dataframe_row, pickle_object,
                                          set_keras_base_directory, to_one_hot_encoded_dense,
                                          uniform_weights, unpickle_object)

# dist-keras's names, for scripts written for it: a model travels as a .keras archive
# (bytes) instead of its JSON and weights, so the two round-trip with each other only.
serialize_keras_model = serialize_model
deserialize_keras_model = deserialize_model

__all__ = ["get_os_username", "set_keras_base_directory", "to_one_hot_encoded_dense",
           "new_dataframe_row", "json_to_dataframe_row", "pickle_object", "unpickle_object",
           "serialize_keras_model", "deserialize_keras_model", "history_executors_average",
           "history_executor", "uniform_weights", "shuffle", "precache",
           "serialize_model", "deserialize_model", "save_model", "load_model", "save_history",
           "load_history"]
