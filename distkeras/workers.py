"""Workers: run on the executors, train a replica of the model on one partition.

A worker is built on the driver (it holds the model as `.keras` bytes and the training
settings), shipped to the executors by Spark, and there rebuilds the model, reads its
partition as minibatches and runs `optimize()`. Network workers talk to the parameter
server on the driver with `pull()` and `commit()`.

Its step history is kept and sent by `distkeras.step_history`, its model's seed and
optimizer state by `distkeras.model_state`, its exchanges with the server checked by
`distkeras.exchange_checks`, and Keras prepared on the executor by
`distkeras.executor_backend`.
"""

import logging
import math
import re
import time

import numpy as np

from distkeras import algorithms
from distkeras import networking
from distkeras import update_rules
from distkeras.errors import UnretryableError
from distkeras.affinity import claimed_cores
from distkeras.algorithms import WorkerContext
from distkeras.exchange_checks import checked_update, learning_rate_field
from distkeras.executor_backend import _enable_compilation_cache, _ensure_backend
from distkeras.data.feed import MinibatchFeed, input_names, integer_dtype, output_keys
from distkeras.model_state import (finalize_weights, get_optimizer_state, seed_states,
                                   seed_worker_generators, set_optimizer_state)
from distkeras.networking import weights_array
from distkeras.step_history import (HistoryLog, ProgressReporter, _to_float, pack_history,
                                    send_history_columns)

logger = logging.getLogger(__name__)

class WorkerFailure(RuntimeError):
    """A worker's training failed; the message names its partition and the cause."""


def _class_indices(label_shape, output_shape):
    """Whether labels of ``label_shape`` are class indices for an output of
    ``output_shape``: one number per row, or per step of an output of several axes."""
    output_shape = tuple(output_shape)
    return bool(output_shape) and tuple(label_shape) == output_shape[:-1]


def _as_list(value):
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def unretryable_error(error):
    """The `UnretryableError` that caused ``error`` (itself, or one it was raised from),
    or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UnretryableError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def one_line(error):
    """``"Type: message"`` of an exception on one line: the driver shows the line of a
    failed Spark job that names the worker's exception, and Keras's layer errors put their
    cause on the lines after "Exception encountered when calling ..." (in bold: ANSI
    codes)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(error).__name__}: {error}")
    return " ".join(text.split())


def _batch_size(x):
    if isinstance(x, dict):  # a model built on a dict of inputs
        x = list(x.values())
    return len(x[0]) if isinstance(x, (list, tuple)) else len(x)


def overrides_train_step(model):
    """Whether ``model``'s class defines a `train_step` of its own (Keras's guides)."""
    import keras

    return type(model).train_step is not keras.Model.train_step


def pack_train_function_as_fit(model):
    """Makes ``model``'s train function hand `train_step` each batch as `fit` does.

    Keras's `train_on_batch` passes ``(x, y, None)`` to the model's train function on every
    backend, where `fit` passes ``(x, y)`` (the weights only when there are some): a
    `train_step` of the user's own that unpacks ``x, y = data`` trained under `fit` and
    failed under `train_on_batch` with "too many values to unpack". Wrapping the train
    function, rather than calling it ourselves, keeps the rest of `train_on_batch` as Keras
    has it on each backend (the symbolic and optimizer builds, the metrics reset, the
    state sync on JAX). Does nothing when the function is wrapped already.

    Args:
        model: A compiled `keras.Model`.
    """
    from distkeras.data.sample_weights import fit_data

    model.make_train_function()
    train_function = model.train_function
    if getattr(train_function, "packs_as_fit", False):
        return

    def as_fit(batch):
        if isinstance(batch, tuple) and len(batch) == 3:
            return fit_data(*batch)
        return batch

    def train_function_as_fit(*args):
        # The batches come last: after the state on JAX, alone on tensorflow and torch; a
        # list (torch indexes it) or an iterator (JAX takes next(), tensorflow iterates).
        *state, batches = args
        packed = [as_fit(batch) for batch in batches]
        return train_function(*state, packed if isinstance(batches, list) else iter(packed))

    train_function_as_fit.packs_as_fit = True
    model.train_function = train_function_as_fit


class ModelReplica:
    """The worker's Keras model, with numpy-2 friendly weights and a record of every step.

    ``get_weights()`` returns an object array of per-layer arrays, so the seed's
    ``np.asarray(self.model.get_weights())`` and ``W1 - W2`` work on numpy 2. Every
    ``train_on_batch`` call is recorded in the worker's history. On the JAX backend steps
    run through `JaxTrainStep` (fit's speed); everything else is the Keras model's own.
    """

    def __init__(self, model, on_batch, on_window=None):
        from distkeras.jax_steps import JaxTrainStep

        self._model = model
        self._on_batch = on_batch
        self._on_window = on_window
        self._fast_step = JaxTrainStep(model) if JaxTrainStep.supported(model) else None
        # Keras's own train_step reads (x, y, None) as it is: those models keep exactly
        # Keras's train_on_batch.
        self._packs_as_fit = overrides_train_step(model)
        # The metric variables' values after the last step (one per step along their first
        # axis after a window), from zero at the step's start.
        self.metric_values = None

    def _sync(self):
        if self._fast_step is not None:
            self._fast_step.sync()

    def get_weights(self):
        if self._fast_step is not None:
            weights = self._fast_step.get_weights()
            if weights is not None:
                return weights_array(weights)
        self._sync()
        return weights_array(self._model.get_weights())

    def set_weights(self, weights):
        if self._fast_step is not None and self._fast_step.set_weights(list(weights)):
            return
        self._sync()
        self._model.set_weights(list(weights))

    def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None,
                       return_dict=False):
        batch_size = _batch_size(x)
        if self._fast_step is not None and class_weight is None:
            logs = self._fast_step(x, y, sample_weight)
            self.metric_values = self._fast_step.metric_values
            self._on_batch(logs, batch_size)
            if not return_dict:
                values = [_to_float(value) for value in logs.values()]
                return values[0] if len(values) == 1 else values
            return {key: _to_float(value) for key, value in logs.items()}
        self._sync()
        if self._packs_as_fit:
            pack_train_function_as_fit(self._model)
        logs = self._model.train_on_batch(
            x, y, sample_weight=sample_weight, class_weight=class_weight, return_dict=True
        )
        # Keras's train_on_batch resets the metrics first: the state is this batch's.
        self.metric_values = [variable.value for variable in self._model.metrics_variables]
        self._on_batch(logs, batch_size)
        if return_dict:
            return logs
        values = list(logs.values())
        return values[0] if len(values) == 1 else values

    def train_on_window(self, batches):
        """Trains one step per ``(x, y)`` or ``(x, y, sample_weight)`` in ``batches``,
        recording each step.

        On the JAX fast path, same-sized batches run in one compiled call (no Python
        between the steps, as `fit` with ``steps_per_execution``); otherwise step by step.
        """
        if not self.runs_window(batches):
            for batch in batches:
                self.train_on_batch(*batch)
            return
        logs = self._fast_step.run_window(batches)
        self.metric_values = self._fast_step.metric_values
        self._on_window(logs, _batch_size(batches[0][0]), len(batches))

    def runs_window(self, batches):
        """Whether `train_on_window` runs ``batches`` in one compiled call (the JAX fast
        path, several batches of one size), rather than step by step."""
        sizes = {_batch_size(batch[0]) for batch in batches}
        return self._fast_step is not None and len(batches) >= 2 and len(sizes) == 1

    def prefers_window(self, batches):
        """Whether ``batches`` should run in one compiled call: it can (`runs_window`)
        and, for this model, one call is faster than a call per step (`CallLength`)."""
        return self.runs_window(batches) and self._fast_step.call_length.wants_one_call()

    def set_optimizer_state(self, values):
        """Sets the optimizer's variables (see `set_optimizer_state`)."""
        self._sync()
        set_optimizer_state(self._model, values)

    def __getattr__(self, name):
        self._sync()
        return getattr(self._model, name)


class Worker:
    """Trains a replica of the model on one partition.

    Arguments left as None are filled in by the trainer that runs the worker, so a
    custom worker can be built with just ``MyWorker(self.master_model)``.

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

    def __init__(self, model, optimizer=None, loss=None, loss_weights=None, metrics=None,
                 features_col=None, label_col=None, batch_size=None, num_epoch=None,
                 learning_rate=None):
        from distkeras.utils import serialize_keras_object, serialize_model

        self.master_model = model if isinstance(model, (bytes, bytearray)) \
            else serialize_model(model)
        self.optimizer = serialize_keras_object(optimizer)
        self.loss = serialize_keras_object(loss)
        self.loss_weights = loss_weights
        self.metrics = serialize_keras_object(metrics)
        self.features_col = features_col
        self.label_col = label_col
        self.batch_size = batch_size
        self.num_epoch = num_epoch
        self.learning_rate = learning_rate
        self.backend = None
        self.custom_objects = {}  # set by the trainer: see `distkeras.custom_objects`
        self.weighted_metrics = None  # set by the trainer: a compiled model's
        # Set by the trainer: a compiled model's jit_compile, run_eagerly, steps_per_execution.
        self.execution_options = {}
        self.worker_id = 0
        self.iteration = 1
        # Set by a trainer that runs a job per epoch: {worker_id: its first iteration}.
        self.first_iterations = None
        self._trained_samples = 0
        self.model = None
        self.trainable = None  # set with the model: see `prepare_model`
        self.history = HistoryLog()
        self.workers_per_machine = None  # set by the trainer; see `affinity.claimed_cores`
        # Set by the trainer: the master model's seed generator states (see `seed_states`),
        # which the `.keras` bytes do not hold.
        self.seed_states = None
        self._feed = None

    # -- on the executor -------------------------------------------------------------

    def prepare_model(self):
        """Rebuilds the model from its `.keras` bytes and compiles it."""
        _ensure_backend(self.backend)
        _enable_compilation_cache()
        from distkeras import custom_objects
        from distkeras.utils import compile_arguments

        with custom_objects.scope(getattr(self, "custom_objects", None)):
            model = self.build_model()
            model.compile(**compile_arguments(self.optimizer, self.loss, self.metrics,
                                              self.loss_weights,
                                              getattr(self, "weighted_metrics", None),
                                              model=model),
                          # Steps as the model's own fit runs them (eagerly, without XLA).
                          **(getattr(self, "execution_options", None) or {}))
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
        from distkeras.utils import deserialize_model

        return deserialize_model(bytes(self.master_model))

    def initial_seed_states(self, model):
        """The seed generator states this worker's random layers start from, before its
        id is folded in (see `seed_worker_generators`): the master model's, which the
        trainer sets, or else those ``model`` drew when it was built."""
        states = getattr(self, "seed_states", None)
        return seed_states(model) if states is None else states

    def _record_step(self, logs, batch_size):
        record = {"worker_id": self.worker_id, "iteration": self.iteration,
                  "timestamp": time.time(), "batch_size": batch_size,
                  "epoch": self._epoch_of_steps(batch_size, 1)}
        record.update(logs)
        self.history.append(record)
        values = getattr(self.model, "metric_values", None)
        if values is not None:
            self.history.metric_sums.bind(self.model._model)
            self.history.metric_sums.add(record["epoch"], values)

    def _record_window(self, logs, batch_size, count):
        """Records ``count`` steps whose logs hold one value per step."""
        now = time.time()
        record = {"worker_id": self.worker_id,
                  "iteration": np.arange(self.iteration, self.iteration + count),
                  "timestamp": np.full(count, now), "batch_size": batch_size,
                  "epoch": self._epoch_of_steps(batch_size, count)}
        record.update(logs)
        self.history.extend(record, count)
        values = getattr(self.model, "metric_values", None)
        if values is not None:
            self.history.metric_sums.bind(self.model._model)
            self.history.metric_sums.add_window(record["epoch"], values)

    def _epoch_of_steps(self, batch_size, count):
        """The epoch (from 0) of the next ``count`` steps of ``batch_size`` samples (an int
        for one step, an array for several), counting them as trained. The feed reads
        ahead of training, so each step's epoch comes from the samples trained before it."""
        trained = getattr(self, "_trained_samples", 0)
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
        seen = self.__dict__.setdefault("_compiled_steps", set())
        sizes = {_batch_size(batch[0]) for batch in batches}
        keys = {("window", len(batches), *sizes)} if whole else \
            {("step", size) for size in sizes}
        if keys - seen:
            seen.update(keys)
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

    def _sample_shapes(self, tensors):
        return [tuple(int(dim) for dim in tensor.shape[1:]) for tensor in tensors]

    def _label_shapes(self, label_shapes):
        """Output shapes, or the output's shape without its last axis where the data
        carries class indices (``()`` for scalar labels)."""
        output_shapes = self._sample_shapes(self.model.outputs)
        return [tuple(given) if _class_indices(given, output) else output
                for given, output in zip(label_shapes, output_shapes)]

    def open_feed(self, record_batches, label_shapes):
        """Prepares `get_next_minibatch` over this partition's Arrow record batches."""
        features_cols = _as_list(self.features_col)
        label_cols = _as_list(self.label_col)
        # Class indices for an output of several classes: checked.
        num_classes = [output[-1] if _class_indices(given, output) and output[-1] > 1
                       else None for given, output in
                       zip(label_shapes, self._sample_shapes(self.model.outputs))]
        self._trained_samples = 0
        self._feed = MinibatchFeed(
            record_batches, features_cols, label_cols, self.batch_size,
            self._sample_shapes(self.model.inputs), self._label_shapes(label_shapes),
            single_input=not isinstance(self.features_col, (list, tuple)),
            single_output=not isinstance(self.label_col, (list, tuple)),
            weight_col=getattr(self, "sample_weight_col", None),
            class_table=getattr(self, "class_table", None), num_classes=num_classes,
            feature_dtypes=[integer_dtype(tensor) for tensor in self.model.inputs],
            output_shapes=self._sample_shapes(self.model.outputs),
            input_names=input_names(self.model), output_keys=output_keys(self.model),
        )

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
        self.iteration = (getattr(self, "first_iterations", None) or {}).get(
            worker_id, self.iteration)
        with claimed_cores(getattr(self, "workers_per_machine", None)):
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
                    hint = self._weighted_unpack_hint(error)
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

    def _weighted_unpack_hint(self, error):
        """What to write instead, when a custom loop's ``x, y = self.get_next_minibatch()``
        meets weighted training (Python says only "too many values to unpack")."""
        weighted = (getattr(self, "sample_weight_col", None) is not None
                    or getattr(self, "class_table", None) is not None)
        if not weighted or "too many values to unpack" not in str(error):
            return None
        return (f"{error} in {type(self).__name__}.optimize(): with sample_weight_col or "
                "class_weight, get_next_minibatch() returns (x, y, sample_weight). Write "
                "`x, y, *weights = self.get_next_minibatch()` and "
                "`self.model.train_on_batch(x, y, *weights)`.")

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


def send_failure(sock, error, worker_id):
    """Tells the driver's server on ``sock`` of the error that stops worker ``worker_id``
    (`SocketParameterServer.handle_failure`); the server then closes the connection. A
    failure to send only logs: the task's own reply still carries the error."""
    try:
        networking.send_action(sock, networking.ACTION_FAILURE)
        networking.send_data(sock, {"error": one_line(error)})
    except OSError as cause:
        logger.warning("Worker %s could not report its failure: %s", worker_id, cause)


class SequentialWorker(Worker):
    """Trains alone on all its data; returns the weights and history (SingleTrainer).

    SingleTrainer runs one of these per epoch when the driver acts at epoch ends: it then
    sets ``optimizer_state`` (to start from) and ``return_optimizer_state``. With
    ``progress_address`` (and ``token``) set, the steps' records go to the driver as they
    happen (see `ProgressReporter`) rather than with the result.
    """

    STEPS_PER_CALL = 16
    # The progress server is up before the task starts: a refusal means unreachable.
    PROGRESS_CONNECT_SECONDS = 3.0
    optimizer_state = None
    return_optimizer_state = False
    progress_address = None
    token = None
    _reporter = None

    def prepare_model(self):
        super().prepare_model()
        if self.optimizer_state is not None:
            # On the Keras model itself, before the first step reads its variables.
            set_optimizer_state(self.model._model, self.optimizer_state)

    def setup(self):
        if self.progress_address is None:
            return
        reporter = ProgressReporter(*self.progress_address, self.token)
        try:
            reporter.open(self.worker_id, timeout=self.PROGRESS_CONNECT_SECONDS)
        except OSError as error:  # progress is optional: train without it
            logger.warning("Worker %s cannot reach the driver's progress server %s (%s); "
                           "training without progress reports.", self.worker_id,
                           self.progress_address, error)
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
        if self.return_optimizer_state:
            message["optimizer_state"] = get_optimizer_state(self.model)
        message.update(pack_history(self.history.drain()))
        message.update(self.history.drain_metric_sums())
        return message


def _variables_bytes(variables):
    """The bytes of Keras variables' values, from their shapes and dtypes."""
    return sum(math.prod(variable.shape) * np.dtype(variable.dtype).itemsize
               for variable in variables)


class NetworkWorker(Worker):
    """A worker that talks to the parameter server with `pull()` and `commit()`.

    The steps' records reach the driver with the commits, at most every
    ``HISTORY_EVERY_SECONDS`` (the progress bar's pace) and at the end.

    Args:
        model, optimizer, loss, loss_weights, metrics, features_col, label_col,
        batch_size, num_epoch, learning_rate: See `Worker`.
        master_host: The parameter server's address (set by the trainer).
        master_port: The parameter server's port (set by the trainer).
        communication_window: Local steps between two commits.
    """

    def __init__(self, model, optimizer=None, loss=None, loss_weights=None, metrics=None,
                 features_col=None, label_col=None, batch_size=None, num_epoch=None,
                 master_host=None, master_port=None, communication_window=None,
                 learning_rate=None):
        super().__init__(model, optimizer, loss, loss_weights, metrics, features_col,
                         label_col, batch_size, num_epoch, learning_rate)
        self.master_host = master_host
        self.master_port = master_port
        self.communication_window = communication_window
        self.token = None
        self.connect_timeout = 60.0
        self.center_variable = None
        self.last_update = 0
        self.socket = None
        self._last_flush = float("-inf")

    HISTORY_EVERY_SECONDS = 0.5

    def setup(self):
        self._failure_reported = False
        self.socket = networking.Connection(
            networking.connect(self.master_host, self.master_port,
                               timeout=self.connect_timeout),
            max_frame_bytes=self._reply_limit_bytes())
        networking.authenticate(self.socket, self.token, self.worker_id,
                                networking.task_attempt_id())

    def _reply_limit_bytes(self):
        """The largest frame this worker reads from its server: room for the weights
        twice and the optimizer's state (an epoch server's reply), so a model past 2 GiB
        comes back whole, while a lying length field is still refused."""
        keras_model = getattr(self.model, "_model", self.model)
        weights = _variables_bytes(keras_model.weights)
        optimizer = getattr(keras_model, "optimizer", None)
        if optimizer is not None and getattr(optimizer, "built", False):
            state = _variables_bytes(optimizer.variables)
        else:  # built at the first step: room for Adam's two moments and AMSGrad's third
            state = 3 * weights
        return max(networking.DEFAULT_MAX_FRAME_BYTES, 2 * weights + state + (1 << 20))

    def teardown(self):
        if self.socket is None:
            return
        try:
            self.before_goodbye()
            self.flush_history()
            # The goodbye says the partition is done: a failed task that Spark retries
            # only closes (the driver's monitor would end the epochs it has not trained).
            if getattr(self, "completed", True):
                networking.send_action(self.socket, networking.ACTION_QUIT)
        except OSError as error:
            # A worker that failed is most often one the driver stopped (another worker's
            # invalid rows, a callback's error): the server is gone, and a warning of a
            # broken pipe would sit beside the error that matters.
            log = logger.warning if getattr(self, "completed", True) else logger.info
            log("Worker %s could not say goodbye to the server: %s", self.worker_id, error)
        networking.close_socket(self.socket)
        self.socket = None

    def before_goodbye(self):
        """Hook run before the last history and the goodbye are sent."""

    def before_compile(self):
        # An exchange in flight on the background thread shares the socket: let it end
        # first, or the two frames would interleave (rare: compiles are few).
        wait = getattr(self, "wait_for_exchange", None)
        if wait is not None:
            wait()
        networking.send_action(self.socket, networking.ACTION_COMPILING)

    def report_failure(self, error):
        """Sends the error that stops this worker to the server (once), whose driver then
        stops the job rather than wait for the other workers or Spark's retries."""
        if self.socket is None or getattr(self, "_failure_reported", False):
            return
        self._failure_reported = True
        send_failure(self.socket, error, self.worker_id)

    def pull(self):
        """Fetches the center variable into ``self.center_variable``."""
        networking.send_action(self.socket, networking.ACTION_PULL)
        data = networking.recv_data(self.socket)
        self.center_variable = data["center"]
        self.last_update = data.get("num_updates", 0)
        self._note_learning_rate(data)
        self.apply_server_learning_rate()

    def pull_unless_own(self):
        """Like `pull`, but the server sends no weights when only this worker's commits
        changed the center since its last pull and its rule adds commits as sent.

        A learning rate the reply brings is kept, not applied (this may run on the
        exchange thread while the model trains): the caller applies it with
        `apply_server_learning_rate`, as `communicate` does.

        Returns:
            True when no weights came: the center is then the last pulled one plus this
            worker's commit since, which the caller computes (``center_variable`` is left
            for it to set).
        """
        networking.send_action(self.socket, networking.ACTION_PULL_UNLESS_OWN)
        data = networking.recv_data(self.socket)
        self.last_update = data.get("num_updates", 0)
        self._note_learning_rate(data)
        if data.get("unchanged") is True:
            return True
        if "center" not in data:
            raise networking.ProtocolError("The server's pull reply carries no center.")
        self.center_variable = data["center"]
        return False

    def _note_learning_rate(self, data):
        """Keeps the learning rate a pull reply carries (the driver's callbacks set it)."""
        rate = learning_rate_field(data, "optimizer_learning_rate")
        if rate is not None:
            self._server_learning_rate = rate

    def apply_server_learning_rate(self):
        """Gives the local optimizer the learning rate that the driver's callbacks
        (``ReduceLROnPlateau``, ``LearningRateScheduler``) set, when it changed since the
        last one applied."""
        rate = getattr(self, "_server_learning_rate", None)
        if rate is None or rate == getattr(self, "_applied_learning_rate", None):
            return
        self.model.optimizer.learning_rate = rate
        self._applied_learning_rate = rate
        logger.info("Worker %s: learning rate %g from the driver", self.worker_id, rate)

    def commit(self, delta, **extra):
        """Sends an update (``delta``, plus any extra fields) to the parameter server."""
        self.send_commit(delta, **extra)
        if self.history_due():
            self.flush_history()

    def send_commit(self, delta, **extra):
        """Sends the commit message alone (no history)."""
        delta = checked_update(delta, getattr(self, "weight_spec", None),
                               f"{type(self).__name__}.commit()")
        message = {"delta": delta, "worker_id": self.worker_id,
                   "last_update": self.last_update}
        message.update(extra)
        networking.send_action(self.socket, networking.ACTION_COMMIT)
        networking.send_data(self.socket, message)

    def history_due(self):
        """Whether the recorded steps should travel with this commit: every
        ``HISTORY_EVERY_SECONDS``, and as soon as they hold a new epoch's (the driver ends
        an epoch, on the center as it is then, when every worker's records show it over)."""
        return time.monotonic() - self._last_flush >= self.HISTORY_EVERY_SECONDS or \
            getattr(self, "latest_epoch", 0) > getattr(self, "_reported_epoch", 0)

    def flush_history(self):
        """Sends the steps recorded since the last flush to the driver, keeping none."""
        self.send_history(*self.drain_history())

    def drain_history(self):
        """The steps recorded since the last drain, as columns, and the metric sums
        drained with them (see `HistoryLog.drain_metric_sums`), forgotten here."""
        self._reported_epoch = getattr(self, "latest_epoch", 0)
        return self.history.drain(), self.history.drain_metric_sums()

    def send_history(self, columns, metric_sums=None):
        """Sends drained history columns and metric sums (nothing when there are none)."""
        self._last_flush = time.monotonic()
        send_history_columns(self.socket, columns, metric_sums)


class WindowedWorker(NetworkWorker):
    """The loop every built-in asynchronous worker shares, run by an `Algorithm`.

    Pull, then train; every ``communication_window`` steps (and once more after the last
    step, so no work is lost) call `communicate`, which commits what ``algorithm``
    says (`Algorithm.commit`) and continues from where it says. A subclass without an
    algorithm (the escape hatch) defines `communicate`, or only `window_update`.

    With ``overlap_communication`` (algorithms that commit, then pull: DOWNPOUR, ADAG,
    DynSGD, ...), the exchange with the server runs on a background thread while the next
    window trains: at a boundary the worker sends its update, applies that same update
    to the last center it received and trains on from there; the new center arrives during
    the window and is used at the next boundary. One worker alone follows exactly the
    same path as without overlap; with several, the others' commits reach a worker one
    window later.

    Args:
        model: A `keras.Model` or the bytes of a `.keras` archive.
        *args: `NetworkWorker`'s other arguments, in its order.
        algorithm: The `Algorithm` to run; None: the class's ``algorithm_class`` built
            from the keyword arguments that name its hyperparameters.
        **kwargs: See `NetworkWorker`, and the hyperparameters.
    """

    overlap_communication = False
    algorithm_class = None

    def __init__(self, model, *args, algorithm=None, **kwargs):
        if algorithm is None and self.algorithm_class is not None:
            names = {parameter.name for parameter in self.algorithm_class.hyperparameters}
            algorithm = self.algorithm_class(**{name: kwargs[name] for name in names
                                                if kwargs.get(name) is not None})
            kwargs = {name: value for name, value in kwargs.items()
                      if name not in names or name == "learning_rate"}
        super().__init__(model, *args, **kwargs)
        self.algorithm = algorithm
        self.local_state = {}  # the algorithm's own state on this worker (a velocity, ...)

    def optimize(self):
        self.pull()
        self.model.set_weights(self.center_variable)
        self.window_start = self.center_variable
        exchange = self.communicate
        if self.overlap_communication:
            self._check_overlap()
            exchange = self.communicate_overlapped
        # The steps left until the next window boundary (a window counts iterations).
        wanted = self.communication_window - (self.iteration - 1) % self.communication_window
        batches = self.take_minibatches(wanted)
        while batches:
            self.train_steps(batches)
            # Read the next window's minibatches while this one computes (JAX runs the
            # steps asynchronously); the exchange then waits for the weights.
            complete = len(batches) == wanted
            wanted = self.communication_window
            upcoming = self.take_minibatches(wanted) if complete else []
            exchange()
            batches = upcoming
        self.wait_for_exchange()

    def has_own_step(self):
        return (getattr(self.algorithm, "local_step", None) is not None
                or type(self).train_step is not WindowedWorker.train_step)

    def train_step(self, x, y, sample_weight=None):
        """One local step: the algorithm's `local_step` where it has one."""
        step = getattr(self.algorithm, "local_step", None)
        if step is None:
            return super().train_step(x, y, sample_weight)
        return step(self.model, (x, y, sample_weight), self.local_state)

    def communicate(self):
        """Exchanges with the parameter server at the end of a window.

        Commits the algorithm's update (pulling first where it says so), pulls, and goes
        on from where it says (by default the new center). When the server adds commits
        as sent and no other worker committed since, it sends no weights back
        (`pull_unless_own`): the center is the pulled one plus this update.
        """
        algorithm = self.algorithm
        pull_first = getattr(algorithm, "pull_first", False)
        if pull_first:
            self.pull()
        weights = self.model.get_weights()
        pulled = self.center_variable
        update = self.window_update(weights, pulled)
        extra = {"center": pulled} if getattr(algorithm, "sends_pulled", False) else {}
        self.commit(update, **extra)
        if not pull_first:
            if self.pull_unless_own():
                # Only this commit moved the center: the server's own addition, done here.
                self.center_variable = update_rules.add_update(pulled, update)
            self.apply_server_learning_rate()
        if algorithm is None:
            self.model.set_weights(self.center_variable)
        else:
            self.model.set_weights(algorithm.continue_from(weights, update,
                                                           self.center_variable))

    def window_update(self, weights, start):
        """The commit for a window that began at ``start`` and ended at ``weights``:
        the algorithm's `commit`."""
        if self.algorithm is None:
            raise NotImplementedError(
                f"{type(self).__name__} must define communicate() or window_update().")
        return self.algorithm.commit(
            weights, start, WorkerContext(self.communication_window, self.trainable))

    def _check_overlap(self):
        algorithm = self.algorithm
        if algorithm is None:
            able = type(self).window_update is not WindowedWorker.window_update
        else:
            able = algorithm.overlaps
        if not able:
            raise ValueError(
                f"{type(self).__name__} cannot overlap communication: its algorithm "
                "pulls before it commits, or sends the center it pulled. Use "
                "overlap_communication=False (the CLI: leave out --overlap-communication).")

    def communicate_overlapped(self):
        """Sends this window's update in the background and trains on without waiting."""
        from concurrent.futures import ThreadPoolExecutor

        update = self.window_update(self.model.get_weights(), self.window_start)
        self.wait_for_exchange()  # the previous exchange's center is in center_variable
        self.apply_server_learning_rate()  # one it brought, here on the training thread
        self.window_start = update_rules.add_update(self.center_variable, update)
        self.model.set_weights(self.window_start)
        history = self.drain_history() if self.history_due() else None
        if getattr(self, "_exchanger", None) is None:
            self._exchanger = ThreadPoolExecutor(1, thread_name_prefix="distkeras-exchange")
        self._pending_exchange = self._exchanger.submit(
            self._exchange, update, history, self.window_start)

    def _exchange(self, update, history, center_if_only_own):
        self.send_commit(update)
        if history is not None:
            self.send_history(*history)
        if self.pull_unless_own():
            self.center_variable = center_if_only_own

    def wait_for_exchange(self):
        """Waits for a background exchange to finish; raises what it raised."""
        pending = getattr(self, "_pending_exchange", None)
        if pending is not None:
            self._pending_exchange = None
            pending.result()

    def report_failure(self, error):
        # An exchange in flight on the background thread shares the socket: let it end
        # first, or the two frames would interleave.
        try:
            self.wait_for_exchange()
        except (OSError, networking.ProtocolError) as cause:
            logger.warning("Worker %s: the last exchange failed: %s", self.worker_id, cause)
        super().report_failure(error)

    def before_goodbye(self):
        try:
            self.wait_for_exchange()
        except (OSError, networking.ProtocolError) as error:
            logger.warning("Worker %s: the last exchange failed: %s", self.worker_id, error)
        if getattr(self, "_exchanger", None) is not None:
            self._exchanger.shutdown()
            self._exchanger = None


class DOWNPOURWorker(WindowedWorker):
    """DOWNPOUR's worker (`algorithms.DOWNPOUR`)."""

    algorithm_class = algorithms.DOWNPOUR


class ADAGWorker(WindowedWorker):
    """ADAG's worker (`algorithms.ADAG`)."""

    algorithm_class = algorithms.ADAG


class DynSGDWorker(WindowedWorker):
    """DynSGD's worker (`algorithms.DynSGD`): commits carry the count of its last pull."""

    algorithm_class = algorithms.DynSGD


class AEASGDWorker(WindowedWorker):
    """AEASGD's worker (`algorithms.AEASGD`): takes ``rho`` and ``learning_rate``."""

    algorithm_class = algorithms.AEASGD


class EAMSGDWorker(AEASGDWorker):
    """EAMSGD's worker (`algorithms.EAMSGD`): takes ``momentum`` too."""

    algorithm_class = algorithms.EAMSGD

    def __init__(self, model, *args, momentum=0.9, **kwargs):
        if kwargs.get("algorithm") is None:
            kwargs["momentum"] = momentum
        super().__init__(model, *args, **kwargs)

    @property
    def momentum(self):
        """The local momentum (0: AEASGD's steps, on the window path)."""
        return self.algorithm.momentum

    @property
    def velocity(self):
        """The local momentum's velocity (None before the first step)."""
        return self.local_state.get("velocity")


class ExperimentalWorker(WindowedWorker):
    """The research scaffold's worker (`algorithms.Experimental`)."""

    algorithm_class = algorithms.Experimental


class EnsembleWorker(SequentialWorker):
    """Trains an independent model: fresh initial weights seeded by the worker's index."""

    def __init__(self, model, seed=None, **kwargs):
        super().__init__(model, **kwargs)
        self.seed = seed

    def build_model(self):
        import keras

        from distkeras.utils import tensorflow_only_once_imported

        model = super().build_model()
        # On the executor: seeding an installed but unused TensorFlow would import it.
        tensorflow_only_once_imported("keras.src.utils.rng_utils")
        keras.utils.set_random_seed((self.seed or 0) + self.worker_id)
        return keras.models.clone_model(model)  # new layers, new initial weights

    def initial_seed_states(self, model):
        # The member's own, drawn from its seed when its layers were cloned (a layer's
        # explicit seed stays that seed: `worker_seed` still sets the members apart).
        return seed_states(model)

    def finish(self):
        # A member trains alone, as its own `fit` would: it ends as fit ends, with the
        # optimizer's moving averages as its weights where use_ema=True.
        finalize_weights(self.model)


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
        model = self.model._model
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
        for epoch in range(self.num_epoch):
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
            self._taken += _batch_size(batch[0])
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
