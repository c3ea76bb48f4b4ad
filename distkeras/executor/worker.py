"""The base `Worker`: on an executor, rebuilds the model, reads its partition as
minibatches, runs `optimize()` and returns its message to the driver.

A worker is built on the driver and holds its `TaskSpec` (the model as `.keras` bytes and
the training settings); Spark ships both to the executors. Its step history is kept and
sent by `distkeras.executor.step_history`, its model's seed and optimizer state by
`keras_io.model_state`, and Keras prepared on the executor by `executor.backend`.
"""

import time

import numpy as np

from distkeras.algorithms import update_rules
from distkeras.data.feed import MinibatchFeed, input_names, integer_dtype, output_keys
from distkeras.executor.affinity import claimed_cores
from distkeras.executor.backend import enable_compilation_cache, ensure_backend
from distkeras.executor.failures import unretryable_error
from distkeras.executor.replica import ModelReplica, batch_size_of
from distkeras.executor.step_history import HistoryLog
from distkeras.executor.task_spec import SpecSetting, TaskSpec
from distkeras.keras_io import custom_objects
from distkeras.keras_io.archives import deserialize_model, serialize_model
from distkeras.keras_io.compile_config import compile_arguments, serialize_keras_object
from distkeras.keras_io.model_state import seed_states, seed_worker_generators


def class_indices(label_shape, output_shape):
    """Whether labels of ``label_shape`` are class indices for an output of
    ``output_shape``: one number per row, or per step of an output of several axes."""
    output_shape = tuple(output_shape)
    return bool(output_shape) and tuple(label_shape) == output_shape[:-1]


def as_list(value):
    """``value`` as a list: [] for None, itself for a list or tuple, else ``[value]``."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def sample_shapes(tensors):
    """The shape of one sample of each of ``tensors`` (their batch axis left out)."""
    return [tuple(int(dim) for dim in tensor.shape[1:]) for tensor in tensors]


def minibatch_feed(spec, model, record_batches, label_shapes):
    """The `MinibatchFeed` of ``spec``'s columns over ``record_batches`` for ``model``.

    Labels given as class indices (``label_shapes`` one axis short of the output's) are
    read as such, and checked against the output's classes.
    """
    output_shapes = sample_shapes(model.outputs)
    num_classes = [output[-1] if class_indices(given, output) and output[-1] > 1 else None
                   for given, output in zip(label_shapes, output_shapes)]
    labels = [tuple(given) if class_indices(given, output) else output
              for given, output in zip(label_shapes, output_shapes)]
    return MinibatchFeed(
        record_batches, as_list(spec.features_col), as_list(spec.label_col),
        spec.batch_size, sample_shapes(model.inputs), labels,
        single_input=not isinstance(spec.features_col, (list, tuple)),
        single_output=not isinstance(spec.label_col, (list, tuple)),
        weight_col=spec.sample_weight_col, class_table=spec.class_table,
        num_classes=num_classes,
        feature_dtypes=[integer_dtype(tensor) for tensor in model.inputs],
        output_shapes=output_shapes, input_names=input_names(model),
        output_keys=output_keys(model),
    )


def weighted_unpack_hint(worker, error):
    """What to write instead, when a custom loop's ``x, y = self.get_next_minibatch()``
    meets weighted training (Python says only "too many values to unpack"); None when
    ``error`` is not that."""
    weighted = worker.spec.sample_weight_col is not None or \
        worker.spec.class_table is not None
    if not weighted or "too many values to unpack" not in str(error):
        return None
    return (f"{error} in {type(worker).__name__}.optimize(): with sample_weight_col or "
            "class_weight, get_next_minibatch() returns (x, y, sample_weight). Write "
            "`x, y, *weights = self.get_next_minibatch()` and "
            "`self.model.train_on_batch(x, y, *weights)`.")


class Worker:
    """Trains a replica of the model on one partition.

    Arguments left as None are filled in by the trainer that runs the worker, so a
    custom worker can be built with just ``MyWorker(self.master_model)``. They, and the
    trainer's settings, are the worker's `TaskSpec` (``spec``); the attributes named
    after its fields (``batch_size``, ``token``, ...) read and set it.

    Args:
        model: A `keras.Model` or the bytes of a `.keras` archive.
        optimizer: The worker's Keras optimizer (name, instance or config dict).
        loss: The loss (name, instance or config dict).
        loss_weights: Optional loss weights for multi-output models.
        metrics: Metrics to record per step.
        features_col: Input column name, or a list for multi-input models.
        label_col: Target column name, or a list for multi-output models.
        batch_size: Rows per minibatch.
        num_epoch: Passes over the data (the trainer repeats the data that many times).
        learning_rate: Used by update rules that have one.
    """

    master_model = SpecSetting("model_bytes")
    optimizer = SpecSetting()
    loss = SpecSetting()
    loss_weights = SpecSetting()
    metrics = SpecSetting()
    weighted_metrics = SpecSetting()
    execution_options = SpecSetting()
    custom_objects = SpecSetting()
    backend = SpecSetting()
    seed_states = SpecSetting()
    features_col = SpecSetting()
    label_col = SpecSetting()
    sample_weight_col = SpecSetting()
    class_table = SpecSetting()
    batch_size = SpecSetting()
    num_epoch = SpecSetting()
    learning_rate = SpecSetting()
    workers_per_machine = SpecSetting()
    first_iterations = SpecSetting()
    token = SpecSetting()

    def __init__(self, model, optimizer=None, loss=None, loss_weights=None, metrics=None,
                 features_col=None, label_col=None, batch_size=None, num_epoch=None,
                 learning_rate=None):
        self.spec = TaskSpec(
            model_bytes=model if isinstance(model, (bytes, bytearray))
            else serialize_model(model),
            optimizer=serialize_keras_object(optimizer), loss=serialize_keras_object(loss),
            loss_weights=loss_weights, metrics=serialize_keras_object(metrics),
            features_col=features_col, label_col=label_col, batch_size=batch_size,
            num_epoch=num_epoch, learning_rate=learning_rate)
        # What the run changes (on the executor).
        self.worker_id = 0
        self.iteration = 1
        self.model = None
        self.trainable = None  # set with the model: see `prepare_model`
        self.weight_spec = None  # set with the model: see `prepare_model`
        self.history = HistoryLog()
        self.latest_epoch = 0  # of the last step recorded
        self.completed = True  # set False while `optimize` runs (see `run`)
        self._trained_samples = 0
        self._compiled_steps = set()
        self._feed = None

    @property
    def spec(self):
        """The `TaskSpec` this worker trains by."""
        try:
            return self.__dict__["_spec"]
        except KeyError:
            raise AttributeError(
                f"{type(self).__name__} has no task spec yet: its __init__ must call "
                "super().__init__(model, ...) before it reads or sets the worker's "
                "settings.") from None

    @spec.setter
    def spec(self, spec):
        if not isinstance(spec, TaskSpec):
            raise TypeError("A worker's spec must be a distkeras.executor.task_spec."
                            f"TaskSpec. Received: {type(spec).__name__}")
        self._spec = spec

    # -- on the executor -------------------------------------------------------------

    def prepare_model(self):
        """Rebuilds the model from its `.keras` bytes and compiles it."""
        spec = self.spec
        ensure_backend(spec.backend)
        enable_compilation_cache()

        with custom_objects.scope(spec.custom_objects):
            model = self.build_model()
            model.compile(**compile_arguments(spec.optimizer, spec.loss, spec.metrics,
                                              spec.loss_weights, spec.weighted_metrics,
                                              model=model),
                          # Steps as the model's own fit runs them (eagerly, without XLA).
                          **spec.execution_options)
        seed_worker_generators(model, self.initial_seed_states(model), self.worker_id,
                               self.iteration - 1)
        self.model = ModelReplica(model, self._record_step, self._record_window)
        # One flag per entry of get_weights(): False for state such as BatchNormalization's
        # moving statistics (see `update_rules`).
        self.trainable = update_rules.trainable_flags(model)
        # What the parameter server accepts in a commit: one array per entry, so shaped.
        self.weight_spec = [(tuple(variable.shape), np.dtype(variable.dtype))
                            for variable in model.weights]

    def build_model(self):
        """The uncompiled Keras model this worker trains."""
        return deserialize_model(bytes(self.spec.model_bytes))

    def initial_seed_states(self, model):
        """The seed generator states this worker's random layers start from, before its
        id is folded in (see `seed_worker_generators`): the master model's, which the
        trainer sets, or else those ``model`` drew when it was built."""
        states = self.spec.seed_states
        return seed_states(model) if states is None else states

    def _record_step(self, logs, batch_size):
        record = {"worker_id": self.worker_id, "iteration": self.iteration,
                  "timestamp": time.time(), "batch_size": batch_size,
                  "epoch": self._epoch_of_steps(batch_size, 1)}
        record.update(logs)
        self.history.append(record)
        if self.model.metric_values is not None:
            self.history.metric_sums.bind(self.model.keras_model)
            self.history.metric_sums.add(record["epoch"], self.model.metric_values)

    def _record_window(self, logs, batch_size, count):
        """Records ``count`` steps whose logs hold one value per step."""
        now = time.time()
        record = {"worker_id": self.worker_id,
                  "iteration": np.arange(self.iteration, self.iteration + count),
                  "timestamp": np.full(count, now), "batch_size": batch_size,
                  "epoch": self._epoch_of_steps(batch_size, count)}
        record.update(logs)
        self.history.extend(record, count)
        if self.model.metric_values is not None:
            self.history.metric_sums.bind(self.model.keras_model)
            self.history.metric_sums.add_window(record["epoch"], self.model.metric_values)

    def _epoch_of_steps(self, batch_size, count):
        """The epoch (from 0) of the next ``count`` steps of ``batch_size`` samples (an int
        for one step, an array for several), counting them as trained. The feed reads
        ahead of training, so each step's epoch comes from the samples trained before it."""
        trained = self._trained_samples
        self._trained_samples = trained + batch_size * count
        if self._feed is None:
            return 0 if count == 1 else np.zeros(count, np.int64)
        if count == 1:
            epoch = int(self._feed.epoch_of(trained))
        else:
            epoch = self._feed.epoch_of(trained + batch_size * np.arange(count))
        self.latest_epoch = int(np.max(epoch))
        return epoch

    def take_minibatches(self, count):
        """Up to ``count`` next minibatches (fewer, or none, when the data runs out)."""
        batches = []
        try:
            while len(batches) < count:
                batches.append(self.get_next_minibatch())
        except StopIteration:
            pass
        return batches

    def train_steps(self, batches):
        """Trains on each minibatch in turn, advancing ``self.iteration``.

        Runs the steps in one compiled call unless a subclass defines its own `train_step`.
        """
        whole = not self.has_own_step() and self.model.prefers_window(batches)
        self._note_compiles(batches, whole)
        if not whole:
            for batch in batches:
                self.train_step(*batch)
                self.iteration += 1  # each step recorded with its own iteration
            return
        self.model.train_on_window(batches)
        self.iteration += len(batches)

    def _note_compiles(self, batches, whole):
        """Calls `before_compile` when these batches need a step not compiled yet: one
        window length (``whole``) or batch size (step by step) not trained before."""
        sizes = {batch_size_of(batch[0]) for batch in batches}
        keys = {("window", len(batches), *sizes)} if whole else \
            {("step", size) for size in sizes}
        if keys - self._compiled_steps:
            self._compiled_steps.update(keys)
            self.before_compile()

    def before_compile(self):
        """Hook run before a training step that compiles (network workers tell the
        driver, whose `worker_timeout` then allows for it)."""

    def has_own_step(self):
        """Whether this worker takes its steps its own way (a `train_step` of a
        subclass), which the window path would skip."""
        return type(self).train_step is not Worker.train_step

    def train_step(self, x, y, sample_weight=None):
        """One local step."""
        self.model.train_on_batch(x, y, sample_weight=sample_weight)

    def open_feed(self, record_batches, label_shapes):
        """Prepares `get_next_minibatch` over this partition's Arrow record batches."""
        self._trained_samples = 0
        self._feed = minibatch_feed(self.spec, self.model, record_batches, label_shapes)

    def get_next_minibatch(self):
        """Returns the next ``(x, y)`` minibatch (``(x, y, sample_weight)`` when the
        trainer was given sample or class weights).

        Raises:
            StopIteration: When this partition's data for this run is spent.
        """
        return next(self._feed)

    def run(self, worker_id, record_batches, label_shapes):
        """Trains on one partition; the entry point on the executor.

        Returns:
            A message dict for the driver (see `result`).
        """
        self.worker_id = worker_id
        # A trainer that runs a job per epoch numbers each worker's steps on from its own.
        self.iteration = (self.spec.first_iterations or {}).get(worker_id, self.iteration)
        with claimed_cores(self.spec.workers_per_machine):
            self.prepare_model()
            self.open_feed(record_batches, label_shapes)
            self.setup()
            self.completed = False  # until optimize() and finish() returned
            try:
                try:
                    self.optimize()
                except StopIteration:
                    pass  # the seed's `while True` loop ends when the data runs out
                except ValueError as error:
                    hint = weighted_unpack_hint(self, error)
                    if hint is None:
                        raise
                    raise ValueError(hint) from error
                self.finish()
                self.completed = True
            except Exception as error:
                if unretryable_error(error) is not None:
                    self.report_failure(error)
                raise
            finally:
                self.teardown()
            return self.result()

    def report_failure(self, error):
        """Tells the driver, where this worker talks to it, of the error that stops it
        (one no retry can get past: the driver stops the other workers at once)."""

    def setup(self):
        """Hook run before `optimize()` (network workers connect here)."""

    def finish(self):
        """Hook run after `optimize()` returned normally."""

    def teardown(self):
        """Hook run after training, even when it failed."""

    def result(self):
        """The message this worker returns to the driver."""
        return {"worker_id": self.worker_id, "samples": self._feed.samples}

    def optimize(self):
        """The training loop; subclasses define it."""
        raise NotImplementedError(f"{type(self).__name__} must implement optimize().")
