"""The Spark jobs a trainer runs its workers in, as the driver sees them.

The labels of the runs in progress, the Spark job tags that cancel a run's jobs (in
classic and Spark Connect sessions alike), the rows per Arrow batch, the function each
task runs and its reply in chunks, the addresses the executors reach the driver at, a
failed job's cause, and the warnings about uneven partitions and Spark's speculation.
"""

import contextlib
import logging
import os
import re
import socket
import sys
import threading

from distkeras.data.feed import ARROW_BATCH_KEY, FEED_RECORDS_PER_BATCH
from distkeras.errors import ExecutorEnvironmentError, TrainingError
from distkeras.executor import devices, failures
from distkeras.session import is_connect, master
from distkeras.transport import networking

logger = logging.getLogger(__name__)


# The trainings in this process that set the rows per Arrow batch on a session and have not
# ended, counted by session: the last of them to end unsets it (see `feed_batch_rows`).
_FEED_LOCK = threading.Lock()
_FEED_SETTERS = {}


@contextlib.contextmanager
def feed_batch_rows(spark, rows=FEED_RECORDS_PER_BATCH):
    """Runs a job with ``rows`` rows per Arrow batch unless the session chose its own.

    The setting is the session's, and several trainings may run at once on one session
    (threads): the first to start sets it, the last to end unsets it, and a value the
    session had before any of them is left alone.
    """
    key = id(spark)
    with _FEED_LOCK:
        if key in _FEED_SETTERS:
            _FEED_SETTERS[key] += 1
        elif spark.conf.get(ARROW_BATCH_KEY, None) is not None:
            key = None  # the session's own setting
        else:
            spark.conf.set(ARROW_BATCH_KEY, str(rows))
            _FEED_SETTERS[key] = 1
    try:
        yield
    finally:
        if key is not None:
            with _FEED_LOCK:
                _FEED_SETTERS[key] -= 1
                if not _FEED_SETTERS[key]:
                    del _FEED_SETTERS[key]
                    spark.conf.unset(ARROW_BATCH_KEY)


@contextlib.contextmanager
def tagged_jobs(spark, tag, description=None):
    """Gives the Spark jobs this thread starts in the block the job tag ``tag``, which
    `cancel_jobs` cancels from any thread; in classic mode also ``description`` (the
    Spark UI's) and task threads interrupted on cancel.

    Notes:
        A job tag is what both modes have: Spark Connect's session tags
        (``spark.addTag``), the classic ``SparkContext``'s job tags (the classic session's
        own tags do not reach the jobs of a Python ``collect()``).
    """
    if is_connect(spark):
        spark.addTag(tag)
        try:
            yield tag
        finally:
            spark.removeTag(tag)
        return
    context = spark.sparkContext
    context.addJobTag(tag)
    context.setInterruptOnCancel(True)
    context.setJobDescription(description)
    try:
        yield tag
    finally:
        context.removeJobTag(tag)
        context.setJobDescription(None)
        context.setInterruptOnCancel(False)


def cancel_jobs(spark, tag):
    """Cancels the running Spark jobs tagged ``tag`` (`tagged_jobs`), from any thread."""
    if is_connect(spark):
        spark.interruptTag(tag)
    else:
        spark.sparkContext.cancelJobsWithTag(tag)


# The trainings in progress in this process (several threads may train at once, as a
# hyperparameter search's do), and how many have started: see `begin_run`.
_RUNS_LOCK = threading.Lock()
_RUNS_IN_PROGRESS = set()
_RUNS_STARTED = 0


def begin_run(kind):
    """Registers a training of trainer class ``kind`` that starts now; returns ``(run id,
    label)``. The label names its progress, its Spark jobs and its result lines: the class
    name, with the run's number (``ADAG #2``) when another training is in progress in
    this process, whose lines would otherwise read the same."""
    global _RUNS_STARTED
    with _RUNS_LOCK:
        _RUNS_STARTED += 1
        run = _RUNS_STARTED
        label = f"{kind} #{run}" if _RUNS_IN_PROGRESS else kind
        _RUNS_IN_PROGRESS.add(run)
    return run, label


def end_run(run):
    with _RUNS_LOCK:
        _RUNS_IN_PROGRESS.discard(run)


# Workers whose sample counts differ by more than this fraction get a warning.
UNEVEN_TOLERANCE = 0.10


def warn_if_uneven(messages):
    """Logs a warning when the workers trained on very different numbers of samples.

    The slowest worker sets a run's wall time, and a DataFrame that already has one
    partition per worker is trained as it is: Spark's split of a file is often uneven.

    Args:
        messages: The workers' result messages (each with ``worker_id`` and ``samples``).

    Returns:
        Whether a warning was logged.
    """
    counts = {message["worker_id"]: message.get("samples") for message in messages}
    if len(counts) < 2 or not all(isinstance(count, int) for count in counts.values()):
        return False
    fewest, most = min(counts.values()), max(counts.values())
    if most <= (1 + UNEVEN_TOLERANCE) * fewest:
        return False
    if fewest == 0:
        logger.warning(
            "Worker(s) %s had no rows to train on (an empty partition).",
            ", ".join(str(worker_id) for worker_id, count in sorted(counts.items())
                      if count == 0))
    logger.warning(
        "The workers trained on uneven partitions (samples per worker: %s); the one with "
        "the most sets the wall time. Spread the rows evenly once, for example "
        "`df = df.repartition(%d).cache()`, or pass train(df, shuffle=True).",
        ", ".join(f"{worker_id}: {count}" for worker_id, count in sorted(counts.items())),
        len(counts))
    return True


def warn_if_speculative(spark, trainer_name):
    """Logs a warning when Spark may run a second copy of a slow worker's task.

    With ``spark.speculation=true`` Spark starts a copy of a slow task on another host
    and keeps whichever ends first. A parameter-server worker is not idempotent: both
    copies commit their partition's training to the center, so that partition counts
    twice, and the slower copy's steps are recorded as superseded. Spark cannot turn it
    off for one job, so the user is told here, before any Spark job. Local masters run
    every task on one host, where Spark never starts a speculative copy.

    Args:
        spark: The SparkSession the training runs on (classic or Connect).
        trainer_name: The trainer's class name, for the message.

    Returns:
        Whether a warning was logged.
    """
    speculation = spark.conf.get("spark.speculation", "false") or "false"
    if speculation.strip().lower() != "true" or master(spark).startswith("local"):
        return False
    logger.warning(
        "spark.speculation=true: Spark may start a second copy of a slow %s worker's "
        "task, and both copies commit their partition to the parameter server (that "
        "partition is trained into the center twice). Start the session with "
        "--conf spark.speculation=false for distkeras training.", trainer_name)
    return True


_CRASHED_WORKER = "Python worker exited unexpectedly"


def worker_error_message(error):
    """The most telling line of a failed Spark job: the worker's own exception."""
    text = str(error)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if _CRASHED_WORKER in text and "WorkerFailure" not in text:
        # A process that died raised nothing: Spark's last "Caused by" is only the broken
        # pipe it saw (a "Connection reset"), which does not say that a worker died.
        return _crashed_worker_message(text)
    python_errors = [line for line in lines
                     if ("Error:" in line or "Exception:" in line) and not line.startswith("at ")]
    cause = python_errors[-1] if python_errors else (lines[0] if lines else repr(error))
    return cause + _environment_hint(cause)


def _environment_hint(cause):
    """For an executor whose Python lacks a module (its ``ModuleNotFoundError``), which
    Python to give the executors; else nothing.

    Spark starts the executors' Python workers with ``spark.pyspark.python`` or
    ``PYSPARK_PYTHON``, else ``python3`` from the PATH: outside the environment that has
    distkeras, numpy and Keras, every task fails on its first import.
    """
    missing = re.search(r"ModuleNotFoundError: No module named '([^']+)'", cause)
    if missing is None:
        return ""
    given = os.environ.get("PYSPARK_PYTHON")
    now = f" (PYSPARK_PYTHON={given} here)" if given else ""
    return (f". The executors' Python{now} cannot import {missing.group(1)!r}: point "
            "spark.pyspark.python (or the PYSPARK_PYTHON environment variable, set before "
            "the SparkSession starts) at a Python that has distkeras and its dependencies "
            f"installed, for example this driver's: PYSPARK_PYTHON={sys.executable}, or "
            "--conf spark.pyspark.python=/path/to/env/bin/python on a cluster")


# Applications whose executors were seen to import distkeras (`check_executor_python`).
_EXECUTOR_PYTHON_CHECKED = set()


def _imports_distkeras(record_batches):
    # Spark unpickles this function on the executor, which imports its module (distkeras)
    # there; the imports below are those every task needs first: a Python without them
    # fails here, before any model is sent.
    import importlib

    for name in ("numpy", "pyarrow"):
        importlib.import_module(name)
    for batch in record_batches:
        yield batch


def check_executor_python(spark):
    """Checks, once per Spark application, that the executors' Python imports distkeras.

    Args:
        spark: The SparkSession (classic or Connect).

    Raises:
        distkeras.errors.ExecutorEnvironmentError: When it cannot, naming the Python to
            give the executors (``spark.pyspark.python`` or ``PYSPARK_PYTHON``).
    """
    application = spark.conf.get("spark.app.id", None) or id(spark)
    if application in _EXECUTOR_PYTHON_CHECKED:
        return
    try:
        # A DataFrame job, as the trainers' (the one kind Spark Connect runs).
        spark.range(0, 1, 1, 1).mapInArrow(_imports_distkeras, "id long").collect()
    except Exception as error:  # Spark's Py4JJavaError or PythonException, by its text
        hint = _environment_hint(worker_error_message(error))
        if not hint:
            raise
        raise ExecutorEnvironmentError(
            f"The executors cannot run distkeras{hint}.") from error
    _EXECUTOR_PYTHON_CHECKED.add(application)


def _crashed_worker_message(text):
    """What to tell the user when a task's Python process died, from Spark's ``text``."""
    task = re.search(r"Lost (task \S+ in stage \S+)", text)
    where = f" ({task.group(1)})" if task else ""
    return (f"a Python worker process exited unexpectedly{where}: it was killed (out of "
            "memory, or by a signal) or crashed in native code, and raised no Python error. "
            "The executor's log tells more; spark.python.worker.faulthandler.enabled=true "
            "adds the Python traceback of a crash.")


def raise_reported_failure(server, error):
    """Raises, from ``error`` (the stopped job's), a `TrainingError` naming the first
    failure a worker reported to ``server`` (the cause of the stop), if there is one."""
    failures = getattr(getattr(server, "sink", None), "worker_failures", None)
    if failures:
        worker_id, cause = failures[0]
        raise TrainingError(f"Training failed on an executor: partition {worker_id} "
                            f"failed: {cause}") from error


def register_user_module(obj):
    """Lets Spark ship a user's worker class, and its algorithm's (`algorithms.Algorithm`),
    by value when their modules are not installed."""
    from pyspark import cloudpickle

    for item in (obj, getattr(obj, "algorithm", None)):
        module_name = type(item).__module__
        if item is None or module_name.split(".")[0] in ("distkeras", "__main__"):
            continue
        module = sys.modules.get(module_name)
        if module is not None:
            cloudpickle.register_pickle_by_value(module)


# The field of a task's reply that carries an `UnretryableError` instead of its results.
UNRETRYABLE = "unretryable_error"


def arrow_training_job(worker, label_shapes, replay):
    """The function each Spark task runs: train on the partition (``replay.num_epoch``
    times, see `epochs.Replay`), return one frame."""
    def run_partition(record_batches):
        from pyspark import TaskContext

        context = TaskContext.get()
        partition = context.partitionId()
        message = train_partition(worker, context, replay.batches(record_batches, partition),
                                  label_shapes)
        yield reply_batch(partition, message)

    return run_partition


def train_partition(worker, context, batches, label_shapes):
    """Runs ``worker`` over the task's ``batches``; returns its message (or, for an error
    no retry gets past, a message carrying it under `UNRETRYABLE`).

    Raises:
        WorkerFailure: Any other error, naming the partition and the task's attempt.
    """
    partition = context.partitionId()
    try:
        with devices.task_devices() as task:  # the task's GPUs, before Keras loads
            return task.call(lambda each: worker.run(partition, each, label_shapes), batches)
    except Exception as error:
        unretryable = failures.unretryable_error(error)
        if unretryable is None:
            raise failures.WorkerFailure(
                f"partition {partition} (attempt {context.attemptNumber() + 1}) failed: "
                f"{failures.one_line(error)}") from error
        # Rows no retry can train on, an update that does not fit the model: the task
        # ends as one that succeeded, so Spark does not run it again (up to 4 times,
        # each training up to the same error), and its reply carries the error.
        return {"worker_id": partition,
                UNRETRYABLE: f"partition {partition} failed: "
                             f"{failures.one_line(unretryable)}"}


def reply_batch(partition, message):
    """The Arrow record batch of a task's reply: ``message`` encoded, in chunks."""
    import pyarrow as pa

    chunks = reply_chunks(networking.encode_message(message))
    return pa.RecordBatch.from_pydict(
        {"worker_id": [partition] * len(chunks), "chunk": list(range(len(chunks))),
         "chunks": [len(chunks)] * len(chunks), "payload": chunks},
        schema=pa.schema([("worker_id", pa.int64()), ("chunk", pa.int32()),
                          ("chunks", pa.int32()), ("payload", pa.binary())]),
    )


# A task's reply travels in rows of at most this many bytes. The driver's JVM pickles each
# row whole for Python's ``collect()``, through a buffer that grows by copies: one row of
# 80 MB (the weights of 20 million float32 parameters) exhausts Spark's default 1 GB
# driver heap, where 8 MB rows of the same reply do not.
REPLY_CHUNK_BYTES = 8 << 20


def reply_chunks(frame, size=REPLY_CHUNK_BYTES):
    """``frame`` (bytes) in consecutive pieces of at most ``size`` bytes (at least one)."""
    view = memoryview(frame)
    return [bytes(view[start:start + size]) for start in range(0, max(len(frame), 1), size)]


def joined_replies(rows, num_tasks):
    """The tasks' replies (frames, by worker id) from the rows of their chunks.

    Raises:
        TrainingError: When a reply or a piece of one is missing. PySpark's ``collect()``
            returns the rows read so far, without an error, when the driver's thread that
            serves them fails (out of memory): trained on, those would be no replicas or
            some (AveragingTrainer's average of none: the initial weights).
    """
    pieces = {}
    for row in rows:
        pieces.setdefault(row["worker_id"], {})[row["chunk"]] = (row["chunks"], row["payload"])
    complete = {worker_id: chunks for worker_id, chunks in pieces.items()
                if all(len(chunks) == total for total, _ in chunks.values())}
    if len(complete) != num_tasks:
        raise TrainingError(
            f"The driver received the results of {len(complete)} of its {num_tasks} "
            "workers whole: the Spark driver probably ran out of memory passing them to "
            "Python (its log says). Give it more (spark.driver.memory; spark-submit's "
            "--driver-memory) or train a smaller model.")
    return [b"".join(chunks[index][1] for index in range(len(chunks)))
            for _, chunks in sorted(complete.items())]


def driver_address(spark):
    """The address executors use to reach the driver (127.0.0.1 in local mode)."""
    if master(spark).startswith("local"):
        return "127.0.0.1"
    return spark.conf.get("spark.driver.host", None) or socket.gethostname()


def bind_address(spark):
    """The address the parameter server listens on: the driver's own."""
    if master(spark).startswith("local"):
        return "127.0.0.1"
    return spark.conf.get("spark.driver.bindAddress", None) or socket.gethostbyname(
        driver_address(spark))
