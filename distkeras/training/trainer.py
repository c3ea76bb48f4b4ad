"""`Trainer`, the base of every trainer: it stores its settings and reads its last results.

The constructor stores the arguments and nothing changes them afterwards: `train()`
resolves them into a frozen `settings.Settings`, makes a `run.Run` that owns the run's
state and hands it to the class's execution plan (``plan``, see `plans`). The results are
the last run's (`results.ResultAccessors`).
"""

from distkeras import compat
from distkeras.training import driver
from distkeras.training import launch
from distkeras.training import settings as settings_module
from distkeras.training.results import ResultAccessors
from distkeras.training.worker_setup import compile_returned, workers_optimizer


class Trainer(ResultAccessors, compat.TrainerAccessors):
    """Base of every trainer: stores the settings and reads the results of the last run.

    Args:
        keras_model: The `keras.Model` to train (left untouched; training uses a copy).
        worker_optimizer: The Keras optimizer of every replica (name, instance or config);
            None: the one ``keras_model`` was compiled with.
        loss: The Keras loss (name, instance or config); None: the one ``keras_model`` was
            compiled with.
        metrics: Metrics recorded at every step, as for ``model.compile``: a list, a list
            per output, or a dict by output name. None: those ``keras_model`` was compiled
            with; for a model not compiled, an accuracy if it has one output trained
            with a classification loss (binary accuracy, at the loss's threshold, for a
            binary cross-entropy on logits or on several units), none otherwise.
        loss_weights: Optional loss weights for multi-output models; None: those
            ``keras_model`` was compiled with, if any.
        features_col: Input column, or a list of columns for a multi-input model (in the
            order of ``model.inputs``), or a dict keyed by the inputs' names.
        label_col: Target column, or a list of columns for a multi-output model (in the
            order of ``model.outputs``), or a dict keyed by the outputs' names; None for
            a model compiled with ``loss=None``, trained as ``fit(x)`` without targets.
        batch_size: Rows per minibatch.
        num_epoch: Passes over the data.
    """

    # Whether the returned weights are an average no replica trained with (an elastic
    # center, a mean): their BatchNormalization statistics are then measured again
    # (`batch_statistics`), as no replica's describe them.
    averages_weights = False
    # The execution plan of a run (a `plans.Plan` class); subclasses name theirs.
    plan = None

    def __init__(self, keras_model, worker_optimizer=None, loss=None, metrics=None,
                 loss_weights=None, features_col="features", label_col="label",
                 batch_size=32, num_epoch=1):
        self.master_model = keras_model
        self.worker_optimizer = worker_optimizer
        self.loss = loss
        self.metrics = list(metrics) if isinstance(metrics, tuple) else metrics
        self.loss_weights = loss_weights
        self.features_col = features_col
        self.label_col = label_col
        self.batch_size = batch_size
        self.num_epoch = num_epoch

    # -- configuration ------------------------------------------------------------------

    def get_config(self):
        """The trainer's settings as a JSON-able dict (the model is not included)."""
        from distkeras.keras_io.compile_config import serialize_keras_object

        return {
            "worker_optimizer": serialize_keras_object(self.worker_optimizer),
            "loss": serialize_keras_object(self.loss),
            "metrics": serialize_keras_object(self.metrics),
            "loss_weights": self.loss_weights,
            "features_col": self.features_col,
            "label_col": self.label_col,
            "batch_size": self.batch_size,
            "num_epoch": self.num_epoch,
        }

    @classmethod
    def from_config(cls, config, keras_model=None):
        """Builds a trainer from `get_config()` output and a model."""
        return cls(keras_model=keras_model, **config)

    def settings(self, **overrides):
        """The frozen settings a `train()` runs with; the trainer stays as it is.

        Args:
            **overrides: Stored arguments replaced in the result (``num_epoch=3``).

        Returns:
            A `settings.Settings`: the stored arguments, the compiled model's optimizer,
            loss, metrics and loss weights where not given, the columns in the model's
            order.

        Raises:
            TypeError, ValueError: A setting out of range, naming it.
        """
        return self.check_settings(settings_module.resolve(self, overrides))

    def check_settings(self, settings):
        """Checks this class's own settings; returns them (subclasses may complete them)."""
        return settings

    def validate_arguments(self):
        """Raises a clear error for any setting out of range; changes nothing."""
        self.settings()

    def compiled_settings(self):
        """The optimizer, loss, metrics and loss weights a `train()` would use (those not
        given taken from the compiled model), by name; the trainer stays as it is."""
        values = settings_module.compiled_settings(
            self.master_model, self.worker_optimizer, self.loss, self.metrics,
            self.loss_weights)
        del values["weighted_metrics"]
        return values

    def adopt_compiled_settings(self):
        """Stores the compiled model's optimizer, loss, metrics and loss weights as this
        trainer's own where none was given (`compiled_settings`): for a config that
        must hold them (a saved estimator, a job sent to Punchcard). `train()` never
        calls it."""
        for name, value in self.compiled_settings().items():
            setattr(self, name, value)

    def compile_model(self, model):
        """Compiles ``model`` as `train()` compiles the model it returns (the workers'
        optimizer, the loss, the metrics, the given model's execution options); returns
        it."""
        return compile_returned(self, self.settings(), model)

    # -- training -----------------------------------------------------------------------

    def train(self, dataframe, shuffle=False, verbose="auto", checkpoint_dir=None,
              checkpoint_every=60.0, resume=False, sample_weight_col=None, class_weight=None,
              validation_data=None, callbacks=None, overrides=None):
        """Trains on a Spark DataFrame and returns a compiled `keras.Model`.

        Args:
            dataframe: Rows with the feature and label columns.
            shuffle: Whether to shuffle the rows before each epoch. The orders are drawn
                from numpy's global generator: ``keras.utils.set_random_seed(n)``
                repeats them, as for ``fit``.
            verbose: Progress of the training (samples done, running loss and, where the
                workers exchange weights, commits per second), as in Keras: 1 a progress bar,
                2 a line every 30 seconds and at the end (for logs), 0 nothing; ``"auto"``
                is 1 in a terminal or a notebook and 2 elsewhere.
            checkpoint_dir: Parameter-server trainers only: a folder (any Hadoop path) where
                the center variable is saved every ``checkpoint_every`` seconds and at the end
                (also when the training fails or is interrupted).
            checkpoint_every: Seconds between two checkpoints.
            resume: Start from the checkpoint in ``checkpoint_dir`` (if there is one) instead
                of the model's weights. The epochs run again in full from those weights.
            sample_weight_col: A numeric column weighing each row's loss (as Keras's
                ``sample_weight``).
            class_weight: A dict from class index to the weight of that class's rows (as
                Keras's ``class_weight``; classes not named weigh 1). Multiplies with
                ``sample_weight_col``. Single-output models.
            validation_data: A DataFrame with the same columns, numpy arrays ``(x, y)``
                or ``(x, y, sample_weight)`` as for Keras's ``fit``, or a fraction of
                ``dataframe``'s rows to hold out at random; its rows are evaluated on the
                driver after each epoch and at the end (`get_validation_history()`).
            callbacks: Keras callbacks run on the driver at the end of each epoch (see
                `validation.Validator`), with ``val_*`` logs when ``validation_data`` is
                given and the training ``loss``: ``EarlyStopping`` stops the workers and
                returns the model (with ``restore_best_weights``, the best epoch's),
                ``ModelCheckpoint`` and ``CSVLogger`` save what they see.
            overrides: Constructor arguments replaced for this run only, by name (a Spark
                ML estimator's training Params); the trainer keeps its own.

        Returns:
            The trained model, compiled with ``worker_optimizer``, ``loss`` and ``metrics``.

        Raises:
            ValueError: A setting, a column or the model does not fit the data; raised on
                the driver, before any Spark job, naming what to change.
            distkeras.errors.InvalidDataError: A row no retry can train on (a null, NaN,
                an array of the wrong length, a label out of range), naming the column.
            distkeras.errors.TrainingError: A worker or the parameter server failed, or a
                worker stalled past ``worker_timeout``.
            distkeras.errors.DataSourceError: A file of a plain Parquet scan, which the
                workers read themselves (docs/parquet-feed.md), is gone.

        Notes:
            Each call owns its run: calls from several threads on one trainer run side by
            side, and the getters read the run that ended last.
        """
        if self.plan is None:
            raise NotImplementedError(f"{type(self).__name__} names no execution plan.")
        options = dict(shuffle=shuffle, verbose=verbose, checkpoint_dir=checkpoint_dir,
                       checkpoint_every=checkpoint_every, resume=resume,
                       sample_weight_col=sample_weight_col, class_weight=class_weight,
                       validation_data=validation_data, callbacks=callbacks)
        return driver.train(self, dataframe, options, overrides)

    # -- seams of the plans (tests and subclasses replace them) -------------------------

    def new_job_group(self):
        """A Spark job group of its own for one run of workers (to cancel them as one).

        Returns:
            The job group's name (`launch.new_job_group`).
        """
        return launch.new_job_group(self)

    def slots_for_one_job(self, frame, num_tasks, run):
        """Whether Spark can run ``num_tasks`` tasks of ``run`` at once
        (`launch.slots_for_one_job`).

        Args:
            frame: The DataFrame the tasks train on, laid out for the workers.
            num_tasks: The tasks that must run at once (waiting at each epoch's end).
            run: The `run.Run` they belong to.
        """
        return launch.slots_for_one_job(run, frame, num_tasks)

    def _workers_optimizer(self):
        """The optimizer the workers train with, from the stored settings
        (`worker_setup.workers_optimizer`)."""
        return workers_optimizer(self, self)
