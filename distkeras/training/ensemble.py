"""EnsembleTrainer's plan: independent members, one per partition, in one Spark job."""

import logging

from distkeras.data import frame_layout
from distkeras.executor.epochs import Replay
from distkeras.keras_io.archives import deserialize_model, serialize_model
from distkeras.training.plans import Plan
from distkeras.transport.history_messages import history_records, unpack_history

logger = logging.getLogger(__name__)


class EnsemblePlan(Plan):
    """``num_ensembles`` models trained apart; the run returns their list."""

    watches_one_model = False  # each member is its own model: no callbacks

    def train(self, frame, label_shapes, shuffle):
        run, settings = self.run, self.settings
        count = settings.num_ensembles
        layout = frame_layout.lay_out(frame, count, shuffle, seed=settings.seed)
        worker = self.make_worker()
        self.configure_worker(worker)
        description = f"{run.label} ({count} models)"
        job_tag = self.new_job_tag()
        # One bar for all members: together they step through every row num_epoch times.
        reported = []
        try:
            with self.progress(frame.sparkSession, worker, run.progress_total,
                               description, job_tag, count) as reported:
                messages = self.run_workers(
                    layout, count, worker, label_shapes, f"distkeras {description}",
                    job_tag, Replay(settings.num_epoch, shuffle, settings.seed))
        finally:
            run.history.extend(reported)  # what was trained, even when it failed
        models = []
        for message in sorted(messages, key=lambda m: m["worker_id"]):
            run.history.extend(
                history_records(unpack_history(message)))
            member = deserialize_model(serialize_model(settings.master_model))
            member.set_weights(list(message["weights"]))
            models.append(member)
        trained = {record["worker_id"] for record in run.history}
        untrained = [index for index in range(len(models)) if index not in trained]
        if untrained:
            logger.warning(
                "EnsembleTrainer: member(s) %s had no rows (their partitions were empty) "
                "and are returned untrained, with their initial weights. Use fewer "
                "num_ensembles, or more rows.", untrained)
        return models

    def compile(self, models):
        return [super(EnsemblePlan, self).compile(model) for model in models]
