"""dist-keras's small helpers, for scripts written for it (re-exported by `distkeras.utils`).

Each does what dist-keras's did, on numpy 2, Keras 3 and Spark 4. Where dist-keras's
version failed on some input (a 4-D weight in `uniform_weights`, the last worker left out
of `history_executors_average`), this one does not.
"""

import logging
import os

import numpy as np

from distkeras.training.history import average_history

logger = logging.getLogger(__name__)


def get_os_username():
    """The name of the user running this process (dist-keras's ``pwd`` lookup).

    Returns:
        The user name, as a string.
    """
    try:
        import pwd

        return pwd.getpwuid(os.getuid())[0]
    except (ImportError, KeyError):  # no pwd (Windows), or a uid without a passwd entry
        import getpass

        return getpass.getuser()


def set_keras_base_directory(base_dir=None):
    """Makes ``base_dir/.keras`` Keras's home folder (its config, datasets and models).

    dist-keras set Keras 2's private ``_keras_base_dir``; Keras 3 reads ``KERAS_HOME``.
    This sets both ``KERAS_HOME`` (for Keras imported later, here or in processes started
    from here) and the folder of the Keras already imported.

    Args:
        base_dir: The folder to hold ``.keras`` (default ``/tmp/<user name>``, as dist-keras).

    Returns:
        The Keras home folder now in use.
    """
    import sys

    if base_dir is None:
        base_dir = os.path.join("/tmp", get_os_username())
    home = os.path.join(base_dir, ".keras")
    os.environ["KERAS_HOME"] = home
    config = sys.modules.get("keras.src.backend.config")
    if config is not None and hasattr(config, "_KERAS_DIR"):
        config._KERAS_DIR = home  # what keras.config / keras_home() return
    return home


def to_one_hot_encoded_dense(value, n_dim=2):
    """A numpy vector of ``n_dim`` zeros with a 1.0 at position ``value``.

    Args:
        value: The class index (an integer, or a float holding one).
        n_dim: The length of the vector.

    Returns:
        A float64 numpy array of shape ``(n_dim,)``.

    Raises:
        ValueError: When ``value`` is not an index in ``[0, n_dim)``.
    """
    index = int(value)
    if index != value or not 0 <= index < n_dim:
        raise ValueError(f"`value` must be a class index in [0, {n_dim - 1}] (n_dim={n_dim}). "
                         f"Received: value={value!r}")
    vector = np.zeros(n_dim)
    vector[index] = 1.0
    return vector


def new_dataframe_row(old_row, column_name, column_value):
    """A Spark `Row` with the fields of ``old_row`` and one more, ``column_name``.

    Args:
        old_row: A `pyspark.sql.Row` with named fields.
        column_name: The new field's name (not one ``old_row`` has).
        column_value: Its value.

    Returns:
        A new `pyspark.sql.Row`.

    Raises:
        ValueError: When ``old_row`` already has a field ``column_name``.
    """
    from pyspark.sql import Row

    fields = list(old_row.__fields__)
    if column_name in fields:
        raise ValueError(f"The row already has a field {column_name!r} ({fields}); "
                         "choose another name for the new column.")
    return Row(**dict(zip(fields, old_row)), **{column_name: column_value})


def json_to_dataframe_row(string):
    """A Spark `Row` of the fields of a JSON object (a Kafka message, say).

    Args:
        string: The JSON text of one object.

    Returns:
        A `pyspark.sql.Row`, its fields in the object's order.

    Raises:
        ValueError: When the text is not JSON, or not one JSON object.
    """
    import json

    from pyspark.sql import Row

    dictionary = json.loads(string)
    if not isinstance(dictionary, dict):
        raise ValueError(f"Expected the JSON of one object ({{...}}). Received: {string!r:.80}")
    return Row(**dictionary)


def pickle_object(o):
    """Pickles ``o`` into bytes (highest protocol), to keep in a local file.

    Never send these bytes over a network or read ones that came from one: unpickling runs
    code. distkeras itself pickles nothing it sends (models travel as `.keras` archives:
    `serialize_model`).

    Returns:
        The pickle, as bytes.
    """
    import pickle

    return pickle.dumps(o, -1)


def unpickle_object(string):
    """Rebuilds an object from `pickle_object`'s bytes; only bytes you wrote yourself.

    Unpickling runs whatever code the bytes name: never unpickle bytes that came over a
    network or from anyone else.

    Returns:
        The object.
    """
    import pickle

    return pickle.loads(string)


def history_executor(history, id):
    """The records of one worker (``worker_id == id``) in the order it took its steps,
    without the steps a failed attempt's retry trained again (see `Trainer.get_history`).

    Args:
        history: Records, as ``trainer.get_history()`` returns them.
        id: The worker id (its partition index).

    Returns:
        A list of records.
    """
    records = [record for record in history
               if record.get("worker_id") == id and not record.get("superseded")]
    return sorted(records, key=lambda record: record["iteration"])


def history_executors_average(history):
    """The history averaged over the workers, step by step (``trainer.get_averaged_history``).

    Returns:
        A dict of numpy arrays, one entry per averaged step (see
        `distkeras.training.history.average_history`); dist-keras returned a list of
        ``[loss, accuracy]`` arrays: ``loss`` and ``accuracy`` are keys here.
    """
    return average_history(history)


def uniform_weights(model, constraints=(-0.5, 0.5)):
    """Sets every weight of ``model`` to a value drawn uniformly from ``constraints``.

    Draws from numpy's global generator (``np.random.seed`` makes it repeatable).

    Args:
        model: A Keras model.
        constraints: ``(low, high)``, the range of the draw.

    Raises:
        ValueError: When ``constraints`` is not two numbers, ``low < high``.
    """
    low, high = _range(constraints)
    weights = [np.random.uniform(low, high, size=np.shape(weight)).astype(
        np.asarray(weight).dtype) for weight in model.get_weights()]
    model.set_weights(weights)


def _range(constraints):
    try:
        low, high = (float(bound) for bound in constraints)
    except (TypeError, ValueError) as error:
        raise ValueError("`constraints` must be two numbers, [low, high]. Received: "
                         f"{constraints!r}") from error
    if not low < high:
        raise ValueError(f"`constraints` must be [low, high] with low < high. Received: "
                         f"{constraints!r}")
    return low, high
