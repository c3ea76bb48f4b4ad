"""The worker's Keras model on an executor: `ModelReplica`, and how its steps run as
`fit` runs them."""

from distkeras.data.sample_weights import fit_data
from distkeras.executor.step_history import to_float
from distkeras.keras_io.model_state import set_optimizer_state
from distkeras.transport.networking import weights_array


def batch_size_of(x):
    """The rows of a minibatch's inputs ``x`` (an array, a list or a dict of them)."""
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

    Attributes:
        keras_model: The compiled Keras model itself.
        metric_values: The metric variables' values after the last step (one per step
            along their first axis after a window), from zero at the step's start.
    """

    def __init__(self, model, on_batch, on_window=None):
        # Imports JAX: on the executor, once Keras has its backend (`ensure_backend`).
        from distkeras.executor.jax_steps import JaxTrainStep

        self.keras_model = model
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
        return weights_array(self.keras_model.get_weights())

    def set_weights(self, weights):
        if self._fast_step is not None and self._fast_step.set_weights(list(weights)):
            return
        self._sync()
        self.keras_model.set_weights(list(weights))

    def train_on_batch(self, x, y=None, sample_weight=None, class_weight=None,
                       return_dict=False):
        batch_size = batch_size_of(x)
        if self._fast_step is not None and class_weight is None:
            logs = self._fast_step(x, y, sample_weight)
            self.metric_values = self._fast_step.metric_values
            self._on_batch(logs, batch_size)
            if not return_dict:
                values = [to_float(value) for value in logs.values()]
                return values[0] if len(values) == 1 else values
            return {key: to_float(value) for key, value in logs.items()}
        self._sync()
        if self._packs_as_fit:
            pack_train_function_as_fit(self.keras_model)
        logs = self.keras_model.train_on_batch(
            x, y, sample_weight=sample_weight, class_weight=class_weight, return_dict=True
        )
        # Keras's train_on_batch resets the metrics first: the state is this batch's.
        self.metric_values = [variable.value
                              for variable in self.keras_model.metrics_variables]
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
        self._on_window(logs, batch_size_of(batches[0][0]), len(batches))

    def runs_window(self, batches):
        """Whether `train_on_window` runs ``batches`` in one compiled call (the JAX fast
        path, several batches of one size), rather than step by step."""
        sizes = {batch_size_of(batch[0]) for batch in batches}
        return self._fast_step is not None and len(batches) >= 2 and len(sizes) == 1

    def prefers_window(self, batches):
        """Whether ``batches`` should run in one compiled call: it can (`runs_window`)
        and, for this model, one call is faster than a call per step (`CallLength`)."""
        return self.runs_window(batches) and self._fast_step.call_length.wants_one_call()

    def set_optimizer_state(self, values):
        """Sets the optimizer's variables (see `set_optimizer_state`)."""
        self._sync()
        set_optimizer_state(self.keras_model, values)

    def __getattr__(self, name):
        self._sync()
        return getattr(self.keras_model, name)
