"""The history a worker reports, as the messages carry it: its step records, packed as
columns (`pack_history`, read back with `unpack_history` and `history_records`), and its
metric state per epoch (`INDEX_FIELD`, `VALUES_FIELD`, read back with
`unpack_metric_states`).

The workers (`distkeras.executor`) write these fields; the driver's server and the driver
(`distkeras.training`) read them.
"""

import math

import numpy as np

from distkeras.transport.networking import ProtocolError

# Step record fields that are whole numbers, as a worker's `_record_step` writes them (the
# server and the driver's monitor count with them).
INTEGRAL_FIELDS = frozenset({"worker_id", "iteration", "batch_size", "epoch"})
# Message fields of a metric state report (next to a worker's step records).
INDEX_FIELD = "metric_state_index"
VALUES_FIELD = "metric_state_values"


def pack_history(columns):
    """History columns as message fields whose numbers travel as arrays, not JSON.

    A run of many steps would otherwise outgrow the frame's JSON header. Missing values
    travel as NaN with a mask, so a loss that became NaN stays NaN.
    """
    keys = sorted(columns)
    if not keys:
        return {"history_keys": []}
    arrays, missing = [], []
    for key in keys:
        values = columns[key]
        missing.append(np.fromiter((value is None for value in values), dtype=np.uint8,
                                   count=len(values)))
        arrays.append(np.asarray([np.nan if value is None else value for value in values],
                                 dtype=np.float64))
    return {"history_keys": keys, "history_columns": arrays, "history_missing": missing}


def unpack_history(message):
    """Inverse of `pack_history` (counters back to ints)."""
    keys = message.get("history_keys") or []
    arrays = message.get("history_columns", [])
    masks = message.get("history_missing", [])
    columns = {}
    for key, array, mask in zip(keys, arrays, masks):
        integral = key in INTEGRAL_FIELDS
        columns[key] = [None if absent else (int(value) if integral else float(value))
                        for value, absent in zip(array.tolist(), mask.tolist())]
    return columns


def history_records(columns):
    """Turns history columns back into a list of per-step dicts."""
    if not columns:
        return []
    size = len(next(iter(columns.values())))
    return [
        {key: column[index] for key, column in columns.items() if column[index] is not None}
        for index in range(size)
    ]


def unpack_metric_states(message, worker_id):
    """The metric state reports a message carries (as
    `distkeras.executor.metric_sums.EpochMetricSums.drain` writes them), as dicts with
    ``worker_id``, ``epoch``, ``name``, ``spec`` and ``state`` (a list of arrays).

    Raises:
        ProtocolError: When the fields do not describe the values.
    """
    index = message.get(INDEX_FIELD)
    if index is None:
        return []
    values = message.get(VALUES_FIELD)
    if not isinstance(index, list) or not isinstance(values, np.ndarray) or values.ndim != 1:
        raise ProtocolError("A metric state report must carry an index and a 1-D array.")
    reports, offset = [], 0
    for entry in index:
        try:
            epoch, name, spec = int(entry["epoch"]), str(entry["name"]), dict(entry["spec"])
            shapes = [tuple(int(size) for size in shape) for shape in entry["shapes"]]
        # OverflowError: int() of an Infinity that JSON as Python reads it may hold.
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            raise ProtocolError(f"Bad metric state entry: {error}") from error
        if any(size < 0 for shape in shapes for size in shape):
            raise ProtocolError("A metric state report names a negative dimension.")
        state = []
        for shape in shapes:
            # Python's integers: an int64 product wraps (2**62 * 4 is 0), and reshape
            # then failed as a bug of the server's rather than a bad report.
            size = math.prod(shape)
            if offset + size > len(values):
                raise ProtocolError("A metric state report holds fewer values than it says.")
            try:
                state.append(values[offset:offset + size].reshape(shape))
            # An empty state whose other dimensions overflow (numpy's int64, or C's long).
            except (ValueError, OverflowError) as error:
                raise ProtocolError(f"Bad metric state shape {list(shape)}: {error}") \
                    from error
            offset += size
        reports.append({"worker_id": worker_id, "epoch": epoch, "name": name, "spec": spec,
                        "state": state})
    if offset != len(values):
        raise ProtocolError("A metric state report holds more values than it says.")
    return reports
