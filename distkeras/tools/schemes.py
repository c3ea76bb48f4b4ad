"""dist-keras's optimization schemes: train in rounds and adjust the learning rate between.

`Emperor` trains a trainer for a few epochs at a time, evaluates the loss on validation
data after each round, and divides the learning rate by 10 when the loss has stopped
falling, as dist-keras's did. For one training run,
``trainer.train(df, validation_data=..., callbacks=[keras.callbacks.ReduceLROnPlateau()])``
does the same within the epochs, on every trainer.
"""

import logging
import math

logger = logging.getLogger(__name__)


class Scheme:
    """A way to run a distributed optimization in rounds (dist-keras's ``Scheme``).

    Args:
        optimizer: A distkeras trainer (ADAG, DOWNPOUR, ...).
        num_epoch: The epochs the scheme spreads over its rounds.
        evaluation_frequency: The rounds: each trains ``num_epoch // evaluation_frequency``
            epochs.

    Raises:
        ValueError: When the two numbers give rounds of no epoch.
    """

    def __init__(self, optimizer, num_epoch=15, evaluation_frequency=5):
        self.optimizer = optimizer
        self.num_epoch = num_epoch
        self.evaluation_frequency = evaluation_frequency
        if not isinstance(evaluation_frequency, int) or evaluation_frequency < 1 or \
                not isinstance(num_epoch, int) or num_epoch < evaluation_frequency:
            raise ValueError(
                "`num_epoch` and `evaluation_frequency` must be integers with num_epoch >= "
                "evaluation_frequency >= 1 (each round trains num_epoch // "
                f"evaluation_frequency epochs). Received: num_epoch={num_epoch!r}, "
                f"evaluation_frequency={evaluation_frequency!r}")
        self.epoch_over_eval_frequency = num_epoch // evaluation_frequency
        self.initialize()

    def initialize(self):
        """Sets the trainer's ``num_epoch`` to the epochs of one round."""
        self.optimizer.set_num_epoch(self.get_epoch_over_evaluation_frequency())

    def get_epoch_over_evaluation_frequency(self):
        """The epochs of one round."""
        return self.epoch_over_eval_frequency

    def optimize(self, training_set, validation_set):
        """Trains on ``training_set``; subclasses define how."""
        raise NotImplementedError(f"{type(self).__name__} must implement optimize().")


class Emperor(Scheme):
    """Divides the learning rate by 10 whenever a round lowers the validation loss by no
    more than ``loss_threshold`` (dist-keras's ``Emperor``).

    The learning rate is the trainer's ``learning_rate``: for ADAG, DOWNPOUR and DynSGD the
    workers' optimizer's (its own rate when none was given), for AEASGD and EAMSGD the
    elastic one.

    Args:
        optimizer: A parameter-server trainer (it has ``set_learning_rate``).
        evaluate_loss: ``evaluate_loss(model, validation_set)``, the loss as a number.
        num_epoch: See `Scheme`.
        evaluation_frequency: See `Scheme`.
        loss_threshold: The smallest change of the loss that keeps the rate.

    Raises:
        TypeError: For a trainer without a learning rate to set.
    """

    def __init__(self, optimizer, evaluate_loss, num_epoch=15, evaluation_frequency=5,
                 loss_threshold=0.005):
        if not hasattr(optimizer, "set_learning_rate"):
            raise TypeError(
                f"Emperor changes the trainer's learning rate, and {type(optimizer).__name__} "
                "has none to set: use a parameter-server trainer (ADAG, DOWNPOUR, DynSGD, "
                "AEASGD, EAMSGD), or pass callbacks=[keras.callbacks.ReduceLROnPlateau()] "
                "and validation_data to any trainer's train().")
        super().__init__(optimizer, num_epoch, evaluation_frequency)
        self.previous_loss = float("inf")
        self.loss_threshold = loss_threshold
        self.evaluate_loss = evaluate_loss

    def optimize(self, training_set, validation_set):
        """Trains ``num_epoch // evaluation_frequency + 1`` rounds (as dist-keras did),
        each continuing from the last one's model.

        Returns:
            The model the last round returned.
        """
        trained_model = None
        for _ in range(self.get_epoch_over_evaluation_frequency() + 1):
            trained_model = self.optimizer.train(training_set)
            self.optimizer.set_model(trained_model)
            loss = float(self.evaluate_loss(trained_model, validation_set))
            logger.info("Emperor: validation loss %s", loss)
            change = math.fabs(loss - self.previous_loss)
            self.previous_loss = loss
            if change <= self.loss_threshold:
                rate = _learning_rate(self.optimizer) / 10
                self.optimizer.set_learning_rate(rate)
                logger.info("Emperor: the loss changed by %s; learning rate lowered to %s",
                            change, rate)
        return trained_model


def _learning_rate(trainer):
    """The trainer's ``learning_rate``, or its worker optimizer's own where it has none.

    Raises:
        ValueError: When the optimizer's rate is a schedule (not one number to divide).
    """
    import copy

    import keras

    rate = trainer.get_learning_rate()
    if rate is not None:
        return float(rate)
    optimizer = trainer.worker_optimizer
    if optimizer is None:  # a compiled model lends its own
        optimizer = getattr(trainer.master_model, "optimizer", None)
    if optimizer is None:
        raise ValueError("Emperor needs the trainer's worker_optimizer (or a compiled "
                         "keras_model) to read the learning rate from.")
    if isinstance(optimizer, (str, dict)):
        optimizer = keras.optimizers.get(copy.deepcopy(optimizer))  # `get` edits a dict
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)  # a LossScaleOptimizer's
    if isinstance(optimizer._learning_rate, keras.optimizers.schedules.LearningRateSchedule):
        raise ValueError(
            "Emperor divides the learning rate by 10, and the worker optimizer's is a "
            "schedule: give the trainer learning_rate=<a number>, or an optimizer with a "
            "fixed rate.")
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))
