"""A training's step history, averaged over the workers, and saved to or loaded from
any Hadoop path (the driver)."""

import json

import numpy as np

from distkeras.data import storage


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



def save_history(history, path):
    """Saves a trainer's history (a list of records) as JSON at ``path``, atomically."""
    storage.write_bytes(path, json.dumps(list(history)).encode("utf-8"))


def load_history(path):
    """Loads a history saved by `save_history`."""
    return json.loads(storage.read_bytes(path).decode("utf-8"))

