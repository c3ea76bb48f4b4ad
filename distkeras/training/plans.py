"""Execution plans: how one run trains, in Spark jobs and servers on the driver.

A trainer class names its plan (``Trainer.plan``) and makes one per run
(`Trainer.make_plan`), giving it the parts it needs: a worker factory (and, for a
parameter server, a server factory). A plan never calls back into the trainer. It
declares what it can do as class attributes, which the driver reads instead of testing
the trainer's class:

- ``follows_learning_rate_callbacks``: a learning rate that ``ReduceLROnPlateau`` or
  ``LearningRateScheduler`` sets reaches the workers (for the next epoch).
- ``watches_one_model``: the run trains one model, which callbacks can watch.
- ``keeps_center``: the run keeps a center variable that ``checkpoint_dir`` saves.
- ``checkpoints_epochs``: ``checkpoint_dir`` saves the one model after each epoch, and
  ``resume`` goes on after the last epoch saved.

The plans: `one_task.OneTaskPlan` (SingleTrainer: one task, or a task per epoch),
`averaging.AveragingPlan` (an epoch barrier in one job, or a job per epoch),
`ensemble.EnsemblePlan` (one job of independent members),
`parameter_server.ParameterServerPlan` (a parameter-server job) and
`allreduce.AllReducePlan` (a barrier stage whose steps all-reduce, or one per epoch).
"""

import contextlib

from distkeras.errors import TrainingError
from distkeras.training import launch
from distkeras.training import worker_setup
from distkeras.training.monitor import TrainingMonitor
from distkeras.training.serving import serving
from distkeras.training.spark_jobs import driver_address
from distkeras.transport import parameter_servers


class Plan:
    """The base of every plan: the steps that several plans share.

    Args:
        run: The `run.Run` to train.
        make_worker: Returns a new worker for the run's tasks (the trainer's
            ``allocate_worker``).
    """

    follows_learning_rate_callbacks = False
    watches_one_model = True
    keeps_center = False
    checkpoints_epochs = False

    def __init__(self, run, make_worker=None):
        self.run = run
        self.settings = run.settings
        self.make_worker = make_worker

    def train(self, frame, label_shapes, shuffle):
        """Trains on ``frame`` (laid out by the plan); returns the model(s), not compiled."""
        raise NotImplementedError

    def samples_for_progress(self, frame):
        """Samples the progress bar counts to; None where a plan shows no bar."""
        return frame.count() * self.settings.num_epoch

    def compile(self, model):
        """Compiles the returned model (each of a list) as `worker_setup.compile_returned`."""
        return worker_setup.compile_returned(self.run.workers_optimizer, self.settings, model)

    def finalize_weights(self, model):
        """Gives the returned ``model`` the weights `fit` ends with, from its optimizer's
        state; returns whether it changed them (never here: the optimizer of the
        distributed trainers' model is fresh)."""
        return False

    # -- shared steps -------------------------------------------------------------------

    def new_job_tag(self):
        """A Spark job tag of the run's own (`launch.new_job_tag`)."""
        return launch.new_job_tag(self.run)

    def slots_for_one_job(self, frame, num_tasks):
        """Whether one Spark job can hold ``num_tasks`` tasks waiting at epoch ends
        (`launch.slots_for_one_job`)."""
        return launch.slots_for_one_job(self.run, frame, num_tasks)

    def run_workers(self, *args, **kwargs):
        """`launch.run_workers`."""
        return launch.run_workers(*args, **kwargs)

    def configure_worker(self, worker):
        """`worker_setup.configure_worker` for this run."""
        worker_setup.configure_worker(self.run, worker)

    @contextlib.contextmanager
    def progress(self, spark, worker, samples, description, job_tag, num_tasks=1):
        """A `HistoryServer` the sequential workers (no parameter server) report their
        steps to, with ``verbose`` and a `TrainingMonitor` drawing them, and for
        ``num_tasks`` of them (EnsembleTrainer's members, AveragingTrainer's replicas of
        an epoch) whatever the verbosity: a worker that meets rows no retry can train on
        tells it, and the driver stops the others at once, as the parameter-server
        trainers' do, rather than let them train to their end before the error. Yields
        the list the reported steps end up in. Under Spark Connect, none of it (see
        `launch.client_serves`).

        Raises:
            TrainingError: Naming the partition whose worker reported its failure.
        """
        run = self.run
        progress = bool(run.verbose and samples)
        if (not progress and num_tasks < 2) or not launch.client_serves(spark):
            # Under Spark Connect the executors cannot be counted on to reach this
            # process: no server, the workers' steps come back with their results.
            yield []
            return

        def monitor(server):
            return TrainingMonitor(server, spark, job_tag, samples,
                                   run.verbose, name=description,
                                   validation_records=run.validation_records()) \
                if progress else None

        server = parameter_servers.HistoryServer(self.settings.master_model)
        with serving(server, run, spark, job_tag, num_tasks, monitor,
                     collect_into_run=False) as served:
            worker.spec = worker.spec.replace(progress_address=served.address,
                                              token=server.token)
            yield served.history

    def run_epoch_server(self, server, worker, layout, num_tasks, label_shapes,
                         description, replay, failures, barrier=False):
        """Runs every epoch in one Spark job whose workers meet ``server`` (an
        `AveragingServer` or `EpochServer`) at each epoch's end (the first epoch begun by
        the caller); the history ends up in the run's.

        Raises:
            TrainingError: A worker's error, the driver's end of an epoch (kept in
                ``failures``) or the server's.
        """
        run = self.run
        spark = layout.sparkSession
        run.server = server
        self.configure_worker(worker)
        job_tag = self.new_job_tag()

        def monitor(server):
            return TrainingMonitor(server, spark, job_tag, run.progress_total,
                                   run.verbose, name=run.label,
                                   validation_records=run.validation_records())

        with serving(server, run, spark, job_tag, num_tasks, monitor):
            worker.spec = worker.spec.replace(master_host=driver_address(spark),
                                              master_port=server.port, token=server.token)
            self.run_workers(layout, num_tasks, worker, label_shapes, description,
                             job_tag, replay, barrier=barrier)
        if failures:
            raise failures[0]
        if server.transport.errors:
            raise TrainingError(f"The {type(server).__name__} failed: "
                                f"{server.transport.errors[0]}")
