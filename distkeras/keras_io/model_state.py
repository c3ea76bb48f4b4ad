"""The state of a Keras model that its weights leave out.

Its random seed generators' (`seed_states`, made each worker's own by
`seed_worker_generators`) and its optimizer's (`get_optimizer_state`,
`set_optimizer_state`, and `finalize_weights` as `fit` ends).
"""

import numpy as np


def _seed_variables(model):
    """The state variables of ``model``'s random seed generators (Dropout's,
    GaussianNoise's, RandomFlip's, ...): its variables that are neither weights nor
    metrics, in the order of ``model.variables`` (the same for every copy of the model)."""
    weights = {id(variable) for variable in model.weights}
    return [variable for variable in model.variables if id(variable) not in weights]


def seed_states(model):
    """The states of ``model``'s random seed generators, as ``[seed, counter]`` lists.

    A `.keras` archive does not hold them: a model loaded from one draws fresh seeds
    from its process's ``random`` module, which on an executor neither
    ``keras.utils.set_random_seed`` on the driver nor a layer's own ``seed`` reaches. The
    trainer sends them to the workers with the model.
    """
    return [[int(value) for value in np.asarray(variable.value).reshape(-1)]
            for variable in _seed_variables(model)]


def worker_seed(seed, worker_id, steps_before):
    """The seed worker ``worker_id`` draws from in a task that starts after
    ``steps_before`` steps, for a random layer seeded ``seed`` on the driver.

    Worker 0's first task keeps the seed, so one replica draws the masks the model's own
    ``fit`` would; every other worker, and a later task of the same worker (a job per
    epoch), gets a seed of its own: the same seed on every worker would draw the same
    Dropout masks on all of them, step for step, and a job per epoch the same masks every
    epoch. A retried task draws its attempt's masks again.
    """
    if worker_id == 0 and steps_before == 0:
        return int(seed)
    mixed = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, int(worker_id),
                                    int(steps_before)]).generate_state(1)[0]
    return int(mixed) & 0x7FFFFFFF  # fits every backend's seed dtype (int32 too)


def seed_worker_generators(model, states, worker_id, steps_before):
    """Starts ``model``'s seed generators from ``states`` (see `seed_states`), each seed
    made this worker's own by `worker_seed`.

    Raises:
        ValueError: When ``states`` does not fit the model's seed generators.
    """
    variables = _seed_variables(model)
    if len(states) != len(variables):
        raise ValueError(f"The model has {len(variables)} seed generators; "
                         f"{len(states)} seed states were given.")
    for variable, state in zip(variables, states):
        if len(state) != 2:
            raise ValueError(f"Seed generator {variable.path} holds [seed, counter]; the "
                             f"state given is {state!r}.")
        seed, counter = state
        variable.assign(np.asarray([worker_seed(seed, worker_id, steps_before), counter],
                                   dtype=variable.dtype))


def get_optimizer_state(model):
    """The values of a compiled model's optimizer variables (its step count, moments)."""
    return [np.array(variable.value) for variable in model.optimizer.variables]


def finalize_weights(model):
    """Ends training as `fit` does: an optimizer with ``use_ema=True`` leaves its moving
    averages of the weights as the model's trainable weights (no-op otherwise).

    Returns:
        Whether it changed the weights.
    """
    optimizer = model.optimizer
    if not getattr(optimizer, "use_ema", False):
        return False
    optimizer.finalize_variable_values(model.trainable_weights)
    return True


def set_optimizer_state(model, values):
    """Gives a compiled model's optimizer the values `get_optimizer_state` returned for the
    same model and optimizer, so training goes on as if it had never stopped.

    Raises:
        ValueError: When the values do not fit the optimizer's variables.
    """
    optimizer = model.optimizer
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    variables = optimizer.variables
    if len(variables) != len(values):
        raise ValueError(f"The optimizer has {len(variables)} variables; the state given "
                         f"has {len(values)}.")
    for variable, value in zip(variables, values):
        if tuple(variable.shape) != tuple(np.shape(value)):
            raise ValueError(f"Optimizer variable {variable.path} has shape "
                             f"{tuple(variable.shape)}; the state given has "
                             f"{tuple(np.shape(value))}.")
        variable.assign(value)
