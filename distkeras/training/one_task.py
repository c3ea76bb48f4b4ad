"""SingleTrainer's plan: one replica on all the data, in one Spark task or one per epoch.

Without validation or callbacks, one task trains every epoch. With them, one task runs
every epoch and waits at each epoch's end on an `EpochServer` while the driver validates
and calls back; with no slot to spare for a callback of the user's own, each epoch is a
Spark task of its own, going on from the last one's weights and optimizer state.
"""

import logging

from distkeras.data import frame_layout
from distkeras.executor.epochs import Replay
from distkeras.executor.sequential import SequentialWorker
from distkeras.keras_io import model_state
from distkeras.keras_io.archives import deserialize_model, serialize_model
from distkeras.training.checks import check_optimizer_tracks_trainable, steps_taken
from distkeras.training.plans import Plan
from distkeras.transport import epoch_servers
from distkeras.transport.history_messages import (history_records, unpack_history,
                                                  unpack_metric_states)

logger = logging.getLogger(__name__)


class OneTaskPlan(Plan):
    """One replica trained in one Spark task (or one per epoch), as `fit` would.

    Args:
        run: The `run.Run` to train.
        make_worker: Returns the worker of a task (a `SequentialWorker`).
        make_epoch_worker: Returns the worker of the one task that runs every epoch when
            the driver acts at epoch ends; None: each epoch is a task of its own.
    """

    follows_learning_rate_callbacks = True

    def __init__(self, run, make_worker, make_epoch_worker=None):
        super().__init__(run, make_worker)
        self.make_epoch_worker = make_epoch_worker

    def train(self, frame, label_shapes, shuffle):
        run, settings = self.run, self.settings
        model = deserialize_model(serialize_model(settings.master_model))
        lent_state = self.lent_optimizer_state()
        if run.validator is None:
            layout = frame_layout.lay_out(frame, 1, shuffle)
            worker = self.make_worker()
            if lent_state is not None:
                worker.spec = worker.spec.replace(optimizer_state=lent_state)
            message = self.run_sequential(layout, worker, label_shapes, run.label,
                                          run.progress_total,
                                          Replay(settings.num_epoch, shuffle))
            model.set_weights(list(message["weights"]))
            return model
        if lent_state is not None:
            model_state.set_optimizer_state(run.validator.model, lent_state)
        if settings.num_epoch > 1 and self.make_epoch_worker is not None \
                and self.slots_for_one_job(frame, 1):
            return self.train_in_one_task(frame, label_shapes, shuffle)
        with frame_layout.kept_for_epochs(frame, settings.num_epoch):
            return self.train_epoch_by_epoch(model, frame, label_shapes, shuffle)

    def train_in_one_task(self, frame, label_shapes, shuffle):
        """Every epoch in one Spark task that replays its data from local disk; at each
        epoch's end the worker waits on an `EpochServer` while the driver validates and
        calls back, with the optimizer's state on the validator's model (callbacks see it,
        and may change its learning rate)."""
        run, num_epoch = self.run, self.settings.num_epoch
        driver_model = run.validator.model
        if not driver_model.optimizer.built:
            driver_model.optimizer.build(driver_model.trainable_variables)

        def end_epoch(epoch, weights, optimizer_state):
            """The driver's end of ``epoch`` (1-based): whether to stop, and the optimizer
            state to go on with."""
            model_state.set_optimizer_state(driver_model, list(optimizer_state))
            stop = run.end_epoch_in_job(server, epoch, weights, failures)
            return stop, model_state.get_optimizer_state(driver_model)

        failures = []
        run.begin_epoch(1)  # before the state is read: a callback may set the learning rate
        server = epoch_servers.EpochServer(
            self.settings.master_model, model_state.get_optimizer_state(driver_model),
            on_epoch_end=end_epoch)
        self.run_epoch_server(
            server, self.make_epoch_worker(),
            frame_layout.lay_out(frame, 1, shuffle), 1, label_shapes,
            f"distkeras {run.label} ({num_epoch} epochs)", Replay(num_epoch, shuffle),
            failures)
        run.optimizer_state = list(server.optimizer_state)
        model_state.set_optimizer_state(driver_model, run.optimizer_state)
        return server.get_model()

    def lent_optimizer_state(self):
        """The state of the optimizer a compiled model lent, when it has taken steps (a
        model `fit` or trained here before): training goes on from it, as `fit` would.
        None otherwise."""
        model = self.settings.master_model
        optimizer = getattr(model, "optimizer", None)
        if optimizer is None or self.settings.worker_optimizer is not optimizer or \
                not optimizer.built or steps_taken(optimizer) == 0:
            return None
        check_optimizer_tracks_trainable(model)
        return model_state.get_optimizer_state(model)

    def run_sequential(self, layout, worker, label_shapes, description, samples=None,
                       replay=None):
        """Runs one configured `SequentialWorker` task over ``samples`` samples; adds its
        steps to the history and keeps its optimizer's state."""
        run = self.run
        self.configure_worker(worker)
        worker.spec = worker.spec.replace(return_optimizer_state=True)
        job_tag = self.new_job_tag()
        with self.progress(layout.sparkSession, worker, samples, description,
                           job_tag) as reported:
            (message,) = self.run_workers(layout, 1, worker, label_shapes,
                                          f"distkeras {description}", job_tag, replay)
        run.history.extend(reported)
        run.history.extend(history_records(unpack_history(message)))
        run.metric_states.extend(unpack_metric_states(message, message["worker_id"]))
        if message.get("optimizer_state") is not None:
            run.optimizer_state = list(message["optimizer_state"])
        return message

    def compile(self, model):
        """The returned model's optimizer holds the trained one's state (its step count,
        its moments), as after `fit`: training it further goes on where this ended."""
        model = super().compile(model)
        if self.run.optimizer_state is not None:
            try:
                model_state.set_optimizer_state(model, self.run.optimizer_state)
            except ValueError as error:  # a custom worker compiled another optimizer
                logger.warning("The returned model's optimizer starts afresh: %s", error)
            else:
                self.run.trained_optimizer = model.optimizer
        return model

    def finalize_weights(self, model):
        """An optimizer with ``use_ema=True`` leaves its moving averages as the weights,
        as `fit` does once its last epoch was validated and called back (so that epoch's
        record, ``ModelCheckpoint`` and ``EarlyStopping`` see the trained weights)."""
        if self.run.trained_optimizer is model.optimizer:
            return model_state.finalize_weights(model)
        return False

    def train_epoch_by_epoch(self, model, frame, label_shapes, shuffle):
        """One Spark task per epoch, each starting from the last one's weights and
        optimizer state; the epoch's end is validated and called back before the next.

        The validator's model holds the optimizer's state between epochs, so the callbacks
        see it (``ModelCheckpoint`` saves it) and may change its learning rate.
        """
        run, num_epoch = self.run, self.settings.num_epoch
        driver_model = run.validator.model
        for epoch in range(1, num_epoch + 1):
            run.begin_epoch(epoch)
            run.optimizer_state = model_state.get_optimizer_state(driver_model)
            worker = self.make_worker()
            if not isinstance(worker, SequentialWorker):
                raise TypeError(f"{run.name}.allocate_worker() must return "
                                f"a SequentialWorker. Received: {type(worker).__name__}")
            # This epoch's starting weights and optimizer state.
            worker.spec = worker.spec.replace(model_bytes=serialize_model(model),
                                              optimizer_state=run.optimizer_state)
            # Numbered on from the last epoch's steps: not from the count of records, which
            # holds a retried task's superseded ones too.
            worker.iteration = 1 + max((record["iteration"] for record in run.history
                                        if not record.get("superseded")), default=0)
            steps_before, states_before = len(run.history), len(run.metric_states)
            message = self.run_sequential(
                frame_layout.lay_out(frame, 1, shuffle), worker, label_shapes,
                f"{run.label} epoch {epoch}/{num_epoch}",
                run.progress_total // num_epoch if run.progress_total else None)
            model.set_weights(list(message["weights"]))
            model_state.set_optimizer_state(driver_model, run.optimizer_state)
            epoch_records = run.history[steps_before:]
            for record in epoch_records + run.metric_states[states_before:]:
                record["epoch"] = epoch - 1  # counted from 0, as AveragingTrainer's
            # The last epoch: the returned model, at the end.
            if epoch < num_epoch and \
                    run.validate_epoch(model.get_weights(), epoch, epoch_records):
                break
        return model
