"""AveragingTrainer's plan: each epoch, one replica per partition, then the weights' mean.

With several epochs and a slot for every worker, every epoch runs in one Spark job (a
barrier stage) whose workers meet at each epoch's end on the driver's `AveragingServer`;
otherwise each epoch is a Spark job of its own and the driver averages the results.
"""

import logging

from distkeras.algorithms import update_rules
from distkeras.data import frame_layout
from distkeras.data import parquet_source
from distkeras.executor.epochs import Replay
from distkeras.keras_io.archives import deserialize_model, serialize_model
from distkeras.keras_io.compile_config import optimizer_config
from distkeras.training.plans import Plan
from distkeras.transport import epoch_servers
from distkeras.transport.history_messages import (history_records, unpack_history,
                                                  unpack_metric_states)
from distkeras.transport.networking import weights_array

logger = logging.getLogger(__name__)


def next_iterations(records):
    """``{worker_id: the iteration after its last}`` over step records (those of a failed
    task that Spark's retry trained again, ``superseded``, left out)."""
    last = {}
    for record in records:
        if not record.get("superseded"):
            worker = record["worker_id"]
            last[worker] = max(last.get(worker, 0), int(record["iteration"]))
    return {worker: iteration + 1 for worker, iteration in last.items()}


class AveragingPlan(Plan):
    """Model averaging, in one barrier job or a job per epoch.

    Args:
        run: The `run.Run` to train.
        make_worker: ``make_worker(model)``: the worker of one epoch's job.
        make_averaging_worker: The worker of the one job that runs every epoch.
    """

    follows_learning_rate_callbacks = True

    def __init__(self, run, make_worker, make_averaging_worker):
        super().__init__(run, make_worker)
        self.make_averaging_worker = make_averaging_worker

    def num_partitions(self):
        return self.settings.num_workers * self.settings.parallelism_factor

    def train(self, frame, label_shapes, shuffle):
        if self.settings.num_epoch > 1 and self.slots_for_one_job(frame,
                                                                  self.num_partitions()):
            layout = frame_layout.lay_out(frame, self.num_partitions(), shuffle)
            if self.runs_as_barrier_stage(frame, layout, shuffle):
                return self.train_in_one_job(layout, label_shapes, shuffle)
            logger.info("AveragingTrainer: the DataFrame's partitions cannot run as one "
                        "barrier stage (coalesce() or union() before the training): one "
                        "Spark job per epoch.")
        with frame_layout.kept_for_epochs(frame, self.settings.num_epoch):
            return self.train_epoch_by_epoch(frame, label_shapes, shuffle)

    def runs_as_barrier_stage(self, frame, layout, shuffle):
        """Whether Spark accepts ``layout`` (`frame_layout.lay_out` of ``frame``) as the
        input of a barrier stage. It refuses a stage whose RDDs do not all have the
        stage's number of partitions (a ``coalesce``, a ``union``), and the refusal
        stops the whole SparkContext (Spark 4)."""
        if shuffle or isinstance(layout, parquet_source.ParquetSource) or \
                (layout is not frame and self.num_partitions() > 1):
            return True  # laid out by a shuffle of its own, or read over spark.range
        if layout is not frame:
            return False  # coalesce(1)
        return frame_layout.barrier_compatible(layout, self.num_partitions())

    def train_in_one_job(self, layout, label_shapes, shuffle):
        run, settings = self.run, self.settings

        def end_epoch(epoch, center):
            """The driver's end of ``epoch`` (1-based); returns whether to stop."""
            stop = run.end_epoch_in_job(server, epoch, center, failures)
            server.barrier.learning_rate = run.learning_rate_of_callbacks()
            return stop

        failures = []
        run.begin_epoch(1)
        server = epoch_servers.AveragingServer(settings.master_model,
                                                   self.num_partitions(), on_average=end_epoch)
        server.barrier.learning_rate = run.learning_rate_of_callbacks()
        self.run_epoch_server(
            server, self.make_averaging_worker(), layout, self.num_partitions(),
            label_shapes, f"distkeras {run.label} ({settings.num_workers} workers, "
            f"{settings.num_epoch} epochs)", Replay(settings.num_epoch, shuffle), failures,
            barrier=True)
        return server.get_model()

    def train_epoch_by_epoch(self, frame, label_shapes, shuffle):
        run, settings = self.run, self.settings
        model = deserialize_model(serialize_model(settings.master_model))
        for epoch in range(settings.num_epoch):
            run.begin_epoch(epoch + 1)
            layout = frame_layout.lay_out(frame, self.num_partitions(), shuffle,
                                          seed=None if not shuffle else epoch)
            worker = self.make_worker(model)
            self.configure_worker(worker)
            self.run_epoch_job(model, worker, layout, frame, label_shapes, epoch)
            # The last epoch: the returned model, at the end.
            if epoch + 1 < settings.num_epoch and run.validate_epoch(
                    model.get_weights(), epoch + 1,
                    [record for record in run.history if record.get("epoch") == epoch]):
                break
        return model

    def run_epoch_job(self, model, worker, layout, frame, label_shapes, epoch):
        """Runs ``epoch`` (0-based) as one Spark job of configured ``worker``s and sets
        ``model``'s weights to their mean; adds the epoch's records to the run's."""
        run, settings = self.run, self.settings
        if run.learning_rate_of_callbacks() is not None:
            # The driver's optimizer: the worker's config, at the rate a callback set.
            worker.spec = worker.spec.replace(optimizer=optimizer_config(
                run.validator.model.optimizer, run.validator.model))
        # Each worker's steps count on from its own last epoch's, as in the one-job
        # path (from the largest of all, the smaller partition's left gaps).
        worker.spec = worker.spec.replace(first_iterations=next_iterations(run.history))
        description = f"{run.label} epoch {epoch + 1}/{settings.num_epoch}"
        job_tag = self.new_job_tag()
        samples = run.progress_total // settings.num_epoch if run.progress_total else None
        states_before = len(run.metric_states)
        with self.progress(frame.sparkSession, worker, samples, description,
                           job_tag, self.num_partitions()) as epoch_records:
            messages = self.run_workers(layout, self.num_partitions(), worker,
                                        label_shapes, f"distkeras {description}", job_tag)
        # A replica whose partition was empty trained on nothing: it would pull the
        # average back to the epoch's starting weights.
        trained = [message for message in messages if message.get("samples") != 0]
        if trained:
            model.set_weights(list(update_rules.average_weights(
                weights_array(message["weights"]) for message in trained)))
        epoch_records.extend(
            record for message in messages for record in
            history_records(unpack_history(message)))
        for message in messages:
            run.metric_states.extend(unpack_metric_states(message, message["worker_id"]))
        for record in epoch_records + run.metric_states[states_before:]:
            record["epoch"] = epoch
        run.history.extend(epoch_records)
