"""Plots of a training run and of a sweep of runs (matplotlib, no display needed).

    from distkeras.tools.plotting import plot_history
    plot_history(trainer, "history.png")      # loss and metrics against wall time

Figures are built with `matplotlib.figure.Figure` directly, never through pyplot, so they
need no GUI backend, leave no global state behind and work on a headless driver. PNGs are
rendered by Agg.
"""

import logging

import numpy as np

logger = logging.getLogger(__name__)

_METRIC_LABELS = {"loss": "training loss", "accuracy": "training accuracy",
                  "wall_time_s": "wall time (s)", "test_accuracy": "test accuracy",
                  "samples_per_s": "samples / s", "mean_staleness": "mean staleness"}
_X_LABELS = {"workers": "workers", "window": "communication window"}


def _figure(**kwargs):
    from matplotlib.figure import Figure

    return Figure(layout="constrained", **kwargs)


def _colors(count):
    from matplotlib import colormaps

    cmap = colormaps["tab10" if count <= 10 else "tab20"]
    return [cmap(index % cmap.N) for index in range(count)]


def _save(figure, path):
    if path is not None:
        figure.savefig(path, dpi=110)
        logger.info("Wrote %s", path)


def rolling_mean(values, window=20):
    """Trailing mean over the last ``window`` values (fewer at the start).

    Values that are not finite (the NaN loss of a diverged step) are left out of the means
    they fall in, so one of them does not blank the rest of the curve; a window holding
    only such values gives NaN.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        return values
    window = max(1, int(window))
    finite = np.isfinite(values)
    sums = np.concatenate([[0.0], np.cumsum(np.where(finite, values, 0.0))])
    counts = np.concatenate([[0], np.cumsum(finite)])
    ends = np.arange(1, values.size + 1)
    starts = np.maximum(0, ends - window)
    kept = counts[ends] - counts[starts]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(kept > 0, (sums[ends] - sums[starts]) / kept, np.nan)


def _records(trainer_or_records):
    if hasattr(trainer_or_records, "get_history"):
        return list(trainer_or_records.get_history())
    return list(trainer_or_records)


def _validation_records(trainer):
    getter = getattr(trainer, "get_validation_history", None)
    return list(getter()) if getter is not None else []


# Keys of a step record that describe the step rather than measure it.
_STEP_KEYS = frozenset({"worker_id", "iteration", "timestamp", "batch_size", "epoch",
                        "attempt", "superseded"})


def _logged(records):
    """The measured entries of the records (``loss``, ``a_loss``, the metrics), in the
    order the records first hold them."""
    names = {}
    for record in records:
        for name, value in record.items():
            if name not in _STEP_KEYS and isinstance(value, (int, float, np.number)) \
                    and not isinstance(value, bool):
                names.setdefault(name, None)
    return list(names)


def _panels(records, metrics):
    """The entries to plot, one panel each: every one logged for ``metrics=None``, else
    each name given, or, where the run did not log it under that name, each output's
    (``a_accuracy`` and ``b_accuracy`` for ``accuracy``, as Keras's ``history.history``
    names the metrics of a model of several outputs)."""
    logged = _logged(records)
    if metrics is None:
        # Keras's history.history order (by name), the loss first.
        return sorted(logged, key=lambda name: (name != "loss", name))
    panels = []
    for name in metrics:
        found = [name] if name in logged else \
            [entry for entry in logged if entry.endswith(f"_{name}")]
        panels.extend(entry for entry in found if entry not in panels)
    return panels


def plot_history(trainer, path=None, metrics=None, smoothing=20):
    """Training loss and metrics against wall time, one thin line per worker.

    Every worker's per-step values are smoothed with a rolling mean over ``smoothing`` steps;
    the thick line is the mean over all workers: every step of every worker in time order,
    smoothed over ``smoothing`` steps per worker. A trainer that validated
    (``train(validation_data=...)``) adds its validation values as points, at the time of
    each evaluation (for an `EnsembleTrainer`, each member's in its line's color). Steps of
    a failed task that Spark's retry trained again (``superseded``) are left out, as in
    `get_averaged_history`.

    Args:
        trainer: A trained distkeras trainer (or the list its `get_history()` returns).
        path: Where to save the figure as PNG (optional).
        metrics: History entries to plot, one panel each; None (the default) plots
            ``loss`` and every other entry the run logged, as Keras's ``history.history``
            holds them (``mae`` for a regression; ``a_loss``, ``a_accuracy``, ... for a
            model of several outputs). A name the run logged per output (``accuracy``)
            plots each output's; names not logged are skipped.
        smoothing: Steps in the rolling mean.

    Returns:
        The `matplotlib.figure.Figure`.

    Raises:
        ValueError: If the trainer has no history or none of ``metrics`` was recorded.
    """
    given = _records(trainer)
    records = [record for record in given
               if "timestamp" in record and not record.get("superseded")]
    if not records:
        raise ValueError(
            "The records given have no 'timestamp' (the time of each step, which "
            "get_history() records): pass a trainer's history." if given else
            "The trainer has no history to plot: call `train()` first.")
    present = _panels(records, metrics)
    if not present:
        asked = "loss nor any metric" if metrics is None else \
            f"any of metrics={tuple(metrics)!r}"
        raise ValueError(f"The history holds neither {asked}. Recorded entries: "
                         f"{', '.join(sorted({key for r in records for key in r}))}.")
    start = min(record["timestamp"] for record in records)
    worker_ids = sorted({record.get("worker_id", 0) for record in records})
    colors = _colors(len(worker_ids))
    # An ensemble's workers are its members: independent models, each validated alone.
    unit = "member" if hasattr(trainer, "num_ensembles") else "worker"
    columns = min(3, len(present))
    rows = -(-len(present) // columns)
    figure = _figure(figsize=(6.0 * columns, 4.2 * rows))
    axes = figure.subplots(rows, columns, squeeze=False).ravel()
    for unused in axes[len(present):]:
        unused.remove()
    name = type(trainer).__name__ if hasattr(trainer, "get_history") else "training"
    validation = _validation_records(trainer)
    for axis, metric in zip(axes, present):
        for color, worker_id in zip(colors, worker_ids):
            steps = sorted((r for r in records
                            if r.get("worker_id", 0) == worker_id and metric in r),
                           key=lambda r: r["timestamp"])
            if not steps:
                continue
            times = np.asarray([r["timestamp"] for r in steps]) - start
            axis.plot(times, rolling_mean([r[metric] for r in steps], smoothing),
                      color=color, linewidth=0.9, alpha=0.75, label=f"{unit} {worker_id}")
        pooled = sorted((r for r in records if metric in r), key=lambda r: r["timestamp"])
        times = np.asarray([r["timestamp"] for r in pooled]) - start
        axis.plot(times, rolling_mean([r[metric] for r in pooled],
                                      smoothing * len(worker_ids)),
                  color="black", linewidth=2.6, label=f"mean of {unit}s")
        _plot_validation(axis, [r for r in validation if f"val_{metric}" in r], metric,
                         start, dict(zip(worker_ids, colors)))
        axis.set_xlabel("seconds since the first step")
        axis.set_ylabel(_METRIC_LABELS.get(metric, metric))
        axis.set_title(f"{_METRIC_LABELS.get(metric, metric)} "
                       f"(rolling mean, {smoothing} steps)", fontsize="medium")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize="small", ncols=1 if len(worker_ids) < 8 else 2)
    figure.suptitle(f"{name}: {len(worker_ids)} {unit}{'s' if len(worker_ids) != 1 else ''}, "
                    f"{len(records)} steps in all")
    _save(figure, path)
    return figure


def _plot_validation(axis, records, metric, start, colors):
    """Draws the validation values as points: one series, or one per ensemble member
    (records carrying ``member``), in that member's color."""
    series = {}
    for record in records:
        series.setdefault(record.get("member"), []).append(record)
    for member, points in sorted(series.items(), key=lambda item: (item[0] is not None,
                                                                   item[0] or 0)):
        axis.plot(np.asarray([r["timestamp"] for r in points]) - start,
                  [r[f"val_{metric}"] for r in points], linestyle="none", marker="o",
                  markersize=7, markeredgecolor="black",
                  color="tab:red" if member is None else colors.get(member, "tab:red"),
                  label="validation" if member is None else f"validation, member {member}")


def _series_label(row, by, baselines=()):
    other = "window" if by == "workers" else "workers"
    value = row.get(other)
    if value is None or value == "" or row["trainer"] in baselines:
        return str(row["trainer"])
    if other == "window":
        return f"{row['trainer']}, window {value}"
    return f"{row['trainer']}, {value} worker{'s' if value != 1 else ''}"


def _set_x_axis(axis, values):
    values = sorted(set(values))
    if not values:
        return
    if values[0] > 0 and values[-1] / values[0] >= 8:
        axis.set_xscale("log", base=2)
    axis.set_xticks(values, labels=[str(value) for value in values])
    axis.minorticks_off()
    if len(values) == 1:
        axis.set_xlim(values[0] * 0.5, values[0] * 1.5)


def plot_comparison(results, path=None, by="workers", metrics=("wall_time_s", "test_accuracy"),
                    title=None, baselines=("SingleTrainer",)):
    """Sweep results against the number of workers or the communication window.

    One line per trainer and value of the other setting (``ADAG, window 12`` against
    workers; ``ADAG, 2 workers`` against window). Runs that do not depend on ``by`` (the
    ``baselines``, and trainers without a window when ``by="window"``) are dashed horizontal
    lines.

    Args:
        results: Dicts with ``trainer``, ``workers``, ``window`` and the ``metrics``, as
            `distkeras.tools.experiments.sweep` returns them.
        path: Where to save the figure as PNG (optional).
        by: ``"workers"`` or ``"window"``: the x axis.
        metrics: Result entries to plot, one panel each.
        title: The figure's title.
        baselines: Trainers drawn as horizontal lines.

    Returns:
        The `matplotlib.figure.Figure`.
    """
    if by not in _X_LABELS:
        raise ValueError(f"`by` must be 'workers' or 'window'. Received: by={by!r}")
    results = list(results)
    if not results:
        raise ValueError("`results` is empty: there is nothing to plot.")
    series, flat = {}, {}
    for row in results:
        target = flat if row["trainer"] in baselines or row.get(by) in (None, "") else series
        target.setdefault(_series_label(row, by, baselines), []).append(row)
    colors = _colors(len(series) + len(flat))
    figure = _figure(figsize=(5.2 * len(metrics) + 2.6, 4.2))
    axes = figure.subplots(1, len(metrics), squeeze=False)[0]
    for axis, metric in zip(axes, metrics):
        color_index = 0
        for label, rows in series.items():
            rows = sorted((r for r in rows if r.get(metric) not in (None, "")),
                          key=lambda r: r[by])
            axis.plot([r[by] for r in rows], [float(r[metric]) for r in rows], marker="o",
                      linewidth=1.8, color=colors[color_index], label=label)
            color_index += 1
        for label, rows in flat.items():
            values = [float(r[metric]) for r in rows if r.get(metric) not in (None, "")]
            if values:
                axis.axhline(float(np.mean(values)), linestyle="--", linewidth=1.5,
                             color=colors[color_index], label=label)
            color_index += 1
        _set_x_axis(axis, [r[by] for rows in series.values() for r in rows])
        axis.set_xlabel(_X_LABELS[by])
        axis.set_ylabel(_METRIC_LABELS.get(metric, metric))
        axis.set_title(f"{_METRIC_LABELS.get(metric, metric)} by {_X_LABELS[by]}",
                       fontsize="medium")
        axis.grid(True, alpha=0.3)
        if metric == "test_accuracy":
            low, high = axis.get_ylim()
            axis.set_ylim(max(0.0, low), min(1.0, high))
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside right upper", fontsize="small",
                  ncols=1 if len(labels) <= 16 else 2)
    if title:
        figure.suptitle(title)
    _save(figure, path)
    return figure


__all__ = ["plot_history", "plot_comparison", "rolling_mean"]
