"""Workers that meet a server at each epoch's end: `AveragingWorker` (model averaging
in one Spark job) and `SequentialEpochWorker` (SingleTrainer's epoch barrier)."""

from distkeras.executor.network import NetworkWorker
from distkeras.executor.replica import batch_size_of
from distkeras.keras_io.model_state import get_optimizer_state
from distkeras.transport import networking
from distkeras.transport.exchange_checks import learning_rate_field
from distkeras.transport.networking import weights_array


class AveragingWorker(NetworkWorker):
    """AveragingTrainer's worker when every epoch runs in one Spark job.

    Trains its partition epoch by epoch; at each epoch's end it sends its weights to the
    driver's `AveragingServer`, waits for the mean of every worker's and starts the next
    epoch from it with a fresh optimizer state, as a new replica in a job of its own would.
    A worker that Spark restarted skips the epochs already averaged.
    """

    STEPS_PER_CALL = 16

    def prepare_model(self):
        super().prepare_model()
        model = self.model.keras_model
        model.optimizer.build(model.trainable_variables)
        self._fresh_optimizer = get_optimizer_state(model)
        self._held = None  # a minibatch read ahead that belongs to the next epoch
        self._taken = 0  # samples taken from the feed

    def optimize(self):
        try:
            self._train_epochs()
        except (OSError, networking.ProtocolError):
            raise  # the link to the driver: a restart may get through
        except Exception as error:
            # Spark restarts a failed barrier stage whole (up to 4 times), and this error
            # would come back each time: the driver hears it now and stops the job.
            self.report_failure(error)
            raise

    def _train_epochs(self):
        state = self._exchange(networking.ACTION_PULL)
        for epoch in range(self.spec.num_epoch):
            if state["stop"]:
                return
            if epoch < state["epochs_done"]:  # averaged before this task started
                while skipped := self._take_of_epoch(epoch, self.STEPS_PER_CALL):
                    self.iteration += len(skipped)  # its steps are in the history
                self._trained_samples = self._taken
                continue
            self._start_epoch(state)
            taken = self._taken
            while batches := self._take_of_epoch(epoch, self.STEPS_PER_CALL):
                self.train_steps(batches)
                if self.history_due():
                    self.flush_history()
            self.flush_history()  # the epoch's records reach the driver before its end
            self.send_commit(self.model.get_weights(), epoch=epoch,
                             samples=self._taken - taken, **self._epoch_extras())
            state = self._exchange()

    def _start_epoch(self, state):
        """Starts an epoch from the server's reply: the mean, with a fresh optimizer (at
        the learning rate the driver set, if it did)."""
        self.model.set_optimizer_state(self._fresh_optimizer)
        rate = learning_rate_field(state, "learning_rate")
        if rate is not None:
            self.model.optimizer.learning_rate = rate
        self.model.set_weights(state["center"])

    def _epoch_extras(self):
        """Fields sent with the weights at an epoch's end, beyond epoch and samples."""
        return {}

    def _exchange(self, action=None):
        """The server's reply (after sending ``action``, if given)."""
        if action is not None:
            networking.send_action(self.socket, action)
        state = networking.recv_data(self.socket)
        if not {"center", "epochs_done", "stop"} <= set(state):
            raise networking.ProtocolError("The averaging server's reply is incomplete.")
        return state

    def _take_of_epoch(self, epoch, count):
        """Up to ``count`` next minibatches of ``epoch`` (from 0); none once it is spent."""
        batches = []
        while len(batches) < count:
            batch, self._held = self._held, None
            if batch is None:
                try:
                    batch = self.get_next_minibatch()
                except StopIteration:
                    break
            if self._feed.epoch_of(self._taken) != epoch:
                self._held = batch
                break
            self._taken += batch_size_of(batch[0])
            batches.append(batch)
        return batches


class SequentialEpochWorker(AveragingWorker):
    """SingleTrainer's worker when every epoch runs in one Spark task and the driver acts
    at each epoch's end (validation, callbacks).

    Trains epoch by epoch, as `fit` does; at each epoch's end it sends its weights and its
    optimizer's state to the driver's `EpochServer` and waits for the go-ahead, which
    carries the optimizer state to go on with (a callback may have changed the learning
    rate). The first reply holds the state to start from; a task that Spark restarted
    skips the epochs already done and goes on from the last one's end.
    """

    def _start_epoch(self, state):
        if "optimizer_state" not in state:
            raise networking.ProtocolError("The epoch server's reply carries no optimizer "
                                           "state.")
        self.model.set_optimizer_state(list(state["optimizer_state"]))
        self.model.set_weights(state["center"])

    def _epoch_extras(self):
        return {"optimizer_state": weights_array(get_optimizer_state(self.model))}
