"""The original dist-keras's trainer getters and setters, for scripts written for it.

dist-keras configured its trainers through methods (``trainer.set_parallelism_factor(2)``)
as well as through constructor arguments. The trainers here keep those methods as thin
accessors of the same attributes, so such a script runs unchanged. Like the constructors,
the setters only store: `train()` checks the values (a bad one is refused there, with the
argument's name).
"""

import logging

logger = logging.getLogger(__name__)


class TrainerAccessors:
    """Getters and setters of every trainer (dist-keras's ``Trainer``)."""

    def set_model(self, model):
        """Trains ``model`` (a `keras.Model`) from now on, as ``keras_model`` would."""
        self.master_model = model

    def set_max_prefetch(self, max_mini_batches):
        """Accepted for dist-keras scripts; it changes nothing here.

        dist-keras's workers read up to this many minibatches ahead into memory; these
        workers stream Arrow batches of bounded size instead, whatever the partition's.
        """
        logger.warning(
            "%s.set_max_prefetch(%r) has no effect: the workers stream their rows in Arrow "
            "batches of bounded size, with no prefetch buffer to size.", type(self).__name__,
            max_mini_batches)

    def has_history(self):
        """Whether the last `train()` recorded any step."""
        return len(self.get_history()) > 0

    def get_features_column(self):
        """``features_col``."""
        return self.features_col

    def get_label_column(self):
        """``label_col``."""
        return self.label_col

    def set_minibatch_size(self, size):
        """Sets ``batch_size``, the rows per minibatch."""
        self.batch_size = size

    def get_minibatch_size(self):
        """``batch_size``."""
        return self.batch_size

    def set_num_epoch(self, num_epoch):
        """Sets ``num_epoch``, the passes over the data."""
        self.num_epoch = num_epoch

    def get_num_epoch(self):
        """``num_epoch``."""
        return self.num_epoch


class DistributedAccessors:
    """Getters and setters of the trainers with several workers."""

    def set_num_workers(self, num_workers):
        """Sets ``num_workers``, the replicas trained in parallel."""
        self.num_workers = num_workers

    def get_num_workers(self):
        """``num_workers``."""
        return self.num_workers

    def set_parallelism_factor(self, factor):
        """Sets ``parallelism_factor``, the partitions (Spark tasks) per worker."""
        self.parallelism_factor = factor

    def get_parallelism_factor(self):
        """``parallelism_factor``."""
        return self.parallelism_factor


class AsynchronousAccessors:
    """Getters and setters of the parameter-server trainers."""

    def set_learning_rate(self, learning_rate):
        """Sets ``learning_rate``: the update rule's (AEASGD, EAMSGD, Experimental), or the
        workers' Keras optimizer's (DOWNPOUR, ADAG, DynSGD)."""
        self.learning_rate = learning_rate

    def get_learning_rate(self):
        """``learning_rate`` (None: the update rule's default, where it has one)."""
        return self.learning_rate

    def num_updates(self):
        """The commits the parameter server applied in the last `train()` (0 before)."""
        return self._results.num_updates
