"""When Punchcard starts and stops jobs: fair turns among identities, a time limit, and
the loop that applies them. Run in the server.

Queued jobs start fairly: the next one is of the identity with the fewest jobs running,
then of the one whose last turn is the longest ago (round-robin), then the oldest, so one
identity's many secrets cannot take every slot, nor every turn, while another waits.
"""

import logging
import threading

logger = logging.getLogger(__name__)


def next_jobs(running, queued, max_running, turns=None):
    """The queued jobs to start now: one at a time to the identity with the fewest jobs
    running, then the one whose last start is the oldest (never started: first), then the
    oldest job, for as many slots as are free.

    Args:
        running: The running jobs' rows.
        queued: The queued jobs' rows.
        max_running: Jobs that may run at once.
        turns: Identity -> when its last job started (any increasing count), updated
            here for the jobs chosen; None: none known.

    Returns:
        The rows to start, in order.
    """
    turns = {} if turns is None else turns
    counts = {}
    for job in running:
        counts[job["identity"]] = counts.get(job["identity"], 0) + 1
    queued, chosen = list(queued), []
    for _ in range(max(0, max_running - len(running))):
        if not queued:
            break
        job = min(queued, key=lambda job: (counts.get(job["identity"], 0),
                                           turns.get(job["identity"], -1), job["created"]))
        queued.remove(job)
        chosen.append(job)
        counts[job["identity"]] = counts.get(job["identity"], 0) + 1
        turns[job["identity"]] = max(turns.values(), default=0) + 1
    return chosen


def is_overdue(job, max_job_seconds, now):
    """Whether a running job has run longer than ``max_job_seconds`` (None: no limit)."""
    return max_job_seconds is not None and bool(job["started"]) and \
        now - job["started"] > max_job_seconds


def run_every(step, stop, interval=0.5, name="punchcard-scheduler"):
    """Starts a daemon thread that calls ``step()`` every ``interval`` seconds until the
    event ``stop`` is set; returns the thread.

    Notes:
        An exception from ``step`` is logged and the loop goes on: the scheduler must
        survive anything one job does.
    """
    def loop():
        while not stop.is_set():
            try:
                step()
            except Exception:  # the scheduler must survive anything one job does
                logger.exception("Punchcard scheduler error")
            stop.wait(interval)

    thread = threading.Thread(target=loop, daemon=True, name=name)
    thread.start()
    return thread
