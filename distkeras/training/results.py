"""A trainer's last run: the `run.RunResults` its getters read (`Trainer.get_history`, ...),
never a live run.

The last run's server (its sockets closed, its threads ended) stays reachable in this
process as ``trainer.parameter_server``, for its counters (``num_updates``, ``refused``,
``epochs_done``); it is not part of the trainer's state, so a trainer pickles and copies
with its results (history, validation history, staleness) but without that server.
"""

import logging
import weakref

from distkeras.training.run import RunResults

logger = logging.getLogger(__name__)

# trainer -> the server of its last run, in this process only (see the module's docstring).
_LAST_SERVERS = weakref.WeakKeyDictionary()

NO_RESULTS = RunResults()


def keep(trainer, run):
    """Makes ``run`` (finished, or stopped by an error) ``trainer``'s last run."""
    trainer._results = run.results()
    if run.server is not None:
        _LAST_SERVERS[trainer] = run.server
    else:
        _LAST_SERVERS.pop(trainer, None)


def last_server(trainer):
    """The server of ``trainer``'s last run in this process, or None."""
    return _LAST_SERVERS.get(trainer)


def executor_history(history, worker_id):
    """The records in ``history`` of one worker's final attempt (`Trainer.get_executor_history`);
    warns, naming the workers that have records, when it has none."""
    records = [record for record in history
               if record["worker_id"] == worker_id and not record.get("superseded")]
    if not records and history:
        known = sorted({record["worker_id"] for record in history})
        logger.warning("get_executor_history(%r): no records of that worker; the workers "
                       "with records are %s (a worker whose partition had no rows has "
                       "none).", worker_id, known)
    return records
