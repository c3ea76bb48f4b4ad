"""The exact epoch values of the training metrics, as ``fit``'s epoch logs hold them.

Workers report every step's metric values (a batch's own, for the progress and the
history). An epoch's value is not always a mean of those: ``AUC``, ``Precision``,
``RootMeanSquaredError``, ``F1Score``, ``MeanIoU``, ``R2Score`` compute their result from
state accumulated over all the epoch's rows, and a weighted metric's mean weighs the rows'
sample weights rather than the batches' sizes.

The state of every metric Keras itself defines is made of sums (true positives, a total and
a count, a confusion matrix), so it adds up across steps and across workers. Each worker
adds its steps' metric state per epoch (on the device, in the step's own arrays: no copy to
the host per step) and sends what it added since its last report with its step records
(`EpochMetricSums.drain`); the driver adds the reports of an epoch over its workers and
computes each metric's result from the sum (`exact_logs`), in place of the steps' mean.

Metrics of the user's own classes are not known to add up: they keep the steps' mean (see
`distkeras.training.callbacks.warn_of_step_mean_metrics`).
"""

import logging
import math

import numpy as np

logger = logging.getLogger(__name__)

# Message fields of a report (next to a worker's step records).
INDEX_FIELD = "metric_state_index"
VALUES_FIELD = "metric_state_values"
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


def unpack(message, worker_id):
    """The reports a message carries (see `EpochMetricSums.drain`), as dicts with
    ``worker_id``, ``epoch``, ``name``, ``spec`` and ``state`` (a list of arrays).

    Raises:
        ProtocolError: When the fields do not describe the values.
    """
    from distkeras.networking import ProtocolError

    index = message.get(INDEX_FIELD)
    if index is None:
        return []
    values = message.get(VALUES_FIELD)
    if not isinstance(index, list) or not isinstance(values, np.ndarray) or values.ndim != 1:
        raise ProtocolError("A metric state report must carry an index and a 1-D array.")
    reports, offset = [], 0
    for entry in index:
        try:
            epoch, name, spec = int(entry["epoch"]), str(entry["name"]), dict(entry["spec"])
            shapes = [tuple(int(size) for size in shape) for shape in entry["shapes"]]
        # OverflowError: int() of an Infinity that JSON as Python reads it may hold.
        except (KeyError, TypeError, ValueError, OverflowError) as error:
            raise ProtocolError(f"Bad metric state entry: {error}") from error
        if any(size < 0 for shape in shapes for size in shape):
            raise ProtocolError("A metric state report names a negative dimension.")
        state = []
        for shape in shapes:
            # Python's integers: an int64 product wraps (2**62 * 4 is 0), and reshape
            # then failed as a bug of the server's rather than a bad report.
            size = math.prod(shape)
            if offset + size > len(values):
                raise ProtocolError("A metric state report holds fewer values than it says.")
            try:
                state.append(values[offset:offset + size].reshape(shape))
            # An empty state whose other dimensions overflow (numpy's int64, or C's long).
            except (ValueError, OverflowError) as error:
                raise ProtocolError(f"Bad metric state shape {list(shape)}: {error}") \
                    from error
            offset += size
        reports.append({"worker_id": worker_id, "epoch": epoch, "name": name, "spec": spec,
                        "state": state})
    if offset != len(values):
        raise ProtocolError("A metric state report holds more values than it says.")
    return reports


def of_epoch(reports, epoch):
    """The reports of ``epoch`` (from 0)."""
    return [report for report in reports if report["epoch"] == epoch]


def exact_logs(reports):
    """Each metric's result over the state that ``reports`` add up to (those of one epoch:
    every worker's, every report's), as ``fit``'s epoch logs hold it.

    A report marked ``superseded`` (of a failed task that Spark's retry trained again)
    does not count. A metric whose result cannot be computed here, or is not one number,
    is left out (the steps' mean stands for it).
    """
    totals, specs = {}, {}
    for report in reports:
        if report.get("superseded"):
            continue
        name = report["name"]
        total = totals.get(name)
        if total is not None and [a.shape for a in total] != \
                [np.shape(b) for b in report["state"]]:
            logger.warning("Metric %s reported states of different shapes; its epoch value "
                           "is the mean of its steps.", name)
            totals[name] = None
            continue
        if name in totals and total is None:
            continue
        totals[name] = [np.asarray(b, np.float64) for b in report["state"]] if total is None \
            else [a + b for a, b in zip(total, report["state"])]
        specs[name] = report["spec"]
    logs = {}
    for name, state in totals.items():
        if state is None:
            continue
        value = _result(specs[name], state)
        if value is not None:
            logs[name] = value
    return logs


def _result(spec, state):
    """A metric's result from its summed state, or None where it cannot be computed.

    ``spec`` and ``state`` come from the workers' reports, over the network: a spec that is
    not what `metric_slots` sends (a mean of other than two parts, a config that is not one
    of Keras's own metrics, or one that does not build) leaves the steps' mean standing
    rather than failing the driver's epoch end.
    """
    if spec.get("mean"):
        if len(state) != 2:
            logger.warning("A metric's mean was reported with %d parts, not 2; its epoch "
                           "value stays the mean of its steps.", len(state))
            return None
        total, count = (float(np.sum(part)) for part in state)
        return total / count if count else 0.0  # Keras's divide_no_nan
    import keras

    metric_class = _keras_metric_class(spec.get("config"))
    if metric_class is None:
        logger.warning("A metric state was reported for %r, not one of Keras's metrics; its "
                       "epoch value stays the mean of its steps.", spec.get("config"))
        return None
    try:
        metric = keras.metrics.deserialize(spec["config"])
        _build_like(metric, state)
        for variable, value in zip(metric.variables, state):
            variable.assign(np.asarray(value).astype(variable.dtype))
        result = np.asarray(keras.ops.convert_to_numpy(metric.result()))
    except (AttributeError, IndexError, KeyError, TypeError, ValueError) as error:
        logger.info("The epoch's %s stays the mean of its steps: %s",
                    metric_class.__name__, error)
        return None
    return float(result) if result.ndim == 0 else None


def _keras_metric_class(config):
    """The class of Keras's own metrics that a reported ``config`` names, or None: the
    only ones `metric_slots` reports (`additive`)."""
    import keras

    if not isinstance(config, dict) or not isinstance(config.get("class_name"), str) or \
            config.get("module") != "keras.metrics":
        return None
    metric_class = getattr(keras.metrics, config["class_name"], None)
    if isinstance(metric_class, type) and issubclass(metric_class, keras.metrics.Metric):
        return metric_class
    return None


def _build_like(metric, state):
    """Builds a metric whose variables Keras creates at its first update (``F1Score``,
    ``R2Score``, a multi-label ``AUC``) with the shapes of ``state``: an update with no
    rows creates them and adds nothing.

    Raises:
        ValueError: When its variables still do not match the state.
    """
    if len(metric.variables) != len(state):
        shaped = [np.shape(value) for value in state if np.ndim(value) >= 1]
        width = shaped[0][-1] if shaped else 1
        empty = np.zeros((0, width), dtype="float32")
        metric.update_state(empty, empty)
    shapes = [tuple(variable.shape) for variable in metric.variables]
    if shapes != [np.shape(value) for value in state]:
        raise ValueError(f"its variables are shaped {shapes}, its state "
                         f"{[np.shape(value) for value in state]}")
