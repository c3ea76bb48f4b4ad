"""A rule that breaks in a parameter server shard's child process, for the tests of a
shard that fails. Its own module: spawned shard processes import it by name, and Spark's
executors get it by value (`cloudpickle.register_pickle_by_value`)."""

import multiprocessing

from distkeras.algorithms import Algorithm, Hyperparameter


class BreaksInAShard(Algorithm):
    """DOWNPOUR's rule (``C += W - W_pull``), whose ``apply`` raises in a shard's child
    process (not in shard 0, on the driver) once that shard has applied ``fail_at``
    commits."""

    hyperparameters = (Hyperparameter("fail_at", 2, None, "The commit that breaks."),)
    default_window = 2

    def commit(self, weights, pulled, context):
        return weights - pulled

    def apply(self, center, update, context):
        if multiprocessing.current_process().name == "distkeras-shard" and \
                context.num_updates >= self.fail_at:
            raise ArithmeticError(f"the rule broke at update {context.num_updates}")
        return center + update
