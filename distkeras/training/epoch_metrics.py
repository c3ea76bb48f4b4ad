"""The exact epoch values of the training metrics, as ``fit``'s epoch logs hold them,
computed on the driver.

Each worker sends the metric state it added up per epoch with its step records
(`distkeras.executor.metric_sums.EpochMetricSums`); the driver reads the reports off the
messages (`distkeras.transport.history_messages.unpack_metric_states`), adds the reports
of an epoch over its workers and computes each metric's result from the sum
(`exact_logs`), in place of the steps' mean.
"""

import logging

import numpy as np

logger = logging.getLogger(__name__)


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
