"""A worker's training metric state, added up per epoch on the executor.

An epoch's value of a metric is not always a mean of its steps' values: ``AUC``,
``Precision``, ``RootMeanSquaredError``, ``F1Score``, ``MeanIoU``, ``R2Score`` compute their
result from state accumulated over all the epoch's rows, and a weighted metric's mean
weighs the rows' sample weights rather than the batches' sizes.

The state of every metric Keras itself defines is made of sums (true positives, a total and
a count, a confusion matrix), so it adds up across steps and across workers. Each worker
adds its steps' metric state per epoch (on the device, in the step's own arrays: no copy to
the host per step) and sends what it added since its last report with its step records
(`EpochMetricSums.drain`); the driver adds the reports of an epoch over its workers
(`distkeras.training.epoch_metrics`).

Metrics of the user's own classes are not known to add up: they keep the steps' mean (see
`distkeras.training.callbacks.warn_of_step_mean_metrics`).
"""

import logging

import numpy as np

from distkeras.transport.history_messages import INDEX_FIELD, VALUES_FIELD

logger = logging.getLogger(__name__)

# A metric with a larger state (a MeanIoU over thousands of classes) keeps the steps' mean:
# its reports would outgrow the frames the driver's server accepts.
MAX_STATE_VALUES = 1 << 15


def additive(metric):
    """Whether ``metric``'s state adds across steps: a metric class of Keras's own (a
    subclass of the user's may keep any state)."""
    import keras

    return isinstance(metric, keras.metrics.Metric) and \
        type(metric).__module__.startswith("keras.") and bool(metric.variables)


def _is_mean(metric):
    """Whether ``metric``'s result is its ``total / count`` (`keras.metrics.Mean`'s)."""
    import keras

    return type(metric).result is keras.metrics.Mean.result and \
        [variable.name for variable in metric.variables] == ["total", "count"]


def _named_metrics(model):
    """``(log name, metric)`` of each metric whose result ``model``'s logs hold under that
    name (the compiled metrics under their names in the logs, as Keras's
    `CompileMetrics.result` gives them, in the same order)."""
    for metric in model.metrics:
        nested = getattr(metric, "_flat_metrics", None)
        if nested is None:
            yield metric.name, metric
            continue
        members = list(metric.metrics)
        names = list(metric.result()) if getattr(metric, "built", False) else []
        if len(names) == len(members):
            yield from zip(names, members)


def metric_slots(model):
    """What to accumulate of a built and compiled ``model``'s metrics.

    Returns:
        A list of ``(log name, positions in model.metrics_variables, spec)``, ``spec``
        telling the driver how to compute the result from the state (see `exact_logs`).
    """
    import keras

    positions = {id(variable): index
                 for index, variable in enumerate(model.metrics_variables)}
    slots = []
    for name, metric in _named_metrics(model):
        if not additive(metric) or any(id(v) not in positions for v in metric.variables):
            continue
        if sum(int(np.prod(v.shape)) for v in metric.variables) > MAX_STATE_VALUES:
            logger.info("The epoch's %s stays the mean of its steps: its state is too "
                        "large to report.", name)
            continue
        if _is_mean(metric):
            spec = {"mean": True}
        else:
            spec = {"config": keras.metrics.serialize(metric)}
        slots.append((name, [positions[id(v)] for v in metric.variables], spec))
    return slots


def _jax_functions():
    """Compiled sums of JAX arrays (one dispatch for all the metrics' arrays)."""
    import jax
    import jax.numpy as jnp

    def add(total, values):
        return jax.tree_util.tree_map(jnp.add, total, values)

    def masked_sum(stacked, mask):
        def one(values):
            shape = (-1,) + (1,) * (values.ndim - 1)
            return jnp.sum(jnp.where(mask.reshape(shape), values, 0), axis=0)

        return jax.tree_util.tree_map(one, stacked)

    return jax.jit(add), jax.jit(masked_sum)


class EpochMetricSums:
    """A worker's metric state added up per epoch since its last report.

    `bind` takes the model once it is built; `add` and `add_window` take all of
    ``model.metrics_variables``' values after a step (or a window of steps) whose metrics
    started from zero; `drain` returns the sums as message fields and starts again.
    """

    def __init__(self):
        self.slots = None
        self._sums = {}  # epoch: list of arrays, one per accumulated variable
        self._jax = None

    def bind(self, model):
        """Reads which metrics to accumulate (once, after the model's first step)."""
        if self.slots is not None:
            return
        try:
            self.slots = metric_slots(model)
        except (ValueError, TypeError, AttributeError) as error:  # an exotic model
            logger.info("Training metrics stay means of steps in the epoch logs: %s", error)
            self.slots = []
        self._positions = [position for _, positions, _ in self.slots
                           for position in positions]

    @property
    def positions(self):
        """The positions in ``model.metrics_variables`` of the variables added up (after
        `bind`): `add` and `add_window` read only these of the values they take."""
        return list(self._positions)

    def add(self, epoch, values):
        """Adds one step's metric values (JAX arrays, or anything numpy reads)."""
        if not self.slots:
            return
        chosen = [values[position] for position in self._positions]
        if _is_jax(chosen):
            self._add_jax(int(epoch), chosen)
            return
        from keras import ops

        # A copy: the next step resets the variables in place (torch).
        chosen = [np.array(ops.convert_to_numpy(value), dtype=np.float64) for value in chosen]
        total = self._sums.get(int(epoch))
        self._sums[int(epoch)] = chosen if total is None else \
            [a + b for a, b in zip(total, chosen)]

    def add_window(self, epochs, values):
        """Adds a window's steps: ``values`` hold one value per step along their first
        axis (JAX arrays), ``epochs`` the epoch of each step."""
        if not self.slots:
            return
        chosen = [values[position] for position in self._positions]
        if self._jax is None:
            self._jax = _jax_functions()
        epochs = np.asarray(epochs)
        for epoch in np.unique(epochs):
            self._add_jax(int(epoch), self._jax[1](chosen, epochs == epoch))

    def _add_jax(self, epoch, values):
        if self._jax is None:
            self._jax = _jax_functions()
        total = self._sums.get(epoch)
        self._sums[epoch] = list(values) if total is None else self._jax[0](total, values)

    def drain(self):
        """The sums since the last call as message fields (none when there are none)."""
        if not self._sums:
            return {}
        index, arrays = [], []
        for epoch, sums in sorted(self._sums.items()):
            start = 0
            for name, positions, spec in self.slots:
                values = [np.asarray(value) for value in sums[start:start + len(positions)]]
                start += len(positions)
                index.append({"epoch": epoch, "name": name, "spec": spec,
                              "shapes": [list(value.shape) for value in values]})
                arrays.extend(value.astype(np.float64).reshape(-1) for value in values)
        self._sums = {}
        return {INDEX_FIELD: index, VALUES_FIELD: np.concatenate(arrays)}


def _is_jax(values):
    try:
        import jax
    except ImportError:
        return False
    return all(isinstance(value, jax.Array) for value in values)
