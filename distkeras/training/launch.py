"""Launches a run's workers as one Spark job and collects their replies.

The Spark side of a run: a job tag of its own (to cancel it as one), the slots the job
needs, the `mapInArrow` job whose tasks run the workers (`spark_jobs`), and their
replies decoded, with the errors no retry gets past raised on the driver. The same calls
serve classic and Spark Connect sessions; `client_serves` says whether the executors may
call back a server in this process (classic mode only).
"""

import time

from distkeras import session
from distkeras.errors import TrainingError
from distkeras.executor import affinity
from distkeras.executor.epochs import Replay
from distkeras.training.spark_jobs import (UNRETRYABLE, arrow_training_job, feed_batch_rows,
                                           joined_replies, tagged_jobs, cancel_jobs,
                                           warn_if_uneven, worker_error_message)
from distkeras.transport import networking


def new_job_tag(run):
    """A Spark job tag of its own for one Spark job of ``run`` (to cancel its tasks as
    one, `spark_jobs.cancel_jobs`)."""
    return f"distkeras-{id(run)}-{time.time_ns()}"


def client_serves(spark):
    """Whether the executors may reach a server in this Python process: in classic mode
    (the driver); not from a Spark Connect client, which is often on another network and
    where the driver is the Connect server's."""
    return not session.is_connect(spark)


def check_client_serves(spark, name, settings=None):
    """Refuses, under Spark Connect, a run whose parameter server would listen in this
    process (the executors cannot be counted on to reach a Connect client).

    Args:
        spark: The SparkSession.
        name: The trainer's name, for the message.
        settings: The run's settings; where they hold ``parameter_server_location``, the
            message names it.

    Raises:
        ValueError: Under Spark Connect, saying what to use instead.
    """
    if client_serves(spark):
        return
    if settings is not None and hasattr(settings, "parameter_server_location"):
        fix = (f"Pass parameter_server_location=\"executor\" to {name} (its server then "
               "runs in a task of the training's own Spark job), or train from a classic "
               "SparkSession.")
    else:
        fix = ("Train it from a classic SparkSession (SparkSession.builder.master(...)"
               ".getOrCreate(), or distkeras.session.local_spark_session()); "
               "SingleTrainer, AveragingTrainer and EnsembleTrainer train under Connect.")
    raise ValueError(
        f"{name} runs a parameter server on the driver, in this Python process, and this "
        f"is a Spark Connect session: its executors cannot be counted on to reach a "
        f"Connect client. {fix}")


def slots_for_one_job(run, frame, num_tasks):
    """Whether Spark can run ``num_tasks`` tasks at once and keep them waiting at the
    epochs' ends on a server in this process: callbacks run meanwhile, and one of the
    user's own might start a Spark job, which needs a slot more (Keras's don't). Never
    under Spark Connect (`client_serves`): the run then takes a job per epoch."""
    spark = frame.sparkSession
    if not client_serves(spark):
        return False
    slots = session.concurrent_task_slots(spark)
    needed = num_tasks + (1 if run.own_callbacks() else 0)
    return slots is not None and slots >= needed


def workers_per_machine(spark, num_tasks):
    """`affinity.workers_per_machine` for the session's master and settings."""
    return affinity.workers_per_machine(session.master(spark), num_tasks,
                                        session.task_cpus(spark),
                                        spark.conf.get("spark.executor.cores", None))


def run_workers(frame, num_tasks, worker, label_shapes, description, job_tag=None,
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

    spark = frame.sparkSession
    job_tag = job_tag or f"distkeras-{time.time_ns()}"
    worker.spec = worker.spec.replace(
        workers_per_machine=workers_per_machine(spark, num_tasks))
    job = frame.mapInArrow(job or arrow_training_job(worker, label_shapes, replay or Replay()),
                           "worker_id long, chunk int, chunks int, payload binary",
                           barrier=barrier)
    if barrier:
        # Spark restarts a failed barrier stage only when a shuffle follows it (it
        # aborts a failed barrier result stage): the workers' small replies take one.
        job = job.repartition(1)
    try:
        with tagged_jobs(spark, job_tag, description), feed_batch_rows(spark):
            rows = job.collect()
    except KeyboardInterrupt:
        cancel_jobs(spark, job_tag)
        raise
    except Exception as error:  # Spark wraps the worker's exception; surface it
        raise TrainingError(
            f"Training failed on an executor: {worker_error_message(error)}") from error
    messages = [networking.decode_message(reply) for reply in joined_replies(rows, num_tasks)]
    for message in messages:
        if UNRETRYABLE in message:
            raise TrainingError(f"Training failed on an executor: {message[UNRETRYABLE]}")
    warn_if_uneven(messages)
    return messages
