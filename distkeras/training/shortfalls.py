"""Warnings about a parameter-server run that ended normally but trained less than asked.

A custom worker's loop (the escape hatch's `optimize()`) may stop before its data runs out,
or commit too seldom for any commit to reach the center; the parameter server may refuse
commits (NaN or infinite values). `train()` then returns normally: these warnings say why
the returned model holds less training than the run's settings suggest.
"""

import logging

logger = logging.getLogger(__name__)


def warn_if_trained_short(name, worker, history, expected, num_epoch):
    """Warns when the workers reported fewer samples than the rows times ``num_epoch``:
    a custom ``optimize()`` that returned before its data ran out leaves ``train()``
    returning normally (epoch-end callbacks fired too) a model trained on part of it.
    A warning, not an error: a fixed step budget can be deliberate.

    Args:
        name: The trainer class's name.
        worker: The worker the trainer allocated (its class is the one to name).
        history: The run's step records.
        expected: Rows times ``num_epoch``; None: not counted, not checked.
        num_epoch: The run's epochs.
    """
    if not expected:
        return
    trained = sum(int(record.get("batch_size", 0)) for record in history)
    if trained >= expected:
        return
    logger.warning(
        "%s: the workers trained on %d samples, not the %d of %d epochs over the rows "
        "(%.1f%%): %s.optimize() returned before get_next_minibatch() ran out of data, "
        "so the returned model was trained on part of it. Loop until "
        "get_next_minibatch() raises StopIteration (docs/optimizers.md, \"Write your "
        "own optimizer\") unless a fixed number of steps is what you meant.",
        name, trained, expected, num_epoch, 100.0 * trained / expected,
        type(worker).__name__)


def warn_if_nothing_committed(name, num_updates, server, worker, history):
    """Warns when no commit reached the center (the model returned is the one given),
    or when some were refused (those workers' training is not in it).

    Args:
        name: The trainer class's name.
        num_updates: The commits the server applied in this run.
        server: The stopped parameter server.
        worker: The worker the trainer allocated.
        history: The run's step records.
    """
    center = getattr(server, "center", None)  # the built-in servers' counts of refusals
    refused = getattr(center, "refused", 0)
    if num_updates and refused:
        by_worker = getattr(center, "refused_by_worker", {})
        logger.warning(
            "%s: the parameter server refused %d commits (NaN or infinite values, or "
            "values that would make the center infinite) from workers %s; the "
            "returned model holds the other %d, so it lacks those "
            "workers' training since their first refusal. A NaN loss usually means a "
            "learning rate too high or values too large for float32 in that worker's "
            "data (NaN or infinite values stop the training as they are fed); Keras's "
            "fit would have returned NaN weights.",
            name, refused, dict(sorted(by_worker.items())), num_updates)
        return
    if num_updates or not history:
        return
    if refused:
        logger.warning(
            "%s applied none of its workers' commits (the parameter server refused %d, "
            "logged above): the returned model holds the initial weights.", name, refused)
        return
    # A custom worker's loop (the seed's) commits only every `communication_window`
    # steps; on a partition with fewer minibatches, nothing reaches the center.
    steps = max(record.get("iteration", 0) for record in history)
    logger.warning(
        "%s trained %d steps on its workers but applied no commit to the center "
        "variable: the returned model holds the initial weights. The workers took at "
        "most %d steps (communication_window=%s). Commit in %s.optimize() more often, "
        "or commit the last, unfinished window in finish() as the built-in workers do "
        "(docs/optimizers.md, \"Write your own optimizer\").",
        name, len(history), steps, getattr(worker, "communication_window", None),
        type(worker).__name__)
