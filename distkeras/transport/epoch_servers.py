"""The servers of an epoch barrier: workers meet at each epoch's end on the driver.

`AveragingServer` (AveragingTrainer's workers in one Spark job: the mean of their
weights) and `EpochServer` (SingleTrainer's one worker while the driver validates and
calls back) are socket parameter servers whose commits are epoch ends: each holds an
`EpochBarrier` beside its transport, center and history sink, and says what an epoch's
end makes of the weights.
"""

import numpy as np

from distkeras.algorithms import update_rules
from distkeras.transport import networking
from distkeras.transport.epoch_barrier import EpochBarrier
from distkeras.transport.networking import weights_array
from distkeras.transport.parameter_servers import SocketParameterServer

__all__ = ["AveragingServer", "EpochServer"]


class _EpochBarrierServer(SocketParameterServer):
    """A transport, a center, a history sink and an epoch barrier (``barrier``, an
    `EpochBarrier`); subclasses say what each epoch's end makes of the weights (the
    barrier calls `epoch_entry`, `average`, `end_epoch` and `reply_fields` under the
    lock).

    Args:
        model: The master `keras.Model` (its weights: the first center).
        num_workers: Workers that take part in every epoch's end.
        master_port: Port to listen on; 0 lets the OS pick a free one.
    """

    # Its commits are epoch ends, not the workers' exchanges: no commit rate to show.
    shows_commit_rate = False
    # A rejoining worker's pull says which epochs it redoes (an epoch may still end
    # between its handshake and its pull).
    supersede_on_retry = False

    def __init__(self, model, num_workers, master_port=0):
        super().__init__(model, master_port)
        self.barrier = EpochBarrier(num_workers, self.transport, self.center, self.sink,
                                    self)

    def handle_pull(self, conn, addr):
        """A worker joins or rejoins (`EpochBarrier.handle_pull`)."""
        self.barrier.handle_pull(conn, addr)

    # Every pull answers with the weights and the epochs done.
    handle_pull_unless_own = handle_pull

    def handle_commit(self, conn, addr):
        """A worker's epoch end (`EpochBarrier.handle_commit`)."""
        self.barrier.handle_commit(conn, addr)

    def epoch_entry(self, data, weights, samples):
        """What a worker's commit of an epoch keeps until the epoch ends."""
        return weights, samples

    def average(self, entries):
        """The new center of the epoch's entries (``{worker id: entry}``), or None to
        keep the center."""
        raise NotImplementedError(f"{type(self).__name__} must implement average().")

    def end_epoch(self, epochs_done):
        """Runs the driver's end of the epoch (the workers wait); returns whether to stop."""
        return False

    def reply_fields(self):
        """Fields a reply carries besides the center and the epoch count."""
        return {}


class AveragingServer(_EpochBarrierServer):
    """Model averaging at every epoch's end, for AveragingTrainer's workers in one job.

    Each worker sends its weights when it finishes an epoch and waits (`EpochBarrier`);
    once all ``num_workers`` have sent theirs for that epoch, the center becomes the mean
    of those that trained on some rows (a replica of an empty partition would pull it
    back), ``on_average(epochs_done, center)`` runs (the driver's end of the epoch:
    validation and callbacks; it returns whether to stop) and every waiting worker gets
    the mean back, with ``server.barrier.learning_rate`` when the driver sets one for the
    next epoch.

    Args:
        model: The master `keras.Model` (its weights: the first center).
        num_workers: Workers that take part in every average.
        on_average: ``f(epochs_done, center) -> bool`` or None.
        master_port: Port to listen on; 0 lets the OS pick a free one.
    """

    def __init__(self, model, num_workers, on_average=None, master_port=0):
        super().__init__(model, num_workers, master_port)
        self.on_average = on_average

    def average(self, entries):
        """The mean of the epoch's weights (in worker order) that trained on some rows."""
        trained = [weights for _, (weights, samples) in sorted(entries.items())
                   if samples > 0]
        return update_rules.average_weights(trained) if trained else None

    def end_epoch(self, epochs_done):
        """Runs ``on_average``; returns whether to stop."""
        if self.on_average is None:
            return False
        return self.on_average(epochs_done, self.center.center_variable)


class EpochServer(_EpochBarrierServer):
    """SingleTrainer's driver end when every epoch runs in one Spark task and the driver
    validates or calls back at each epoch's end.

    The one worker sends its weights and its optimizer's state at each epoch's end and
    waits while ``on_epoch_end(epochs_done, weights, optimizer_state)`` runs on the driver;
    the hook returns ``(stop, optimizer_state)``, the state to go on with (a callback may
    have changed its learning rate), or None to keep the worker's. Replies carry the
    weights and that state, so a task that Spark restarted goes on from the last epoch's
    end, as the next task of a job per epoch would.

    Args:
        model: The master `keras.Model` (its weights: where training starts).
        optimizer_state: The optimizer's state to start from (`model_state.get_optimizer_state`
            of the compiled model whose optimizer the worker builds).
        on_epoch_end: The driver's end of an epoch, or None.
    """

    FIELD = "optimizer_state"

    def __init__(self, model, optimizer_state, on_epoch_end=None, master_port=0):
        super().__init__(model, 1, master_port)
        self.optimizer_state = weights_array(optimizer_state)
        self.field_specs = {self.FIELD: [(value.shape, value.dtype)
                                         for value in self.optimizer_state]}
        self.center.max_frame_bytes += sum(value.nbytes for value in self.optimizer_state)
        self.on_epoch_end = on_epoch_end

    def epoch_entry(self, data, weights, samples):
        state = data.get(self.FIELD)
        if not (isinstance(state, np.ndarray) and state.dtype == object
                and len(state) == len(self.optimizer_state)):
            raise networking.ProtocolError(
                "An epoch's commit must carry the optimizer's state.")
        return weights, samples, state

    def average(self, entries):
        """The one worker's weights; its optimizer state is kept too."""
        ((weights, _, state),) = entries.values()
        self.optimizer_state = state
        return weights

    def end_epoch(self, epochs_done):
        if self.on_epoch_end is None:
            return False
        stop, state = self.on_epoch_end(epochs_done, self.center.center_variable,
                                        self.optimizer_state)
        if state is not None:
            self.optimizer_state = weights_array(state)
        return stop

    def reply_fields(self):
        return {self.FIELD: self.optimizer_state}
