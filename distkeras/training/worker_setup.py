"""What the driver gives a run's workers, and how it compiles the model a run returns.

`configure_worker` and `configure_parameter_server_worker` hold the bodies of what were
``Trainer._configure_worker`` and ``AsynchronousDistributedTrainer._configure_worker``,
moved as they were, with ``self.<setting>`` read from ``run.settings`` and
``self._<state>`` from the run (``self._custom_objects`` is ``run.custom_objects``,
``self.parameter_server`` is ``run.server``, ``self._worker_host`` is ``run.worker_host``,
``self._validator`` is ``run.validator``).
"""

from distkeras.keras_io import model_state
from distkeras.keras_io.compile_config import (compile_arguments, optimizer_as_compiled,
                                               serialize_keras_object, with_learning_rate)
from distkeras.training.spark_jobs import register_user_module
from distkeras.transport import compression as codecs

# With validation or callbacks, workers report (and the monitor looks) this often, so that
# the end of an epoch is seen within about this long.
VALIDATING_REPORT_SECONDS = 0.1


def workers_optimizer(trainer, settings):
    """The optimizer (a name, an instance or a config) the workers and the returned model
    train with: ``worker_optimizer``, with ``learning_rate`` as its rate where the trainer
    class `sets_worker_learning_rate` and one is given; else, for an optimizer given by
    name, Keras's default rate for it times the algorithm's `worker_learning_rate_factor`
    (ADAG's). An optimizer instance or config keeps the rate it was given.

    Args:
        trainer: The trainer (its class's declaration).
        settings: Anything with ``worker_optimizer``, ``learning_rate`` (where the class
            has one) and ``master_model``: a run's `Settings`, or the trainer itself.
    """
    learning_rate = getattr(settings, "learning_rate", None)
    if getattr(trainer, "sets_worker_learning_rate", False) and learning_rate is not None:
        return with_learning_rate(settings.worker_optimizer, learning_rate,
                                  settings.master_model)
    algorithm = getattr(trainer, "algorithm", None)
    factor = 1.0 if algorithm is None else \
        algorithm.worker_learning_rate_factor(settings.communication_window,
                                              getattr(settings, "num_workers", 1))
    rate = None if factor == 1.0 else default_learning_rate(settings.worker_optimizer)
    if rate is None:
        return settings.worker_optimizer
    return with_learning_rate(settings.worker_optimizer, rate * factor, settings.master_model)


def default_learning_rate(optimizer):
    """Keras's default learning rate for an optimizer given by name (``"adam"``), or None
    for an instance or a config: its rate was chosen, and is left as it is."""
    import keras

    if not isinstance(optimizer, str):
        return None
    optimizer = keras.optimizers.get(optimizer)
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


def execution_options(model):
    """How the given model, if compiled, runs its later `fit`, `evaluate` and `predict`
    (``jit_compile``, ``steps_per_execution``, ``run_eagerly``): the returned model keeps
    them, and the workers run their steps with its ``jit_compile`` and ``run_eagerly``
    (a Python side effect in ``train_step`` or a layer's ``call`` then happens at every
    step, as in its `fit`; JAX's window of steps in one compiled call needs both on).
    A ``steps_per_execution`` above 1 makes them run each window in one compiled call
    (see `jax_steps.CallLength`)."""
    if not getattr(model, "compiled", False):
        return {}
    config = model.get_compile_config() or {}
    return {name: config[name] for name in ("jit_compile", "steps_per_execution",
                                            "run_eagerly") if name in config}


def compile_returned(optimizer, settings, model):
    """Compiles ``model`` as a run with ``settings`` returns it: with the workers'
    ``optimizer`` (`workers_optimizer`), the loss, the metrics and the given model's
    execution options; returns it."""
    # From configs, so the returned model never shares optimizer state with objects the
    # user passed in; the optimizer as the workers had it (see `optimizer_as_compiled`).
    model.compile(**compile_arguments(
        optimizer_as_compiled(optimizer, settings.master_model),
        serialize_keras_object(settings.loss),
        serialize_keras_object(settings.metrics), settings.loss_weights,
        serialize_keras_object(settings.weighted_metrics), model=model),
        **execution_options(settings.master_model))
    # Built now, as after `fit`: a saved model then holds the optimizer's variables,
    # and loading it does not warn that their number differs.
    model.optimizer.build(model.trainable_variables)
    return model


def configure_worker(run, worker):
    """Fills the worker's unset settings from the run's (was ``Trainer._configure_worker``)."""
    import keras

    settings = run.settings
    defaults = {
        "optimizer": optimizer_as_compiled(run.workers_optimizer, settings.master_model),
        "loss": settings.loss,
        "loss_weights": settings.loss_weights, "metrics": settings.metrics,
        "features_col": settings.features_col, "label_col": settings.label_col,
        "batch_size": settings.batch_size, "num_epoch": settings.num_epoch,
    }
    # The worker's spec (`executor.task_spec.TaskSpec`): what its constructor left
    # unset, from the run; the rest from the run alone.
    worker.spec = worker.spec.filled(**{
        name: serialize_keras_object(value) for name, value in defaults.items()
    }).replace(
        backend=keras.backend.backend(),
        custom_objects=dict(run.custom_objects or {}),
        weighted_metrics=serialize_keras_object(settings.weighted_metrics),
        execution_options={
            name: value for name, value in execution_options(settings.master_model).items()
            if name in ("jit_compile", "run_eagerly", "steps_per_execution")},
        sample_weight_col=run.sample_weight_col,
        # The `.keras` bytes leave them out: without them each worker's Dropout would
        # draw from its executor's own seed (see `model_state.seed_states`).
        seed_states=model_state.seed_states(settings.master_model),
        class_table=run.class_table)
    register_user_module(worker)


def configure_parameter_server_worker(run, worker):
    """`configure_worker`, then the parameter server's address and the exchange's
    settings (was ``AsynchronousDistributedTrainer._configure_worker``)."""
    configure_worker(run, worker)
    settings = run.settings
    server = run.server
    spec = worker.spec.filled(communication_window=settings.communication_window,
                              learning_rate=settings.learning_rate)
    spec = spec.replace(master_host=run.worker_host, master_port=server.port,
                        token=server.token)
    if run.validator is not None:
        # Epoch ends are seen in the history the workers send: send it more often.
        spec = spec.replace(history_every_seconds=VALIDATING_REPORT_SECONDS)
    if settings.overlap_communication:
        spec = spec.replace(overlap_communication=True)
    compression = codecs.parse(getattr(settings, "compression", None))
    if compression is not None:
        spec = spec.replace(compression=str(compression))
    shards = getattr(server, "shards", None)
    if shards is not None:
        spec = spec.replace(shard_ports=tuple(shards.ports))
    worker.spec = spec
    if settings.overlap_communication:
        checker = getattr(worker, "check_overlap", None)
        if checker is None:
            raise ValueError(f"{type(worker).__name__} cannot overlap communication. "
                             "Use overlap_communication=False (the CLI: leave out "
                             "--overlap-communication).")
        checker()  # a clear error on the driver, before any Spark job
