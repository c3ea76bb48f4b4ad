"""The trainers without a parameter server: SingleTrainer, AveragingTrainer, EnsembleTrainer.

Each stores its settings and names its execution plan; the plans (`one_task`,
`averaging`, `ensemble`) train.
"""

from distkeras.executor.averaging import AveragingWorker, SequentialEpochWorker
from distkeras.executor.sequential import EnsembleWorker, SequentialWorker
from distkeras.training.asynchronous import DistributedTrainer
from distkeras.training.averaging import AveragingPlan
from distkeras.algorithms.arguments import check_int
from distkeras.training.ensemble import EnsemblePlan
from distkeras.training.one_task import OneTaskPlan
from distkeras.training.trainer import Trainer


class SingleTrainer(Trainer):
    """One replica trained on all the data in one Spark task: the baseline.

    Takes `Trainer`'s arguments. Positional arguments come in dist-keras's order
    (``features_col``, ``label_col``, ``num_epoch``, ``batch_size`` after ``metrics``).

    Notes:
        With validation data or callbacks, the task waits at each epoch's end on an
        `EpochServer` while the driver evaluates and calls back, as ``fit`` does; with no
        slot to spare for a callback of the user's own, each epoch is a task of its own.
        ``EarlyStopping`` stops before the next epoch; a rate a callback sets applies to
        the next epoch. See docs/algorithms/singletrainer.md.
    """

    plan = OneTaskPlan

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 features_col="features", label_col="label", num_epoch=1, batch_size=32,
                 loss_weights=None):
        super().__init__(keras_model, worker_optimizer, loss, metrics,
                         loss_weights=loss_weights, features_col=features_col,
                         label_col=label_col, batch_size=batch_size, num_epoch=num_epoch)

    def make_plan(self, run):
        return self.plan(run, self.allocate_worker, self.allocate_epoch_worker
                         if self.runs_epochs_in_one_task() else None)

    def allocate_worker(self):
        return SequentialWorker(self.master_model)

    def allocate_epoch_worker(self):
        """The worker of the one task that runs every epoch when the driver acts at epoch
        ends (a `SequentialEpochWorker`)."""
        return SequentialEpochWorker(self.master_model)

    def runs_epochs_in_one_task(self):
        """Whether the epochs may run in one task (`allocate_epoch_worker`'s): not when a
        subclass gives a worker of its own, which runs each epoch as a task."""
        return type(self).allocate_worker is SingleTrainer.allocate_worker


class AveragingTrainer(DistributedTrainer):
    """Model averaging: each epoch, one replica per partition, then the weights' mean.

    Takes `DistributedTrainer`'s arguments. Positional arguments come in dist-keras's
    order (``features_col``, ``label_col``, ``num_epoch``, ``batch_size``, ``num_workers``
    after ``metrics``), so code written for dist-keras trains as written.

    Notes:
        Every epoch starts all replicas from the last average, each with a fresh optimizer
        at the rate a learning rate callback set. With several epochs and a slot for every
        worker, all epochs run in one barrier job that meets on the driver's
        `AveragingServer` at each epoch's end; otherwise each epoch is a Spark job of its
        own. See docs/algorithms/averagingtrainer.md.
    """

    averages_weights = True
    plan = AveragingPlan

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 features_col="features", label_col="label", num_epoch=1, batch_size=32,
                 num_workers=2, loss_weights=None, parallelism_factor=1):
        super().__init__(keras_model, worker_optimizer, loss, metrics,
                         num_workers=num_workers, batch_size=batch_size,
                         features_col=features_col, label_col=label_col,
                         num_epoch=num_epoch, loss_weights=loss_weights,
                         parallelism_factor=parallelism_factor)

    def make_plan(self, run):
        return self.plan(run, self.allocate_worker, self.allocate_averaging_worker)

    def allocate_worker(self, model):
        """The worker of one epoch's job (each epoch a Spark job)."""
        return SequentialWorker(model)

    def allocate_averaging_worker(self):
        """The worker of the one job that runs every epoch."""
        return AveragingWorker(self.master_model)


class EnsembleTrainer(DistributedTrainer):
    """Trains ``num_ensembles`` independent models, one per partition of the data.

    Each member starts from its own random initial weights, seeded by ``seed`` plus its
    index, and trains on its share of the data. `train()` returns the list of models.

    Takes `Trainer`'s arguments as well; the ones below are its own. Positional arguments
    come in dist-keras's order (``features_col``, ``label_col``, ``batch_size``,
    ``num_ensembles`` after ``metrics``), so code written for dist-keras trains as
    written.

    Args:
        num_ensembles: Number of models.
        seed: Base seed for the members' initial weights (an integer from 0; member ``i``
            is seeded with ``seed + i``; default: 0).
    """

    exchanges_weights = False  # each member ends with its moving averages, as its fit
    plan = EnsemblePlan

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 features_col="features", label_col="label", batch_size=32, num_ensembles=2,
                 loss_weights=None, num_epoch=1, seed=None):
        super().__init__(keras_model, worker_optimizer, loss, metrics,
                         num_workers=num_ensembles, batch_size=batch_size,
                         features_col=features_col, label_col=label_col,
                         num_epoch=num_epoch, loss_weights=loss_weights)
        self.num_ensembles = num_ensembles
        self.seed = seed

    def get_config(self):
        config = super().get_config()
        for key in ("num_workers", "parallelism_factor"):
            config.pop(key)
        config.update(num_ensembles=self.num_ensembles, seed=self.seed)
        return config

    def check_settings(self, settings):
        # Checked under its own name: the user never gave `num_workers`.
        check_int("num_ensembles", settings.num_ensembles)
        if settings.seed is not None:
            # Member i is seeded with seed + i, which numpy takes in [0, 2**32): a seed out
            # of it (or a float, a string) would fail only on the executors, in the job.
            check_int("seed", settings.seed, minimum=0,
                      maximum=2**32 - settings.num_ensembles)
        return super().check_settings(settings.replace(num_workers=settings.num_ensembles))

    def make_plan(self, run):
        return self.plan(run, self.allocate_worker)

    def allocate_worker(self):
        return EnsembleWorker(self.master_model, seed=self.seed)

    def train(self, dataframe, shuffle=False, verbose="auto", **options):
        """Trains the members; returns a list of ``num_ensembles`` compiled models."""
        return super().train(dataframe, shuffle, verbose, **options)
