"""Where a parameter-server training's server runs: on the driver, or inside the Spark job.

``parameter_server_location="driver"`` is the parameter-server plan's own path
(`parameter_server.ParameterServerPlan`). With ``"executor"`` the run is one barrier stage
of ``num_workers * parallelism_factor`` tasks: the task of partition 0 starts the server
beside its worker, its address reaches the other tasks through
``BarrierTaskContext.allGather`` (the token travels in the task's spec, as for the driver's
server), and once every worker has said goodbye it sends the center, the update count,
the history and, with validation, the center at each epoch's end back with its worker's
reply (Arrow rows, chunked, no pickle). The driver builds the model from them and
validates the epochs afterwards: see docs/parameter-server-placement.md.
"""

import logging
import os
import secrets
import socket
import sys
import threading
import time
from urllib.parse import urlparse

import numpy as np

from distkeras import session
from distkeras.data import frame_layout
from distkeras.errors import TrainingError
from distkeras.executor import failures
from distkeras.executor.epochs import Replay
from distkeras.training import epoch_metrics
from distkeras.training import worker_setup
from distkeras.training.checkpoints import load_checkpoint, restore, save_checkpoint
from distkeras.training.monitor import TrainingMonitor
from distkeras.training.shortfalls import warn_if_nothing_committed, warn_if_trained_short
from distkeras.training.spark_jobs import reply_batch, train_partition
from distkeras.training.validator import epoch_logs
from distkeras.transport import history_messages
from distkeras.transport.networking import weights_array

logger = logging.getLogger(__name__)

LOCATIONS = ("driver", "executor")
# The fields of the server's part of partition 0's reply.
_PREFIX = "server_"


def check_location(value):
    """Checks ``parameter_server_location``: None (the session decides), or one of
    `LOCATIONS`.

    Raises:
        ValueError: Naming the values it takes.
    """
    if value is not None and value not in LOCATIONS:
        raise ValueError("`parameter_server_location` must be 'driver' (the server runs in "
                         "this process), 'executor' (in a task of the training's Spark job) "
                         f"or None (the session decides). Received: {value!r}")


def is_connect(frame=None):
    """Whether this process talks to Spark through Spark Connect (or ``frame`` is a Spark
    Connect DataFrame)."""
    if frame is not None and session.is_connect(frame.sparkSession):
        return True
    try:
        from pyspark.sql.utils import is_remote  # optional: pyspark's own test
    except ImportError:
        return False
    return bool(is_remote())


def resolve_location(setting, frame=None):
    """Where the server runs: ``setting`` where given, else ``"executor"`` under Spark
    Connect (the client may be a place the executors cannot call back) and ``"driver"``
    in a classic session."""
    if setting is not None:
        return setting
    return "executor" if is_connect(frame) else "driver"


def check_slots(spark, num_tasks, name):
    """Refuses a barrier stage of ``num_tasks`` tasks that Spark cannot start at once.

    Raises:
        ValueError: With the numbers and what to change.
    """
    slots = session.concurrent_task_slots(spark)
    if slots is not None and slots < num_tasks:
        raise ValueError(
            f"{name} with parameter_server_location='executor' runs its {num_tasks} tasks "
            f"(num_workers * parallelism_factor) as one barrier stage, which needs them all "
            f"at once, and this Spark runs {slots} tasks at once. Use num_workers <= "
            f"{slots} (with parallelism_factor=1), give Spark more cores (local[{num_tasks}], "
            "more executors or spark.executor.cores), or use "
            "parameter_server_location='driver'.")


def check_checkpoint_dir(folder):
    """The ``checkpoint_dir`` as the server's executor writes it: an absolute local path.

    Raises:
        ValueError: For a path on another filesystem (``hdfs://``, ``s3a://``): an
            executor's Python reaches files only.
    """
    if folder is None:
        return None
    scheme = urlparse(folder).scheme
    if scheme not in ("", "file"):
        raise ValueError(
            f"checkpoint_dir={folder!r}: with parameter_server_location='executor' the "
            "server writes its checkpoints from an executor, whose Python reaches files "
            "only. Give a folder that every executor mounts at the same path (a shared "
            "file system; locally any folder), or use parameter_server_location='driver'.")
    path = urlparse(folder).path if scheme == "file" else folder
    return os.path.abspath(path)


# -- on the driver ------------------------------------------------------------------------


def train_on_executor(plan, frame, label_shapes, shuffle):
    """Trains ``plan``'s run with its server in partition 0's task; returns the model
    holding the final center (not compiled).

    Args:
        plan: The `parameter_server.ParameterServerPlan`.
        frame: The training frame.
        label_shapes: As the workers take them.
        shuffle: Whether each epoch reorders the rows.

    Raises:
        ValueError: Too few task slots, or a checkpoint folder the executors cannot reach.
        TrainingError: A worker or the server failed.
    """
    run, settings = plan.run, plan.settings
    num_tasks = plan.num_partitions()
    spark = frame.sparkSession
    check_slots(spark, num_tasks, run.name)
    folder = check_checkpoint_dir(run.checkpoint_dir)
    layout = frame_layout.lay_out(frame, num_tasks, shuffle)
    # Built here for its checks and, at the end, to hold what the job's server reached.
    server = plan.make_server()
    run.server = server
    token = secrets.token_hex(32)
    run.begin_epoch(1)
    worker = plan.make_worker()
    worker_setup.configure_parameter_server_worker(run, worker)
    # The address is each task's, from allGather; the token is the run's own, as for the
    # driver's server.
    worker.spec = worker.spec.replace(token=token)
    make_server = plan.make_server
    options = {"num_tasks": num_tasks, "num_epoch": settings.num_epoch, "name": run.name,
               "checkpoint_dir": folder, "checkpoint_every": run.checkpoint_every,
               "resume": bool(run.resume), "worker_timeout": settings.worker_timeout,
               "epoch_ends": run.validator is not None, "token": token,
               # Names this run's checkpoints (not the token: a secret stays off the disk).
               "run": secrets.token_hex(8)}
    job = hosting_job(worker, _pickled(make_server), options, label_shapes,
                      Replay(settings.num_epoch, shuffle))
    logger.info("%s: the parameter server runs in the task of partition 0; the driver "
                "shows the run once it has ended.", run.label)
    started = time.monotonic()
    try:
        messages = plan.run_workers(
            layout, num_tasks, worker, label_shapes,
            f"distkeras {run.label} ({settings.num_workers} workers, server in the job)",
            plan.new_job_tag(), None, barrier=True, job=job)
    except TrainingError as error:
        raise TrainingError(f"{error} (the parameter server ran in the job; "
                            + (f"its checkpoints are in {folder}: resume=True goes on from "
                               "the last)" if folder else "without checkpoint_dir its "
                               "center is lost)")) from error
    reply = next(message for message in messages if message.get("worker_id") == 0)
    epoch_ends = _take_server_reply(reply, server, run)
    errors = reply.get(_PREFIX + "errors") or []
    if errors:
        raise TrainingError(f"The parameter server failed: {errors[0]}")
    updates_before = int(reply.get(_PREFIX + "updates_before", 0))
    _report(run, server.num_updates - updates_before, time.monotonic() - started)
    _validate_epochs(run, epoch_ends)
    warn_if_nothing_committed(run.name, server.num_updates - updates_before, server, worker,
                              run.history)
    warn_if_trained_short(run.name, worker, run.history, run.progress_total,
                          settings.num_epoch)
    return server.get_model()


def _pickled(make_server):
    """``make_server`` as bytes for the task, which loads it once Keras's backend is set
    (a Keras model loaded first would import Keras on the wrong one). A trainer class of
    the user's own (the escape hatch) travels by value, as its worker does."""
    from pyspark import cloudpickle  # Spark's own: what it ships closures with

    owner = getattr(make_server, "__self__", None)
    module = sys.modules.get(type(owner).__module__) if owner is not None else None
    if module is not None and module.__name__.split(".")[0] not in ("distkeras", "__main__"):
        cloudpickle.register_pickle_by_value(module)
    return cloudpickle.dumps(make_server)


def _take_server_reply(reply, server, run):
    """Puts the job's center, update count, staleness and history into ``server`` and
    ``run``; returns the epochs' ends kept for validation, ``[(center, samples)]``."""
    server.center_variable = weights_array(reply[_PREFIX + "center"])
    server.num_updates = int(reply[_PREFIX + "updates"])
    staleness = reply.get(_PREFIX + "staleness")
    if isinstance(staleness, np.ndarray) and staleness.size:
        server.center.staleness = [tuple(int(value) for value in pair)
                                   for pair in staleness.reshape(-1, 2)]
    records = history_messages.history_records(history_messages.unpack_history(
        {name[len(_PREFIX):]: value for name, value in reply.items()
         if name.startswith(_PREFIX + "history_")}))
    for record in records:
        if "superseded" in record:
            record["superseded"] = bool(record["superseded"])
        if "attempt" in record:
            record["attempt"] = int(record["attempt"])
    server.sink.history = records
    run.history = list(records)
    index = reply.get(_PREFIX + history_messages.INDEX_FIELD)
    states = history_messages.unpack_metric_states(
        {history_messages.INDEX_FIELD: index,
         history_messages.VALUES_FIELD: reply.get(_PREFIX + history_messages.VALUES_FIELD)},
        None) if index else []
    for report, entry in zip(states, index or []):
        report["worker_id"], report["superseded"] = entry["worker_id"], entry["superseded"]
    run.metric_states = states
    samples = reply.get(_PREFIX + "epoch_samples") or []
    return [(weights_array(reply[f"{_PREFIX}epoch_{epoch}"]), count)
            for epoch, count in enumerate(samples, start=1)]


def _report(run, commits, seconds):
    """Writes the line a driver's progress ends with (samples, commits/s, the last steps'
    loss), where ``verbose``: the job's server could not show it while it trained."""
    if not run.verbose:
        return
    records = [record for record in run.history if not record.get("superseded")]
    samples = sum(record.get("batch_size", 0) for record in records)
    done = f"{samples}/{run.progress_total}" if run.progress_total else f"{samples}"
    losses = [record["loss"] for record in records[-50:] if "loss" in record]
    loss = f", loss={sum(losses) / len(losses):.4f}" if losses else ""
    sys.stderr.write(f"{run.label}: {done} samples, {seconds:.0f} s, "
                     f"commits/s={commits / max(seconds, 1e-9):.1f}{loss} (the server ran "
                     "in the job: no live progress)\n")
    sys.stderr.flush()


def _validate_epochs(run, epoch_ends):
    """Runs the driver's end of each epoch but the last (validation, callbacks) on the
    center the server kept as it ended, after the job: nothing can stop the training or
    change its learning rate any more."""
    if run.validator is None:
        return
    for epoch, (weights, samples) in enumerate(epoch_ends, start=1):
        records = [record for record in run.history if record.get("epoch") == epoch - 1
                   and not record.get("superseded")]
        logs = epoch_logs(records, epoch_metrics.of_epoch(run.metric_states, epoch - 1))
        try:
            run.validator.evaluate(list(weights), epoch, samples, logs.pop("loss", None), logs)
            if run.validator.stop_requested:
                logger.warning("%s: a callback asked to stop after epoch %d, which it "
                               "saw once the training had ended (the server ran in the "
                               "job): the workers trained every epoch; the model returned "
                               "holds that epoch's center.", run.label, epoch)
                return
            run.validator.epoch_begin(epoch + 1)
        except Exception as cause:  # the user's callback: say where it failed
            raise TrainingError(f"The end of epoch {epoch} failed (validation or a "
                                f"callback): {type(cause).__name__}: {cause}") from cause


# -- in the Spark task --------------------------------------------------------------------


def hosting_job(worker, server_bytes, options, label_shapes, replay):
    """The function each task of the barrier stage runs: partition 0 starts the server,
    every task learns its address from ``allGather`` and trains its partition; partition
    0's reply carries the server's results.

    Args:
        worker: The worker (its spec holds the token, not yet the address).
        server_bytes: The server's factory, pickled (`_pickled`).
        options: The server's settings (see `train_on_executor`).
        label_shapes: As the workers take them.
        replay: The `epochs.Replay` of every partition.
    """
    def run_partition(record_batches):
        from pyspark import BarrierTaskContext

        context = BarrierTaskContext.get()
        partition = context.partitionId()
        hosted = HostedServer(server_bytes, options, worker.spec, context) \
            if partition == 0 else None
        try:
            address = context.allGather(hosted.address if hosted is not None else "")[0]
            host, port = address.rsplit(":", 1)
            worker.spec = worker.spec.replace(master_host=host, master_port=int(port))
            try:
                message = train_partition(worker, context,
                                          replay.batches(record_batches, partition),
                                          label_shapes)
            except failures.WorkerFailure as error:
                if hosted is not None and hosted.stopped_because:
                    raise TrainingError(f"The parameter server stopped the training: "
                                        f"{hosted.stopped_because}") from error
                raise
            if hosted is not None:
                message = dict(message, **hosted.finish())
        finally:
            if hosted is not None:
                hosted.close()
        yield reply_batch(partition, message)

    return run_partition


class HostedServer:
    """The parameter server in partition 0's task: started, watched, then read out.

    Args:
        server_bytes: The server's factory, pickled on the driver.
        options: The settings `train_on_executor` gives.
        spec: The worker's `TaskSpec` (the backend and custom objects to load with).
        context: The task's ``BarrierTaskContext``.
    """

    WATCH_SECONDS = 0.5

    def __init__(self, server_bytes, options, spec, context):
        import pickle  # the driver's own closure, shipped by Spark with the task

        from distkeras.executor.backend import ensure_backend
        from distkeras.keras_io import custom_objects

        ensure_backend(spec.backend)
        with custom_objects.scope(spec.custom_objects):
            self.server = pickle.loads(server_bytes)()
        self.options = options
        self.stopped_because = None
        self._stopped = False
        self._done = threading.Event()
        server, folder = self.server, options["checkpoint_dir"]
        # A retried stage starts again from the center the failed one last saved.
        if folder is not None and (options["resume"] or self._saved_by_this_run(folder)):
            restore(server, folder, options["name"])
        self.updates_before = server.num_updates
        host = context.getTaskInfos()[context.partitionId()].address.rsplit(":", 1)[0]
        server.transport.host = socket.gethostbyname(host)
        server.transport.token = options["token"]
        server.transport.expect_workers(options["num_tasks"])
        server.sink.on_worker_failure = self._worker_failed
        if options["epoch_ends"]:
            server.sink.track_epochs(options["num_tasks"], options["num_epoch"])
        server.start()
        self.address = f"{server.transport.host}:{server.port}"
        self._watch = threading.Thread(target=self._watch_loop, daemon=True,
                                       name="distkeras-ps-watch")
        self._watch.start()

    def _saved_by_this_run(self, folder):
        """Whether ``folder``'s checkpoint is this run's: an earlier attempt of the stage
        wrote it (Python's task context does not say which attempt this is)."""
        checkpoint = load_checkpoint(folder, self.server.center.weight_spec)
        return checkpoint is not None and checkpoint.get("run") == self.options["run"]

    def _worker_failed(self, worker_id, error):
        """A worker reported an error no retry gets past: keep the center reached."""
        self._checkpoint()

    def _checkpoint(self):
        folder = self.options["checkpoint_dir"]
        if folder is None or self.server.num_updates == self.updates_before:
            return
        try:
            save_checkpoint(folder, self.server, self.options["name"], self.options["run"])
        except Exception as error:  # a full disk must not end the training it protects
            logger.warning("Could not write a checkpoint to %s: %s", folder, error)

    def _watch_loop(self):
        """Saves a checkpoint every ``checkpoint_every`` seconds, and stops the server when
        a worker stalls past ``worker_timeout`` or a handler failed."""
        last = time.monotonic()
        every = self.options["checkpoint_every"]
        while not self._done.wait(self.WATCH_SECONDS):
            reason = self._problem()
            if reason is not None:
                logger.error("Stopping the training: %s", reason)
                self.stopped_because = reason
                self._checkpoint()
                self._stop()
                return
            if self.options["checkpoint_dir"] and time.monotonic() - last >= every:
                self._checkpoint()
                last = time.monotonic()

    def _problem(self):
        """Why the training must stop now, or None."""
        errors = self.server.transport.errors
        if errors:
            return f"the {type(self.server).__name__} failed: {errors[0]}"
        timeout = self.options["worker_timeout"]
        if not timeout:
            return None
        idle = self.server.transport.idle_workers(timeout, startup_limit=float("inf"))
        if idle:
            worker, seconds = idle[0]
            return f"worker {worker} sent nothing for {seconds:.0f} s " \
                   f"(worker_timeout={timeout})"
        startup = max(timeout, TrainingMonitor.STARTUP_TIMEOUT)
        idle = self.server.transport.idle_workers(float("inf"), startup_limit=startup)
        if idle:
            worker, seconds = idle[0]
            return f"worker {worker} sent nothing for {seconds:.0f} s while starting or " \
                   f"compiling a step (allowed: {startup:g} s)"
        return None

    def finish(self):
        """Waits for every worker's goodbye (or its reported error), stops the server and
        returns its part of the reply.

        Raises:
            TrainingError: When the server was stopped (a stall, a handler's error).
        """
        sink, tasks = self.server.sink, range(self.options["num_tasks"])
        while True:
            if self.stopped_because:
                raise TrainingError(f"The parameter server stopped the training: "
                                    f"{self.stopped_because}")
            failed = {worker_id for worker_id, _ in sink.worker_failures}
            if set(tasks) <= sink.finished() | failed:
                break
            time.sleep(0.05)
        self.server.transport.wait_for_goodbyes(timeout=10.0)
        self._stop()
        if self.options["checkpoint_dir"] is not None:
            save_checkpoint(self.options["checkpoint_dir"], self.server, self.options["name"],
                            self.options["run"])
        return self._reply()

    def _reply(self):
        """The server's results as reply fields (arrays where they are numbers)."""
        server = self.server
        reply = {"center": list(server.center_variable), "updates": server.num_updates,
                 "updates_before": self.updates_before,
                 "staleness": np.asarray(getattr(server.center, "staleness", []),
                                         dtype=np.int64).reshape(-1),
                 "errors": list(server.transport.errors)}
        history = server.sink.history_snapshot()
        keys = sorted({key for record in history for key in record})
        columns = {key: [_number(record.get(key)) for record in history] for key in keys}
        reply.update(history_messages.pack_history(columns))
        states = server.sink.metric_states_snapshot()
        if states:
            reply[history_messages.INDEX_FIELD] = [
                {"epoch": report["epoch"], "name": report["name"], "spec": report["spec"],
                 "shapes": [list(np.shape(value)) for value in report["state"]],
                 "worker_id": report["worker_id"],
                 "superseded": bool(report.get("superseded"))} for report in states]
            reply[history_messages.VALUES_FIELD] = np.concatenate(
                [np.asarray(value, dtype=np.float64).reshape(-1)
                 for report in states for value in report["state"]] or [np.zeros(0)])
        if self.options["epoch_ends"]:
            samples = []
            for epoch in range(1, self.options["num_epoch"]):
                end = server.sink.epoch_end(epoch)
                if end is None:
                    break
                reply[f"epoch_{epoch}"] = list(end[0])
                samples.append(int(end[1]))
            reply["epoch_samples"] = samples
        return {_PREFIX + name: value for name, value in reply.items()}

    def _stop(self):
        if not self._stopped:
            self._stopped = True
            self.server.stop()

    def close(self):
        """Stops the watch and the server (also after an error): Spark may reuse this
        Python process for other tasks."""
        self._done.set()
        if not self._stopped:
            self._checkpoint()
        self._stop()


def _number(value):
    """A history value as the columns carry it (booleans as 0 and 1)."""
    return int(value) if isinstance(value, bool) else value
