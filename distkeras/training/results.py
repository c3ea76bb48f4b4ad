"""The getters of a trainer's last run: they read its `run.RunResults`, never a live run.

The last run's server (its sockets closed, its threads ended) stays reachable in this
process as ``trainer.parameter_server``, for its counters (``num_updates``, ``refused``,
``epochs_done``); it is not part of the trainer's state, so a trainer pickles and copies
with its results (history, validation history, staleness) but without that server.
"""

import logging
import weakref

from distkeras.training.history import average_history
from distkeras.training.run import RunResults

# The trainers' logger, as before these getters moved out of `distkeras.trainers`.
logger = logging.getLogger("distkeras.trainers")

# trainer -> the server of its last run, in this process only (see the module's docstring).
_LAST_SERVERS = weakref.WeakKeyDictionary()

_NO_RESULTS = RunResults()


def keep(trainer, run):
    """Makes ``run`` (finished, or stopped by an error) ``trainer``'s last run."""
    trainer._results = run.results()
    if run.server is not None:
        _LAST_SERVERS[trainer] = run.server
    else:
        _LAST_SERVERS.pop(trainer, None)


class ResultAccessors:
    """The getters of the last `train()`'s results, mixed into every trainer."""

    _results = _NO_RESULTS

    @property
    def parameter_server(self):
        """The server of the last `train()` in this process (None before one, or where
        the run had none)."""
        return _LAST_SERVERS.get(self)

    def get_training_time(self):
        """Wall-clock seconds of the last `train()`."""
        return self._results.training_time

    def get_history(self):
        """One record per training step of the last `train()`.

        Returns:
            A list of dicts with ``worker_id``, ``iteration``, ``timestamp``,
            ``batch_size``, ``epoch``, the loss and the metrics.

        Notes:
            When Spark retried a worker's failed task, the records of its steps carry
            ``attempt``: the worker's attempts in the order they started, from 0. Those of
            the failed attempt's steps that the retry trained again carry
            ``superseded=True``. Their commits were applied to the center, but they do not
            count in the progress, the epochs' ends, `get_averaged_history` or
            `get_executor_history`.
        """
        return list(self._results.history)

    def get_averaged_history(self):
        """The history averaged over workers, step by step within each epoch.

        Returns:
            A dict of numpy arrays by name (``iteration``, ``epoch``, ``loss``, each
            metric, ``timestamp``, ...); see `distkeras.utils.average_history`.
        """
        return average_history(self._results.history)

    def get_executor_history(self, worker_id):
        """The step records of one worker, of its final attempt where Spark retried it.

        Args:
            worker_id: The worker's partition index.

        Returns:
            The worker's records, as `get_history` gives them. An id without records (a
            typo, or a worker whose partition had no rows) gives an empty list and a
            warning naming the ids that have records.
        """
        history = self._results.history
        records = [record for record in history
                   if record["worker_id"] == worker_id and not record.get("superseded")]
        if not records and history:
            known = sorted({record["worker_id"] for record in history})
            logger.warning("get_executor_history(%r): no records of that worker; the workers "
                           "with records are %s (a worker whose partition had no rows has "
                           "none).", worker_id, known)
        return records

    def get_validation_history(self):
        """One record per evaluation of the validation data in the last `train()`.

        Returns:
            A list of dicts with ``epoch``, ``samples``, ``timestamp``, ``loss`` (the
            epoch's mean step loss, where known), ``val_loss`` and ``val_<metric>``.
        """
        return list(self._results.validation_history)
