"""`Trainer`, the base of every trainer: it stores its settings and reads its last results.

The constructor stores the arguments and nothing changes them afterwards: `train()`
resolves them into a frozen `settings.Settings`, makes a `run.Run` that owns the run's
state and hands it to the execution plan the trainer makes (`make_plan`: its class's
``plan`` given the parts it needs, see `plans`). The getters read the last run's
`run.RunResults` (`results`).
"""

from distkeras.training.history import average_history
from distkeras.training import compat
from distkeras.training import driver
from distkeras.training import results
from distkeras.training import settings as settings_module
from distkeras.training.worker_setup import compile_returned, workers_optimizer
from distkeras.keras_io.compile_config import serialize_keras_object


class Trainer:
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
    _results = results.NO_RESULTS

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
        return compile_returned(self._workers_optimizer(), self.settings(), model)

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
            checkpoint_dir: Parameter-server trainers and AllReduceTrainer only: a folder
                (any Hadoop path) where the parameter server's center variable is saved
                every ``checkpoint_every`` seconds and at the end (also when the training
                fails or is interrupted); AllReduceTrainer's model and optimizer state
                after each epoch.
            checkpoint_every: Seconds between two checkpoints (parameter-server trainers).
            resume: Start from the checkpoint in ``checkpoint_dir`` (if there is one) instead
                of the model's weights. A parameter-server trainer runs the epochs again in
                full from those weights; AllReduceTrainer runs the epochs after the
                checkpoint's, with its optimizer state.
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

    def make_plan(self, run):
        """The execution plan of ``run`` (the class's ``plan``), given the parts it needs
        (the trainer's workers, its server): the plan never calls back into the trainer.

        Args:
            run: The `run.Run` to train.
        """
        raise NotImplementedError(f"{type(self).__name__} names no execution plan.")

    def _workers_optimizer(self):
        """The optimizer the workers train with, from the stored settings
        (`worker_setup.workers_optimizer`)."""
        return workers_optimizer(self, self)

    # -- results of the last run (`results`) ---------------------------------------------

    @property
    def parameter_server(self):
        """The server of the last `train()` in this process (None before one, or where
        the run had none)."""
        return results.last_server(self)

    def get_training_time(self):
        """Wall-clock seconds of the last `train()`."""
        return self._results.training_time

    def get_history(self):
        """One record per training step of the last `train()`.

        Returns:
            A list of dicts with ``worker_id``, ``iteration``, ``timestamp``,
            ``batch_size``, ``epoch``, the loss and the metrics.

        Notes:
            When Spark retried a worker's task, its records carry ``attempt`` (from 0, in
            the order the attempts started). The failed attempt's steps that the retry
            trained again carry ``superseded=True``: their commits reached the center, but
            the progress, the epochs' ends, `get_averaged_history` and
            `get_executor_history` leave them out.
        """
        return list(self._results.history)

    def get_averaged_history(self):
        """The history averaged over workers, step by step within each epoch: a dict of
        numpy arrays by name (``iteration``, ``epoch``, ``loss``, each metric, ...; see
        `distkeras.utils.average_history`)."""
        return average_history(self._results.history)

    def get_executor_history(self, worker_id):
        """The step records of one worker (its partition index), of its final attempt
        where Spark retried it, as `get_history` gives them. An id without records (a
        typo, or a worker whose partition had no rows) gives an empty list and a warning
        naming the ids that have records."""
        return results.executor_history(self._results.history, worker_id)

    def get_validation_history(self):
        """One record per evaluation of the validation data in the last `train()`: dicts
        with ``epoch``, ``samples``, ``timestamp``, ``loss`` (the epoch's mean step loss,
        where known), ``val_loss`` and ``val_<metric>``."""
        return list(self._results.validation_history)

    # -- dist-keras's getters and setters (`compat`) -------------------------------------

    def set_model(self, model):
        """Trains ``model`` (a `keras.Model`) from now on, as ``keras_model`` would."""
        self.master_model = model

    def has_history(self):
        """Whether the last `train()` recorded any step."""
        return len(self.get_history()) > 0

    set_max_prefetch = compat.set_max_prefetch
    get_features_column = compat.getter("features_col")
    get_label_column = compat.getter("label_col")
    get_minibatch_size = compat.getter("batch_size")
    set_minibatch_size = compat.setter("batch_size", "the rows per minibatch")
    get_num_epoch = compat.getter("num_epoch")
    set_num_epoch = compat.setter("num_epoch", "the passes over the data")
