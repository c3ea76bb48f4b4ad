"""One set of CPU cores per worker when several workers share a machine.

JAX's CPU backend runs a step on as many cores as the process may use (a "single-threaded"
XLA still keeps about 1.75 of 2 cores busy). Two workers on two cores then fight over both
and each gets half of neither: measured on the 784-500-500-10 MLP, two such processes did
23k samples/s together where two processes pinned to one core each did 35k (see
docs/benchmarks.md). So when the trainer runs several workers per machine, each worker
claims its own cores for the length of its task and gives them back afterwards (Spark
reuses the Python worker for other tasks).

Workers on one machine agree on who gets which cores through lock files in the temporary
folder: a lock is released by the kernel when its process dies, so a killed worker never
keeps its cores.
"""

import contextlib
import fcntl
import logging
import os
import tempfile

from distkeras.session import local_cores

logger = logging.getLogger(__name__)

LOCK_FOLDER = os.path.join(tempfile.gettempdir(), f"distkeras-cores-{os.getuid()}")


def _thread_ids():
    try:
        return [int(name) for name in os.listdir("/proc/self/task")]
    except OSError:  # not Linux: the calling thread only
        return [0]


def _set_affinity(cores):
    """Restricts every thread of this process to ``cores``; returns what each had."""
    previous = {}
    for thread in _thread_ids():
        try:
            previous[thread] = os.sched_getaffinity(thread)
            os.sched_setaffinity(thread, cores)
        except OSError:  # the thread ended meanwhile
            continue
    return previous


def _restore_affinity(previous, fallback):
    for thread in _thread_ids():
        try:
            os.sched_setaffinity(thread, previous.get(thread, fallback))
        except OSError:
            continue


def _claim_slot(slots):
    """Locks the first free slot of ``slots``; returns ``(index, handle)`` or None."""
    os.makedirs(LOCK_FOLDER, exist_ok=True)
    for index in range(slots):
        handle = open(os.path.join(LOCK_FOLDER, f"slot-{index}.lock"), "a+b")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        return index, handle
    return None


def _try_claim_slot(slots):
    try:
        return _claim_slot(slots)
    except OSError as error:  # e.g. a lock folder another user owns: run, just unpinned
        logger.warning("Could not claim cores in %s (%s); this worker runs unpinned.",
                       LOCK_FOLDER, error)
        return None


@contextlib.contextmanager
def claimed_cores(workers_per_machine):
    """Pins this process to its share of the machine's cores while the block runs.

    Args:
        workers_per_machine: How many workers the trainer runs at once on one machine;
            ``None`` or 1 leaves the process on every core it may use.

    Yields:
        The set of cores this process runs on (all of them when not pinned).
    """
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if (not available or not workers_per_machine or workers_per_machine < 2
            or os.environ.get("DISTKERAS_PIN_CORES", "1") == "0"):
        yield set(available)
        return
    per_worker = max(1, len(available) // workers_per_machine)
    claim = _try_claim_slot(len(available) // per_worker)
    if claim is None:
        logger.info("All %d core sets are taken; this worker runs unpinned.",
                    len(available) // per_worker)
        yield set(available)
        return
    index, handle = claim
    cores = set(available[index * per_worker:(index + 1) * per_worker])
    previous = _set_affinity(cores)
    logger.debug("Worker pinned to cores %s", sorted(cores))
    try:
        yield cores
    finally:
        _restore_affinity(previous, set(available))
        handle.close()  # releases the lock


def workers_per_machine(master, tasks, task_cpus=1, executor_cores=None):
    """How many of ``tasks`` workers run at once on one machine, or None if unknown.

    Local masters run ``N / spark.task.cpus`` tasks at once on this machine for
    ``local[N]``; a cluster runs ``spark.executor.cores / spark.task.cpus`` per executor
    when those are set. (``spark.task.cpus=2`` on ``local[4]`` runs two tasks: counted as
    four, each worker would be pinned to half the cores its task reserved.)

    Args:
        master: The session's master (`distkeras.session.master`).
        tasks: The workers of the job.
        task_cpus: ``spark.task.cpus``.
        executor_cores: ``spark.executor.cores``, or None where it is not set.
    """
    cores = local_cores(master)
    if cores is None:
        if not executor_cores:
            return None
        cores = int(executor_cores)
    return max(1, min(tasks, cores // max(1, int(task_cpus))))
