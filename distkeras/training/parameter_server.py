"""The parameter-server plan: workers train asynchronously against a server on the driver
(or, with ``parameter_server_location="executor"``, in the Spark job: `server_placement`).

One Spark job of ``num_workers * parallelism_factor`` tasks, each replaying its partition
for every epoch, exchanging with the parameter server the plan makes (its factory is the
trainer's `allocate_parameter_server`) while a `TrainingMonitor` draws the progress, ends
the epochs (validation, callbacks), saves checkpoints and stops workers that stall.
"""

import logging

from distkeras.data import frame_layout
from distkeras.errors import TrainingError
from distkeras.executor.epochs import Replay
from distkeras.training import launch
from distkeras.training import worker_setup
from distkeras.training.checkpoints import restore, save_checkpoint
from distkeras.training.monitor import TrainingMonitor
from distkeras.training.plans import Plan
from distkeras.training.server_placement import resolve_location, train_on_executor
from distkeras.training.serving import serving
from distkeras.training.shortfalls import warn_if_nothing_committed, warn_if_trained_short
from distkeras.training.spark_jobs import driver_address, warn_if_speculative
from distkeras.transport import parameter_servers

logger = logging.getLogger(__name__)


class ParameterServerPlan(Plan):
    """Asynchronous workers against a parameter server, in one Spark job.

    Args:
        run: The `run.Run` to train.
        make_worker: Returns the worker every task runs (the trainer's
            ``allocate_worker``).
        make_server: Returns the parameter server (the trainer's
            ``allocate_parameter_server``).
    """

    follows_learning_rate_callbacks = True
    keeps_center = True

    def __init__(self, run, make_worker, make_server):
        super().__init__(run, make_worker)
        self.make_server = make_server
        # With the server in the Spark job, the epochs' ends run on the driver after the
        # training (`server_placement`): no callback's learning rate reaches the workers.
        self.location = resolve_location(
            getattr(self.settings, "parameter_server_location", None))
        self.follows_learning_rate_callbacks = self.location == "driver"

    def num_partitions(self):
        return self.settings.num_workers * self.settings.parallelism_factor

    def train(self, frame, label_shapes, shuffle):
        if resolve_location(getattr(self.settings, "parameter_server_location", None),
                            frame) == "executor":
            if getattr(self.settings, "num_server_shards", 1) > 1:
                raise ValueError(
                    "num_server_shards > 1 serves the shards on the driver, which this "
                    "client's executors cannot reach (Spark Connect puts the server in the "
                    "Spark job): use num_server_shards=1, or train from a classic "
                    "SparkSession to keep the shards.")
            return train_on_executor(self, frame, label_shapes, shuffle)
        run, settings = self.run, self.settings
        spark = frame.sparkSession
        launch.check_client_serves(spark, run.name, settings)
        warn_if_speculative(spark, run.name)
        layout = frame_layout.lay_out(frame, self.num_partitions(), shuffle)
        server = self.make_server()
        run.worker_host = driver_address(spark)
        run.server = server
        if run.resume:
            restore(server, run.checkpoint_dir, run.name)
        job_tag = self.new_job_tag()
        run.begin_epoch(1)  # the monitor begins the later ones as the epochs end
        self.hand_learning_rate_to(server)
        updates_before = server.num_updates  # a resumed run starts from the checkpoint's
        # A handler's errors (the built-in servers' transport keeps them).
        errors = getattr(getattr(server, "transport", None), "errors", None)
        worker = None
        stopped_early = True  # until the workers' job has ended as it should
        served = None
        try:
            with serving(server, run, spark, job_tag, self.num_partitions(),
                         lambda server: self.monitor(server, spark, job_tag),
                         cancel_on_error=True) as served:
                worker = self.make_worker()
                worker_setup.configure_parameter_server_worker(run, worker)
                self.run_workers(layout, self.num_partitions(), worker, label_shapes,
                                 f"distkeras {run.label} ({settings.num_workers} workers)",
                                 job_tag, Replay(settings.num_epoch, shuffle))
            stopped_early = False
        except TrainingError as error:
            monitor = served.monitor if served is not None else None
            if errors:
                # The workers' errors (a closed connection) only echo the server's.
                raise TrainingError(
                    f"The {type(server).__name__} failed: {errors[0]}") from error
            if monitor is not None and monitor.stalled:
                raise TrainingError(f"Training stopped: {monitor.stalled}.") from error
            if monitor is None or not (monitor.stopped_by_callback or
                                       monitor.end_of_epoch_error):
                raise
            # The monitor stopped the workers at an epoch's end: a callback asked to
            # (EarlyStopping; the center is the result) or one failed (raised below).
            stopped_early = bool(monitor.end_of_epoch_error)
        finally:
            if stopped_early:
                self.checkpoint_stopped_training(server, updates_before)
        monitor = served.monitor
        if monitor is not None and monitor.end_of_epoch_error:
            epoch, cause = monitor.end_of_epoch_error
            if not isinstance(cause, Exception):
                raise cause  # a callback's KeyboardInterrupt or SystemExit, as fit raises it
            raise TrainingError(f"The end of epoch {epoch} failed (validation or a callback): "
                                f"{type(cause).__name__}: {cause}") from cause
        if errors:
            raise TrainingError(f"The parameter server failed: {errors[0]}")
        if run.checkpoint_dir is not None:
            save_checkpoint(run.checkpoint_dir, server, run.name)
        warn_if_nothing_committed(run.name, server.num_updates - updates_before,
                                  server, worker, run.history)
        if monitor is None or not monitor.stopped_by_callback:
            warn_if_trained_short(run.name, worker, run.history,
                                  run.progress_total, settings.num_epoch)
        return server.get_model()

    def monitor(self, server, spark, job_tag):
        """The run's `TrainingMonitor` of ``server`` (a socket parameter server)."""
        run, settings = self.run, self.settings
        return TrainingMonitor(server, spark, job_tag, run.progress_total,
                               run.verbose, settings.worker_timeout,
                               run.name, run.checkpoint_dir,
                               run.checkpoint_every, validator=run.validator,
                               num_epoch=settings.num_epoch, num_tasks=self.num_partitions(),
                               label=run.label,
                               interval=worker_setup.VALIDATING_REPORT_SECONDS
                               if run.validator is not None else 0.5)

    def hand_learning_rate_to(self, server):
        """Lets ``server`` send the workers the learning rate that the callbacks set (the
        monitor updates it at each epoch's end), when a callback sets one.

        Raises:
            ValueError: When the server's pull replies are its own, so the rate would
                never reach the workers.
        """
        rate = self.run.learning_rate_of_callbacks()
        if rate is None:
            return
        pulls = ("handle_pull", "handle_pull_unless_own")
        if not isinstance(server, parameter_servers.SocketParameterServer) or any(
                getattr(type(server), name) is not getattr(
                    parameter_servers.SocketParameterServer, name) for name in pulls):
            raise ValueError(
                f"{type(server).__name__} answers pulls with a handle_pull of its own, so "
                "the learning rate that ReduceLROnPlateau or LearningRateScheduler sets "
                "cannot reach the workers. Use a learning rate schedule in "
                "`worker_optimizer` (keras.optimizers.schedules) instead.")
        server.center.optimizer_learning_rate = rate

    def checkpoint_stopped_training(self, server, updates_before):
        """Saves the center that a training stopped early (a worker's error, a stall, a
        callback's error, Ctrl-C) had reached, when it has a ``checkpoint_dir``:
        ``resume=True`` then goes on from there, not from the last periodic checkpoint (or,
        before the first, from the model's weights).

        Args:
            server: The stopped parameter server.
            updates_before: Its update count when this run started (nothing new to save
                when it has not moved).
        """
        folder = self.run.checkpoint_dir
        if folder is None or server.num_updates == updates_before:
            return
        try:
            updates = save_checkpoint(folder, server, self.run.name)
        except Exception as error:  # the training's own error is the one to raise
            logger.warning("Could not write the last checkpoint to %s: %s", folder, error)
            return
        logger.warning("The training stopped early; its center after %d updates is saved in "
                       "%s: train(..., checkpoint_dir=..., resume=True) goes on from it.",
                       updates, folder)
