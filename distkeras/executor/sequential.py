"""Workers that train alone, without a parameter server: `SequentialWorker`
(SingleTrainer's, AveragingTrainer's per-epoch replicas) and `EnsembleWorker`."""

import logging

from distkeras.executor.failures import send_failure
from distkeras.executor.step_history import ProgressReporter
from distkeras.executor.task_spec import SpecSetting
from distkeras.executor.worker import Worker
from distkeras.keras_io.archives import tensorflow_only_once_imported
from distkeras.keras_io.model_state import (finalize_weights, get_optimizer_state, seed_states,
                                            set_optimizer_state)
from distkeras.transport import networking
from distkeras.transport.history_messages import pack_history

logger = logging.getLogger(__name__)


class SequentialWorker(Worker):
    """Trains alone on all its data; returns the weights and history (SingleTrainer).

    SingleTrainer runs one of these per epoch when the driver acts at epoch ends: its
    spec then holds ``optimizer_state`` (to start from) and ``return_optimizer_state``.
    With ``progress_address`` (and ``token``) set, the steps' records go to the driver as
    they happen (see `ProgressReporter`) rather than with the result.
    """

    STEPS_PER_CALL = 16
    # The progress server is up before the task starts: a refusal means unreachable.
    PROGRESS_CONNECT_SECONDS = 3.0
    optimizer_state = SpecSetting()
    return_optimizer_state = SpecSetting()
    progress_address = SpecSetting()
    _reporter = None  # the `ProgressReporter`, while one is open

    def prepare_model(self):
        super().prepare_model()
        if self.spec.optimizer_state is not None:
            # On the Keras model itself, before the first step reads its variables.
            set_optimizer_state(self.model.keras_model, self.spec.optimizer_state)

    def setup(self):
        address = self.spec.progress_address
        if address is None:
            return
        reporter = ProgressReporter(*address, self.spec.token)
        try:
            reporter.open(self.worker_id, timeout=self.PROGRESS_CONNECT_SECONDS)
        except OSError as error:  # progress is optional: train without it
            logger.warning("Worker %s cannot reach the driver's progress server %s (%s); "
                           "training without progress reports.", self.worker_id,
                           address, error)
            return
        self._reporter = reporter

    def report_failure(self, error):
        """Sends the error to the driver's progress server, which stops the other workers
        of the job (EnsembleTrainer's members, AveragingTrainer's replicas)."""
        if self._reporter is None:
            return
        send_failure(self._reporter.socket, error, self.worker_id)
        networking.close_socket(self._reporter.socket)  # the server closes its side too
        self._reporter = None

    def teardown(self):
        if self._reporter is not None:
            self._reporter.close(self.history)
            self._reporter = None

    def optimize(self):
        while True:
            batches = self.take_minibatches(self.STEPS_PER_CALL)
            if not batches:
                return
            self.train_steps(batches)
            if self._reporter is not None:
                self._reporter.report(self.history)

    def result(self):
        message = super().result()
        message["weights"] = self.model.get_weights()
        if self.spec.return_optimizer_state:
            message["optimizer_state"] = get_optimizer_state(self.model)
        message.update(pack_history(self.history.drain()))
        message.update(self.history.drain_metric_sums())
        return message


class EnsembleWorker(SequentialWorker):
    """Trains an independent model: fresh initial weights seeded by the worker's index."""

    seed = SpecSetting()

    def __init__(self, model, seed=None, **kwargs):
        super().__init__(model, **kwargs)
        self.seed = seed

    def build_model(self):
        import keras

        model = super().build_model()
        # On the executor: seeding an installed but unused TensorFlow would import it.
        tensorflow_only_once_imported("keras.src.utils.rng_utils")
        keras.utils.set_random_seed((self.spec.seed or 0) + self.worker_id)
        return keras.models.clone_model(model)  # new layers, new initial weights

    def initial_seed_states(self, model):
        # The member's own, drawn from its seed when its layers were cloned (a layer's
        # explicit seed stays that seed: `worker_seed` still sets the members apart).
        return seed_states(model)

    def finish(self):
        # A member trains alone, as its own `fit` would: it ends as fit ends, with the
        # optimizer's moving averages as its weights where use_ema=True.
        finalize_weights(self.model)
