"""A faster `train_on_batch` for the JAX backend.

Keras's own `train_on_batch` copies the whole training state back into the model's
variables and waits for the loss after every step. `model.fit` does neither; this does what
fit does: it keeps the state as JAX arrays between steps and writes it back only when the
model's variables are read. Per-step logs stay JAX arrays until they are read, so steps are
dispatched without waiting for the previous one.

Two more costs are removed against a loop over Keras's train function:

* Metrics report per batch (as `train_on_batch` does), so every step starts from reset
  metric variables. The reset happens inside the compiled step (the initial values are
  constants of the trace), not as fresh arrays built in Python before every step. The
  step's metric variables that the worker adds up for the epoch's logs come back too
  (still on the device; see `distkeras.executor.metric_sums`), and only those: a window stacks
  one copy per step, which a metric with a large state the epoch leaves out (a
  ``MeanIoU`` over a thousand classes) would make a copy of hundreds of megabytes.
* The weights the workers exchange every window are read from and written to the JAX state
  directly, without writing the optimizer and metric state back into Keras variables.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np

from distkeras.data.sample_weights import fit_data
from distkeras.executor.metric_sums import EpochMetricSums


class CallLength:
    """Chooses, by timing this model's steps, whether a window runs in one compiled call.

    A window in one call (`jax.lax.scan`) saves Python's dispatch between steps, which
    matters only when a step is short. It can also cost: on the JAX CPU backend a scan of
    convolution or recurrent steps ran 2-4x slower than the same steps called one by one
    (docs/benchmarks.md, "Steps per compiled call"). So the worker first runs single steps
    and times a few; if they are short, it times windows in one call, and keeps the faster.
    A model compiled with ``steps_per_execution`` > 1 always runs its windows in one call,
    as its `fit` would.

    Args:
        one_call: True or False to fix the choice; None to choose by timing.
    """

    SETTLE_STEPS = 2  # steps after the first (which compiles) before the clock starts
    TIMED_STEPS = 8
    # Steps longer than this gain little from a scan (dispatch costs ~0.1 ms): no trial.
    SHORT_STEP_SECONDS = 0.003
    # A trial compiles the scan, which costs about what the first step's compile did; a
    # scan saves ~0.3 ms a step on the MLP, so a compile longer than this (a fresh
    # Transformer's: 3-5 s) would not pay for itself in a training of a few thousand steps.
    # A step read from the compilation cache (`executor_backend`) starts well within it.
    TRIAL_COMPILE_SECONDS = 1.0
    # A scan must save at least this share of the step time to be kept.
    MIN_SAVING = 0.1

    def __init__(self, one_call=None):
        self.one_call = one_call
        self.compile_seconds = None  # the first step's time, compile included
        self.step_seconds = None  # a single step's measured time, once known
        self.window_step_seconds = None
        self._steps = 0
        self._windows = 0
        self._started = None

    def wants_one_call(self):
        """Whether the next window should run in one compiled call."""
        if self.one_call is not None:
            return self.one_call
        return self.step_seconds is not None  # time windows once single steps are timed

    def before_step(self):
        """Starts the clock on the first step (its compile) while undecided."""
        if self.one_call is None and self._steps == 0:
            self._started = _now()

    def after_step(self, state):
        """Times single steps while undecided (blocks three times on ``state``)."""
        if self.one_call is not None or self.step_seconds is not None:
            return
        self._steps += 1
        if self._steps == 1:
            self.compile_seconds = _ready_time(state) - self._started
        elif self._steps == 1 + self.SETTLE_STEPS:
            self._started = _ready_time(state)
        elif self._steps == 1 + self.SETTLE_STEPS + self.TIMED_STEPS:
            self.step_seconds = (_ready_time(state) - self._started) / self.TIMED_STEPS
            if self.step_seconds >= self.SHORT_STEP_SECONDS \
                    or self.compile_seconds > self.TRIAL_COMPILE_SECONDS:
                self.one_call = False

    def before_window(self, state):
        """Starts the clock on the second window in one call (the first compiles)."""
        if self.one_call is None and self.step_seconds is not None:
            self._windows += 1
            if self._windows == 2:
                self._started = _ready_time(state)

    def after_window(self, state, count):
        """Keeps windows in one call if the timed one saved enough per step."""
        if self.one_call is None and self._windows == 2:
            self.window_step_seconds = (_ready_time(state) - self._started) / count
            self.one_call = (self.window_step_seconds
                             < (1 - self.MIN_SAVING) * self.step_seconds)


def _now():
    return time.perf_counter()


def _ready_time(state):
    jax.block_until_ready(state)
    return _now()


class JaxTrainStep:
    """Runs training steps on a compiled Keras model (JAX backend), syncing lazily.

    Args:
        model: A compiled `keras.Model` on the JAX backend.
    """

    def __init__(self, model):
        import keras  # as in `supported`: Keras is loaded by then, its backend chosen

        self.model = model
        # Under a data-parallel distribution (AllReduceTrainer's workers) each step's
        # batch is this process's part of a global batch, and a step runs alone (a
        # window's stacked batches are not laid out for it).
        self.distributed = keras.distribution.distribution() is not None
        self.call_length = CallLength(False if self.distributed else (
            True if (getattr(model, "steps_per_execution", 1) or 1) > 1 else None))
        self.state = None  # (trainable, non_trainable, optimizer) JAX arrays, or None
        self._step = None
        self._window = None
        self._weight_slots = None
        # The metric variables' values after the last step (or, after a window, one per
        # step along their first axis): that batch's state, from zero. None in place of
        # those the epoch's sums do not take (`metric_sums.metric_slots`).
        self.metric_values = None

    @staticmethod
    def supported(model):
        """Whether the fast path applies (JAX backend, jit-compiled, on one device or
        under Keras's ``DataParallel`` distribution)."""
        import keras

        distribution = keras.distribution.distribution()
        return (keras.backend.backend() == "jax" and not model.run_eagerly
                and getattr(model, "jit_compile", True)
                and (distribution is None
                     or type(distribution) is keras.distribution.DataParallel))

    def _build(self, data):
        model = self.model
        model._symbolic_build(data_batch=data)
        model.reset_metrics()
        fresh_metrics = [np.asarray(variable.value) for variable in model.metrics_variables]
        summed = _summed_metric_positions(model)

        def step(state, batch):
            # Fresh metric values on every step: the logs describe this batch alone.
            metrics = [jnp.asarray(value) for value in fresh_metrics]
            logs, (trainable, non_trainable, optimizer, metrics) = model.train_step(
                (*state, metrics), batch)
            metrics = [value if index in summed else None
                       for index, value in enumerate(metrics)]
            return (logs, metrics), (trainable, non_trainable, optimizer)

        def window(state, batches):
            # Several steps in one compiled call: no Python between them.
            def body(carry, batch):
                outputs, carry = step(carry, batch)
                return carry, outputs

            state, outputs = jax.lax.scan(body, tuple(state), batches)
            return outputs, state

        self._step = jax.jit(step, donate_argnums=0)
        self._window = jax.jit(window, donate_argnums=0)
        # Where each entry of `model.weights` (the order of get_weights) lives in the state.
        positions = {id(variable): (0, index)
                     for index, variable in enumerate(model.trainable_variables)}
        positions.update({id(variable): (1, index)
                          for index, variable in enumerate(model.non_trainable_variables)})
        slots = [positions.get(id(variable)) for variable in model.weights]
        # A weight outside both lists (an exotic layer): read and write through Keras.
        self._weight_slots = None if None in slots else slots

    def _load_state(self):
        model = self.model
        self.state = (
            [variable.value for variable in model.trainable_variables],
            [variable.value for variable in model.non_trainable_variables],
            [variable.value for variable in model.optimizer.variables],
        )

    def __call__(self, x, y, sample_weight=None):
        """Runs one step; returns the logs (JAX scalars, per batch)."""
        data = fit_data(x, y, sample_weight)
        if self._step is None:
            self._build(data)
        if self.distributed:
            data = distribute_data(data)
        if self.state is None:
            self._load_state()
        self.call_length.before_step()
        (logs, self.metric_values), self.state = self._step(self.state, data)
        self.call_length.after_step(self.state)
        return logs

    def run_window(self, batches):
        """Runs one step per ``(x, y)`` or ``(x, y, sample_weight)`` in ``batches`` in one
        compiled call.

        All batches must have the same shapes (a compiled call per window length).

        Returns:
            The logs, each a JAX array with one value per step (``metric_values`` too).
        """
        batches = [fit_data(*batch) for batch in batches]
        if self._step is None:
            self._build(batches[0])
        if self.state is None:
            self._load_state()
        stacked = jax.tree_util.tree_map(lambda *arrays: stack(arrays), *batches)
        self.call_length.before_window(self.state)
        (logs, self.metric_values), self.state = self._window(self.state, stacked)
        self.call_length.after_window(self.state, len(batches))
        return logs

    def get_weights(self):
        """The model's weights (as `get_weights` orders them), or None before any step."""
        if self.state is None or self._weight_slots is None:
            return None
        return [np.array(self.state[group][index]) for group, index in self._weight_slots]

    def set_weights(self, weights):
        """Replaces the weights in the state; returns False when there is no state yet.

        Raises:
            ValueError: When a weight's shape does not match the model's.
        """
        if self.state is None or self._weight_slots is None:
            return False
        if len(weights) != len(self._weight_slots):
            raise ValueError(f"Expected {len(self._weight_slots)} weight arrays, got "
                             f"{len(weights)}.")
        groups = [list(self.state[0]), list(self.state[1])]
        values = []
        for position, ((group, index), value) in enumerate(zip(self._weight_slots, weights)):
            current = groups[group][index]
            value = np.asarray(value, dtype=current.dtype)
            if value.shape != current.shape:
                raise ValueError(f"Weight {position} has shape {value.shape}; the model "
                                 f"expects {current.shape}.")
            values.append(value)
        # One transfer for all of them; a copy, as the state is donated to the next step.
        for (group, index), array in zip(self._weight_slots,
                                         jax.device_put(values, may_alias=False)):
            groups[group][index] = array
        self.state = (groups[0], groups[1], self.state[2])
        return True

    def sync(self):
        """Writes the state back into the model's variables (before they are read)."""
        if self.state is None:
            return
        trainable, non_trainable, optimizer = self.state
        model = self.model
        for variables, values in ((model.trainable_variables, trainable),
                                  (model.non_trainable_variables, non_trainable),
                                  (model.optimizer.variables, optimizer)):
            for variable, value in zip(variables, values):
                variable.assign(value)
        self.state = None  # the variables hold the truth now; re-read them at the next step


def distribute_data(data):
    """``data`` (this process's part of a global batch) as global JAX arrays, laid out
    by the Keras distribution in effect, as Keras's own `fit` lays out its batches."""
    # Keras's JAX trainer's own helper: the layout is the distribution's business.
    from keras.src.backend.jax.trainer import _distribute_data

    return _distribute_data(data)


def _summed_metric_positions(model):
    """The positions in ``model.metrics_variables`` of the variables whose per-step values
    the worker adds up for the epoch's logs (`metric_sums.EpochMetricSums`)."""
    sums = EpochMetricSums()
    sums.bind(model)
    return frozenset(sums.positions)


def stack(arrays):
    """``np.stack(arrays)``, as a view when they are consecutive slices of one array.

    Minibatches of one Arrow record batch are such slices, so a window's data usually
    reaches the compiled call without an extra copy.
    """
    first = arrays[0]
    if isinstance(first, np.ndarray) and first.flags.c_contiguous and first.base is not None:
        start = first.__array_interface__["data"][0]
        if all(isinstance(array, np.ndarray) and array.base is first.base
               and array.shape == first.shape and array.dtype == first.dtype
               and array.flags.c_contiguous
               and array.__array_interface__["data"][0] == start + index * first.nbytes
               for index, array in enumerate(arrays)):
            return np.lib.stride_tricks.as_strided(
                first, shape=(len(arrays), *first.shape),
                strides=(first.nbytes, *first.strides), writeable=False)
    return np.stack(arrays)


def to_float(value):
    """A log value (JAX or numpy scalar) as a Python float."""
    return float(jax.device_get(value)) if isinstance(value, jax.Array) else float(value)
