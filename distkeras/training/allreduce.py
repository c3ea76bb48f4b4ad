"""AllReduceTrainer and its plan: synchronous data parallelism in one Spark barrier stage.

``num_workers`` tasks start together; each trains its partition in a child process of a
JAX distributed job (`executor.allreduce`), where every step's gradients are averaged over
the workers before the optimizer applies them: the replicas hold the same weights after
every step, as one process taking the global batch (``num_workers * batch_size`` rows)
would. Without validation data, callbacks or a ``checkpoint_dir`` every epoch runs in one
job; with them, each epoch is a job of its own, going on from the last one's weights and
optimizer state, and the driver validates, calls back and writes a checkpoint between
two (which ``resume`` goes on after). See docs/allreduce.md.
"""

import logging

import numpy as np

from distkeras.algorithms.arguments import check_int
from distkeras.data import frame_layout
from distkeras.data import parquet_source
from distkeras.data import storage
from distkeras.errors import TrainingError
from distkeras.session import concurrent_task_slots
from distkeras.executor.allreduce import AllReduceWorker
from distkeras.executor.epochs import Replay
from distkeras.keras_io import model_state
from distkeras.keras_io.archives import deserialize_model, serialize_model
from distkeras.training.asynchronous import DistributedTrainer
from distkeras.training.checkpoints import (checkpoint_path, load_epoch_checkpoint,
                                            save_epoch_checkpoint)
from distkeras.training.plans import Plan
from distkeras.transport.history_messages import (history_records, unpack_history,
                                                  unpack_metric_states)

logger = logging.getLogger(__name__)


def check_slots(spark, num_workers):
    """Refuses a barrier stage of ``num_workers`` tasks that Spark cannot run at once.

    Raises:
        ValueError: Naming the slots needed and those the application has.
    """
    slots = concurrent_task_slots(spark)
    if slots is not None and slots < num_workers:
        raise ValueError(
            f"AllReduceTrainer runs its {num_workers} workers as one barrier stage, which "
            f"needs {num_workers} task slots at once; this Spark application has {slots}. "
            f"Use num_workers={slots} or fewer, or give the application more executor "
            "cores (spark.executor.cores, spark.cores.max, local[N]).")


def check_backend(backend):
    """Refuses a Keras backend the all-reduce does not run on.

    Raises:
        ValueError: Naming the backend, and what to use instead.
    """
    if backend != "jax":
        raise ValueError(
            f"AllReduceTrainer runs on the JAX backend only (jax.distributed over gloo on "
            f"CPUs); this session's Keras backend is {backend!r}. Set KERAS_BACKEND=jax "
            "before Keras is imported, or use AveragingTrainer or a parameter-server "
            "trainer, which run on every backend.")


class AllReducePlan(Plan):
    """``num_workers`` replicas stepping together in one barrier stage (a job per epoch
    when the driver validates or calls back between epochs)."""

    follows_learning_rate_callbacks = True
    checkpoints_epochs = True
    steps_before = 0  # the steps of the checkpoint a resumed run goes on from

    def train(self, frame, label_shapes, shuffle):
        run, settings = self.run, self.settings
        check_slots(frame.sparkSession, settings.num_workers)
        model = deserialize_model(serialize_model(settings.master_model))
        if run.checkpoint_dir is not None:
            storage.check_writable(checkpoint_path(run.checkpoint_dir))
        done = self.restore(model) if run.resume else 0
        if run.validator is None and run.checkpoint_dir is None:
            layout = self.barrier_layout(frame, shuffle, seed=None)
            message = self.run_job(layout, model, label_shapes,
                                   Replay(settings.num_epoch, shuffle), run.label,
                                   run.progress_total)
            model.set_weights(list(message["weights"]))
            return model
        with frame_layout.kept_for_epochs(frame, settings.num_epoch - done):
            return self.train_epoch_by_epoch(model, frame, label_shapes, shuffle, done)

    def restore(self, model):
        """Puts the checkpoint in the run's ``checkpoint_dir`` into ``model`` (its weights)
        and the run (its optimizer state); returns the epochs it had done (0 without one,
        with a warning).

        Raises:
            ValueError: The checkpoint does not fit the model, or is damaged.
        """
        run = self.run
        checkpoint = load_epoch_checkpoint(
            run.checkpoint_dir, [(weight.shape, weight.dtype) for weight in
                                 model.get_weights()], run.name)
        if checkpoint is None:
            logger.warning("No checkpoint in %s: starting from the model's weights.",
                           run.checkpoint_dir)
            return 0
        weights, optimizer_state, done, self.steps_before = checkpoint
        model.set_weights(weights)
        if optimizer_state is not None:
            # Tried on the driver: a state of another optimizer fails here, not in the job.
            try:
                model_state.set_optimizer_state(
                    self.compile(deserialize_model(serialize_model(model))), optimizer_state)
            except ValueError as error:
                raise ValueError(
                    f"The checkpoint in {run.checkpoint_dir} holds the state of another "
                    f"optimizer than worker_optimizer's ({error}). Resume with the optimizer "
                    "that wrote it, or delete the checkpoint to start afresh.") from error
            run.optimizer_state = optimizer_state
        if done >= self.settings.num_epoch:
            logger.warning("%s: the checkpoint in %s is after epoch %d of %d: nothing is "
                           "left to train; the model is the checkpoint's. Pass a larger "
                           "num_epoch to train on.", run.label, run.checkpoint_dir, done,
                           self.settings.num_epoch)
        else:
            logger.info("%s: resuming after epoch %d of %d from %s.", run.label, done,
                        self.settings.num_epoch, run.checkpoint_dir)
        return done

    def barrier_layout(self, frame, shuffle, seed):
        """``frame`` laid out as one partition per worker, as a barrier stage takes it.

        Raises:
            ValueError: The DataFrame's partitions cannot run as a barrier stage.
        """
        count = self.settings.num_workers
        layout = frame_layout.lay_out(frame, count, shuffle, seed=seed)
        if shuffle or isinstance(layout, parquet_source.ParquetSource) or \
                (layout is not frame and count > 1) or \
                (layout is frame and frame_layout.barrier_compatible(layout, count)):
            return layout
        raise ValueError(
            "AllReduceTrainer: the DataFrame's partitions cannot run as one barrier stage "
            "(a coalesce() or union() upstream). Pass train(df, shuffle=True), or "
            f"df.repartition({count}) first.")

    def run_job(self, layout, model, label_shapes, replay, description, samples):
        """Runs one barrier job of the workers from ``model``'s weights (and the run's
        optimizer state, if any) over ``replay``; adds its steps to the history, keeps
        its optimizer state and returns worker 0's message.

        Raises:
            TrainingError: The replicas ended with different weights.
        """
        run, settings = self.run, self.settings
        worker = self.make_worker()
        worker.spec = worker.spec.replace(model_bytes=serialize_model(model),
                                          optimizer_state=run.optimizer_state)
        self.configure_worker(worker)
        check_backend(worker.spec.backend)
        worker.spec = worker.spec.replace(return_optimizer_state=True)
        worker.num_epoch_in_job, worker.shuffle = replay.num_epoch, replay.shuffle
        worker.shuffle_seed = replay.seed
        worker.iteration = 1 + max((record["iteration"] for record in run.history
                                    if not record.get("superseded")), default=0)
        count = settings.num_workers
        job_tag = self.new_job_tag()
        with self.progress(layout.sparkSession, worker, samples, description, job_tag,
                           count) as reported:
            # Each task replays its own epochs in its child: Spark feeds it once.
            messages = self.run_workers(
                layout, count, worker, label_shapes,
                f"distkeras {description} ({count} workers, all-reduce)", job_tag,
                barrier=True)
        run.history.extend(reported)
        messages.sort(key=lambda message: message["worker_id"])
        for message in messages:
            run.history.extend(history_records(unpack_history(message)))
            run.metric_states.extend(unpack_metric_states(message, message["worker_id"]))
        first = messages[0]
        counts = first.get("partition_rows") or []
        if counts and max(counts) > min(counts):
            logger.warning(
                "%s: uneven partitions (rows: %s); every worker trains on the smallest's "
                "%d rows per epoch, leaving %d rows out. Repartition the DataFrame evenly "
                "(df.repartition(%d)), or pass train(df, shuffle=True).", run.label,
                counts, min(counts), sum(counts) - len(counts) * min(counts), count)
        for message in messages[1:]:
            if not all(np.array_equal(a, b) for a, b in zip(first["weights"],
                                                             message["weights"])):
                raise TrainingError(
                    f"AllReduceTrainer: worker {message['worker_id']} ended with weights "
                    "other than worker 0's; the all-reduce did not keep the replicas "
                    "together.")
        logger.info("%s: the workers' processes took %s seconds to start and %s to train "
                    "(first step's compile included).", run.label,
                    ", ".join(f"{message.get('start_seconds', 0):.1f}" for message in messages),
                    ", ".join(f"{message.get('train_seconds', 0):.1f}" for message in messages))
        if first.get("optimizer_state") is not None:
            run.optimizer_state = list(first["optimizer_state"])
        return first

    def train_epoch_by_epoch(self, model, frame, label_shapes, shuffle, done=0):
        """One barrier job per epoch after the first ``done``, each from the last one's
        weights and optimizer state (held by the validator's model, which callbacks see
        and may change, when there is one), with a checkpoint after each when the run
        has a ``checkpoint_dir``."""
        run, num_epoch = self.run, self.settings.num_epoch
        driver_model = run.validator.model if run.validator is not None else None
        if driver_model is not None:
            if not driver_model.optimizer.built:
                driver_model.optimizer.build(driver_model.trainable_variables)
            if run.optimizer_state is not None:  # a checkpoint's
                model_state.set_optimizer_state(driver_model, run.optimizer_state)
        for epoch in range(done + 1, num_epoch + 1):
            run.begin_epoch(epoch)
            if driver_model is not None:
                run.optimizer_state = model_state.get_optimizer_state(driver_model)
            steps_before, states_before = len(run.history), len(run.metric_states)
            layout = self.barrier_layout(frame, shuffle, seed=epoch if shuffle else None)
            message = self.run_job(
                layout, model, label_shapes, Replay(1), f"{run.label} epoch {epoch}/"
                f"{num_epoch}", run.progress_total // num_epoch if run.progress_total
                else None)
            model.set_weights(list(message["weights"]))
            if driver_model is not None:
                model_state.set_optimizer_state(driver_model, run.optimizer_state)
            epoch_records = run.history[steps_before:]
            for record in epoch_records + run.metric_states[states_before:]:
                record["epoch"] = epoch - 1
            if run.checkpoint_dir is not None:
                self.save(model, epoch)
            if epoch < num_epoch and run.validate_epoch(model.get_weights(), epoch,
                                                        epoch_records):
                break
        return model

    def save(self, model, epoch):
        """Writes the checkpoint of ``model`` after ``epoch`` (its weights, the run's
        optimizer state, the steps taken)."""
        run = self.run
        steps = self.steps_before + sum(
            1 for record in run.history
            if record["worker_id"] == 0 and not record.get("superseded"))
        save_epoch_checkpoint(run.checkpoint_dir, model.get_weights(), run.optimizer_state,
                              epoch, steps, run.name)
        logger.info("%s: checkpoint after epoch %d (%d steps) in %s", run.label, epoch,
                    steps, run.checkpoint_dir)

    def compile(self, model):
        """The returned model's optimizer holds the trained one's state, as after `fit`."""
        model = super().compile(model)
        if self.run.optimizer_state is not None:
            try:
                model_state.set_optimizer_state(model, self.run.optimizer_state)
            except ValueError as error:
                logger.warning("The returned model's optimizer starts afresh: %s", error)
        return model


class AllReduceTrainer(DistributedTrainer):
    """Synchronous data parallelism: every step's gradients averaged over all workers.

    ``num_workers`` Spark tasks run together in one barrier stage, each on its own
    partition; each step the workers' minibatches form one global batch of
    ``num_workers * batch_size`` rows, and every replica holds the same weights after
    every step. Positional arguments come in `AveragingTrainer`'s order.

    Takes `Trainer`'s arguments as well; the ones below are its own.

    Args:
        num_workers: Workers (barrier tasks): Spark must have that many task slots free.
        collective_timeout: Seconds the workers wait for a missing one (at the start,
            and between two heartbeats of a running one) before the stage fails.

    Notes:
        JAX backend only. Every worker takes as many steps per epoch as the smallest
        partition allows (the rows beyond are left out). BatchNormalization's statistics
        are those of the global batch (synchronized). ``train(checkpoint_dir=...)``
        saves the model and its optimizer state after each epoch, and ``resume=True``
        runs the epochs after the last saved. See docs/allreduce.md.
    """

    exchanges_weights = False  # one model, as fit's: its moving averages are its own
    plan = AllReducePlan

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 features_col="features", label_col="label", num_epoch=1, batch_size=32,
                 num_workers=2, loss_weights=None, collective_timeout=120):
        super().__init__(keras_model, worker_optimizer, loss, metrics,
                         num_workers=num_workers, batch_size=batch_size,
                         features_col=features_col, label_col=label_col,
                         num_epoch=num_epoch, loss_weights=loss_weights)
        self.collective_timeout = collective_timeout

    def get_config(self):
        config = super().get_config()
        config.pop("parallelism_factor")
        config.update(collective_timeout=self.collective_timeout)
        return config

    def check_settings(self, settings):
        check_int("collective_timeout", settings.collective_timeout)
        return super().check_settings(settings)

    def make_plan(self, run):
        return self.plan(run, self.allocate_worker)

    def allocate_worker(self):
        return AllReduceWorker(self.master_model, collective_timeout=self.collective_timeout)
