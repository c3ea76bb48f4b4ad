"""Launches a run's workers as one Spark job and collects their replies.

The Spark side of a run: a job group of its own (to cancel it as one), the slots the job
needs, the `mapInArrow` job whose tasks run the workers (`spark_jobs`), and their
replies decoded, with the errors no retry gets past raised on the driver.
"""

import time

from distkeras.errors import TrainingError
from distkeras.executor import affinity
from distkeras.executor.epochs import Replay
from distkeras.training.spark_jobs import (UNRETRYABLE, arrow_training_job, feed_batch_rows,
                                           joined_replies, warn_if_uneven,
                                           worker_error_message)
from distkeras.transport import networking


def new_job_group(run):
    """A Spark job group of its own for one Spark job of ``run`` (to cancel its tasks as
    one)."""
    return f"distkeras-{id(run)}-{time.time_ns()}"


def slots_for_one_job(run, frame, num_tasks):
    """Whether Spark can run ``num_tasks`` tasks at once and keep them waiting at the
    epochs' ends: callbacks run meanwhile, and one of the user's own might start a
    Spark job, which needs a slot more (Keras's don't)."""
    slots = affinity.concurrent_task_slots(frame.sparkSession.sparkContext)
    needed = num_tasks + (1 if run.own_callbacks() else 0)
    return slots is not None and slots >= needed


def run_workers(frame, num_tasks, worker, label_shapes, description, job_group=None,
                replay=None, barrier=False, job=None):
    """Runs one Spark task per partition of ``frame`` (``num_tasks`` of them, as laid
    out by `frame_layout.lay_out`), each over its partition as ``replay`` (an
    `epochs.Replay`; default: once); returns the workers' messages. With ``barrier``,
    Spark starts the tasks together (and restarts them together). ``job``: the task
    function instead of `arrow_training_job`'s (one reply per task, as it gives).

    Raises:
        TrainingError: A task failed (Spark's error, unwrapped), or a worker met an error
            no retry gets past.
    """
    import pyarrow as pa  # noqa: F401  (fail early on the driver if Arrow is missing)

    context = frame.sparkSession.sparkContext
    if job_group is not None:
        context.setJobGroup(job_group, description, interruptOnCancel=True)
    else:
        context.setJobDescription(description)
    worker.spec = worker.spec.replace(
        workers_per_machine=affinity.workers_per_machine(context, num_tasks))
    job = frame.mapInArrow(job or arrow_training_job(worker, label_shapes, replay or Replay()),
                           "worker_id long, chunk int, chunks int, payload binary",
                           barrier=barrier)
    if barrier:
        # Spark restarts a failed barrier stage only when a shuffle follows it (it
        # aborts a failed barrier result stage): the workers' small replies take one.
        job = job.repartition(1)
    try:
        with feed_batch_rows(frame.sparkSession):
            rows = job.collect()
    except KeyboardInterrupt:
        if job_group is not None:
            context.cancelJobGroup(job_group)
        raise
    except Exception as error:  # Spark wraps the worker's exception; surface it
        raise TrainingError(
            f"Training failed on an executor: {worker_error_message(error)}") from error
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
        context.setJobDescription(None)
    messages = [networking.decode_message(reply) for reply in joined_replies(rows, num_tasks)]
    for message in messages:
        if UNRETRYABLE in message:
            raise TrainingError(f"Training failed on an executor: {message[UNRETRYABLE]}")
    warn_if_uneven(messages)
    return messages
