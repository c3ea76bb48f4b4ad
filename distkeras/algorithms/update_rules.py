"""The update rules of every optimizer, as small pure functions.

Weights are numpy object arrays of per-layer arrays (see `networking.weights_array`), so
arithmetic applies layer by layer. No function here modifies its arguments.

A model's non-trainable weights (``trainable`` False: BatchNormalization's moving mean
and variance) are state that the workers measure, not parameters that gradients move.
Rules that scale an update down (ADAG's division by the window, DynSGD's by the staleness,
and Experimental's) leave them whole, so the center holds the statistics the workers
measured rather than a fraction of their change.
"""

import numpy as np


def trainable_flags(model):
    """One flag per entry of ``model.get_weights()``: False for a non-trainable weight."""
    trainable = {id(variable) for variable in model.trainable_weights}
    return [id(variable) in trainable for variable in model.weights]


def _in_dtypes(result, like):
    """``result`` with each array in the dtype of ``like``'s array at the same place.

    Scaling or dividing integer state (a ``Normalization`` layer's count) gives float64,
    which the model does not hold and the parameter server refuses: such arrays are
    rounded back to their integers.
    """
    converted = np.empty(len(result), dtype=object)
    for index, (part, reference) in enumerate(zip(result, like)):
        dtype = np.asarray(reference).dtype
        part = np.asarray(part)
        if part.dtype != dtype and np.issubdtype(dtype, np.integer):
            part = np.rint(part)
        converted[index] = part.astype(dtype, copy=False)
    return converted


def _divided(delta, divisor, trainable):
    """``delta / divisor``, but whole where ``trainable`` (a flag per weight) is False.

    ``divisor`` is a number, or weights of the same layout (one divisor per element).
    """
    if trainable is not None and len(trainable) != len(delta):
        raise ValueError(f"{len(trainable)} trainable flags for {len(delta)} weights.")
    if trainable is None or all(trainable):
        return delta / divisor
    per_weight = isinstance(divisor, np.ndarray) and divisor.dtype == object
    divided = np.empty(len(delta), dtype=object)
    for index, (part, is_trainable) in enumerate(zip(delta, trainable)):
        by = divisor[index] if per_weight else divisor
        divided[index] = part / by if is_trainable else part
    return divided


def downpour_delta(weights, pulled):
    """DOWNPOUR worker: the change since the last pull, ``W - W_pull``."""
    return weights - pulled


def adag_residual(weights, pulled, communication_window, trainable=None):
    """ADAG worker: the change since the last pull averaged per step, ``(W - W_pull) / window``.

    Args:
        weights: The worker's weights now.
        pulled: The weights it pulled.
        communication_window: Steps since that pull.
        trainable: Optional flags, one per weight: where False (a non-trainable weight),
            the change is sent whole, ``W - W_pull``.
    """
    delta = weights - pulled
    return _in_dtypes(_divided(delta, communication_window, trainable), delta)


def add_update(center, update):
    """DOWNPOUR and ADAG server: ``C + delta`` (``C + residual``)."""
    return center + update


def elastic_difference(weights, center, rho, learning_rate):
    """AEASGD / EAMSGD worker: the elastic force ``E = rho * lr * (W - C)``.

    The worker subtracts ``E`` from its weights and commits it; the server adds it to the
    center, so both move towards each other. Non-trainable weights too: the center's
    statistics are then the elastic average of the workers' (measured better, for the
    center's weights, than the latest worker's alone).
    """
    delta = weights - center
    return _in_dtypes((rho * learning_rate) * delta, delta)


def momentum_velocity(velocity, weights_before, weights_after):
    """EAMSGD worker: the new velocity after one step taken at the look-ahead point.

    The EASGD paper's EAMSGD takes a Nesterov step ``v <- delta * v - eta * g(x + delta * v)``,
    ``x <- x + v``. The Keras optimizer takes the gradient step from the look-ahead point
    ``x + delta * v``, so the new velocity is simply where it ended minus where ``x`` was.
    """
    return weights_after - weights_before


def lookahead(weights, velocity, momentum):
    """EAMSGD worker: the point ``x + delta * v`` where the next gradient is taken."""
    return weights + momentum * velocity


def dynsgd_update(center, delta, num_updates, last_update, trainable=None):
    """DynSGD server: ``C + delta / (num_updates - last_update + 1)``.

    Args:
        center: The center variable.
        delta: The worker's change since its last pull.
        num_updates: Updates applied so far.
        last_update: The update count the worker saw at its last pull.
        trainable: Optional flags, one per weight: where False (a non-trainable weight),
            the change is added whole, as DOWNPOUR adds it.
    """
    staleness = num_updates - last_update + 1
    return _in_dtypes(center + _divided(delta, staleness, trainable), center)


def experimental_update(center, residual, stale_center, learning_rate, trainable=None):
    """Experimental server: ``C + residual / ((1/lr) * (C - C_stale)**2 + 1)``, elementwise.

    Weights that moved a lot since the worker pulled them (high disagreement) get a damped
    update; weights that did not move get the full residual.

    Args:
        center: The center variable.
        residual: The worker's residual (its window's change, divided as ADAG's).
        stale_center: The center the worker pulled.
        learning_rate: The rule's learning rate.
        trainable: Optional flags, one per weight: where False (a non-trainable weight),
            the residual is added undamped.
    """
    # A disagreement too large to square in float32 damps its weight's residual to 0, the
    # rule's limit: that overflow is no error (the server raises on the sum's).
    with np.errstate(over="ignore"):
        damping = (1.0 / learning_rate) * (center - stale_center) ** 2 + 1.0
    return _in_dtypes(center + _divided(residual, damping, trainable), center)


def average_weights(weight_sets):
    """AveragingTrainer: the elementwise mean of several replicas' weights.

    Computed as ``W_0 - sum(W_0 - W_i) / n``, which is the mean, and exactly ``W_0`` where
    every replica holds the same value: a frozen layer (``trainable=False``), which no
    replica moves, keeps its weights bit for bit. ``sum(W_i) / n`` rounded them (three
    replicas: ``(w + w + w) / 3`` is not always ``w`` in float32). Subtracting the zero
    keeps a ``-0.0`` too, where adding it would give ``+0.0``.
    """
    weight_sets = list(weight_sets)
    first = weight_sets[0]
    spread = first - first
    for weights in weight_sets[1:]:
        spread = spread + (first - weights)
    return _in_dtypes(first - spread / len(weight_sets), first)


def _per_weight(center, trainable):
    """``trainable`` as one flag per weight of ``center`` (all True when None)."""
    if trainable is None:
        return [True] * len(center)
    if len(trainable) != len(center):
        raise ValueError(f"{len(trainable)} trainable flags for {len(center)} weights.")
    return list(trainable)


def nesterov_outer_step(center, delta, velocity, learning_rate, momentum, scale=1.0,
                        trainable=None):
    """DiLoCo server: one outer Nesterov step on the pseudo-gradient ``g = -scale * delta``.

    ``v' = momentum * v + g`` and ``C' = C - lr * (momentum * v' + g)`` (Sutskever's
    Nesterov form, as `keras.optimizers.SGD(nesterov=True)` takes it).

    Args:
        center: The center variable.
        delta: A worker's change over its window, ``W - W_pull``.
        velocity: The outer velocity (same layout), or None before the first step.
        learning_rate: The outer learning rate.
        momentum: The outer momentum.
        scale: Multiplies the change (a staleness discount).
        trainable: Optional flags, one per weight: where False (a non-trainable weight),
            the scaled change is added as it is, without momentum.

    Returns:
        ``(new center, new velocity)``.
    """
    flags = _per_weight(center, trainable)
    new_center, new_velocity = np.empty(len(center), object), np.empty(len(center), object)
    for index, (layer, change) in enumerate(zip(center, delta)):
        gradient = -(change * scale)
        before = 0.0 if velocity is None else velocity[index]
        new_velocity[index] = momentum * before + gradient
        new_center[index] = (layer - learning_rate * (momentum * new_velocity[index] + gradient)
                             if flags[index] else layer - gradient)
    return _in_dtypes(new_center, center), new_velocity


def adam_outer_step(center, delta, moments, learning_rate, beta_1, beta_2, epsilon,
                    scale=1.0, trainable=None):
    """FedAdam server (Reddi et al. 2021): one Adam step along a worker's change.

    With ``d = scale * delta``: ``m' = b1 m + (1 - b1) d``, ``v' = b2 v + (1 - b2) d**2``
    and ``C' = C + lr * m' / (sqrt(v') + epsilon)``, without bias correction, as the paper.

    Args:
        center: The center variable.
        delta: A worker's change over its window, ``W - W_pull``.
        moments: ``(m, v)`` (same layout as the weights), or None before the first step.
        learning_rate: The server's Adam learning rate.
        beta_1: The first moment's decay.
        beta_2: The second moment's decay.
        epsilon: Added to ``sqrt(v)`` (the paper's tau).
        scale: Multiplies the change of trainable weights (a staleness discount).
        trainable: Optional flags, one per weight: where False (a non-trainable weight),
            the change is added as it is, unscaled.

    Returns:
        ``(new center, (new m, new v))``.
    """
    flags = _per_weight(center, trainable)
    size = len(center)
    new_center, first, second = (np.empty(size, object) for _ in range(3))
    for index, (layer, change) in enumerate(zip(center, delta)):
        m, v = (0.0, 0.0) if moments is None else (moments[0][index], moments[1][index])
        scaled = change * scale if flags[index] else change
        first[index] = beta_1 * m + (1.0 - beta_1) * scaled
        second[index] = beta_2 * v + (1.0 - beta_2) * scaled * scaled
        new_center[index] = (layer + learning_rate * first[index]
                             / (np.sqrt(second[index]) + epsilon)
                             if flags[index] else layer + change)
    return _in_dtypes(new_center, center), (first, second)
