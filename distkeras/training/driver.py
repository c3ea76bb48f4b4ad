"""The sequence of one `train()` on the driver: settings, checks, the plan, the results.

`train` resolves the trainer's settings (`settings.resolve`), makes the run (`run.Run`)
and its plan (the trainer's ``plan``), checks the data and the options before any Spark
job, lets the plan train, compiles and validates the returned model, and leaves the
run's results on the trainer (`results.keep`), also when the run failed.
"""

import math
import time

from distkeras.algorithms.arguments import check_number
from distkeras.data import frame_checks, frame_layout
from distkeras.executor.devices import log_driver_devices
from distkeras.keras_io import custom_objects
from distkeras.training import batch_statistics
from distkeras.training import preparation
from distkeras.training import results
from distkeras.training import validation_data
from distkeras.training import worker_setup
from distkeras.training.callbacks import check_callbacks
from distkeras.training.monitor import report_returned_validation, resolve_verbose
from distkeras.training.run import Run
from distkeras.training.spark_jobs import begin_run, end_run


def train(trainer, dataframe, options, overrides=None):
    """Trains ``trainer`` on ``dataframe``; see `Trainer.train` for ``options``.

    Args:
        trainer: The trainer; only its results change (`results.keep`).
        dataframe: The Spark DataFrame.
        options: `Trainer.train`'s keyword arguments but ``dataframe``, by name.
        overrides: Settings to replace for this run only (`settings.resolve`).

    Returns:
        The compiled model (a list of them for an ensemble).
    """
    run_id, label = begin_run(type(trainer).__name__)
    try:
        verbose = resolve_verbose(options["verbose"])
        run = Run(trainer.settings(**(overrides or {})), label, verbose,
                  options["checkpoint_dir"], options["checkpoint_every"], options["resume"],
                  name=type(trainer).__name__)
        return _train(trainer, trainer.make_plan(run), dataframe, options)
    finally:
        end_run(run_id)


def check_checkpointing(plan):
    """Refuses checkpoint options that ``plan`` cannot honour."""
    run = plan.run
    if not (plan.keeps_center or plan.checkpoints_epochs):
        if run.checkpoint_dir is not None or run.resume:
            raise ValueError(
                f"{run.name} keeps no center variable to checkpoint: "
                "checkpoint_dir and resume need a parameter-server trainer (ADAG, DOWNPOUR, "
                "AEASGD, EAMSGD, DynSGD, Experimental or your own) or AllReduceTrainer.")
        return
    if run.resume and run.checkpoint_dir is None:
        raise ValueError("resume=True needs the checkpoint_dir to resume from: pass "
                         "train(df, checkpoint_dir=..., resume=True) with the folder that "
                         "an earlier run's checkpoint_dir named.")
    if run.checkpoint_dir is not None and plan.keeps_center:
        check_number("checkpoint_every", run.checkpoint_every)


def _train(trainer, plan, dataframe, options):
    run, settings = plan.run, plan.settings
    name = run.name
    log_driver_devices(name)
    check_checkpointing(plan)
    frame_checks.check_spark_dataframe(dataframe)
    callbacks = check_callbacks(
        options["callbacks"], name,
        learning_rate_callbacks=plan.follows_learning_rate_callbacks)
    validation = options["validation_data"]
    dataframe, validation_frame = (dataframe, None) if validation is None \
        else validation_data.split(dataframe, validation)
    label_shapes = frame_checks.validate(
        dataframe, settings.master_model, settings.features_col, settings.label_col)
    preparation.check_run(run, dataframe, label_shapes, options["sample_weight_col"],
                          options["class_weight"])
    # Once the optimizer's name is known to be Keras's (`check_run`).
    run.workers_optimizer = worker_setup.workers_optimizer(trainer, settings)
    frame = frame_layout.training_frame(dataframe, settings.features_col, settings.label_col,
                                        options["sample_weight_col"])
    with custom_objects.scope(run.custom_objects):
        if callbacks and not plan.watches_one_model:
            raise ValueError(f"{name} trains independent models: callbacks, which "
                             "watch one model, do not apply. Use validation_data alone.")
        # Collecting and counting are Spark jobs of their own: done before the clock.
        run.validator = preparation.make_validator(
            run, validation_frame, callbacks,
            lambda model: worker_setup.compile_returned(run.workers_optimizer, settings,
                                                        model))
        run.progress_total = plan.samples_for_progress(frame) \
            if run.verbose or run.validator else None
        if run.validator is not None and run.progress_total:
            run.validator.set_steps_per_epoch(math.ceil(
                run.progress_total / settings.num_epoch / settings.batch_size))
        start = time.time()
        if run.validator is not None:
            run.validator.begin()
        try:
            model = plan.train(frame, label_shapes, options["shuffle"])
        finally:
            run.training_time = time.time() - start
            run.history.sort(key=lambda r: (r["timestamp"], r["worker_id"], r["iteration"]))
            results.keep(trainer, run)
        model = plan.compile(model)
        if trainer.averages_weights:
            batch_statistics.measure_again(model, dataframe, settings.features_col,
                                           settings.label_col)
        validated = len(run.validation_history())
        validate_returned(plan, model)
        run.returned_records = run.returned_validation(validated)
        results.keep(trainer, run)
        report_returned_validation(run.label, run.returned_records, run.verbose)
        return model


def validate_returned(plan, model):
    """Evaluates the returned model (each member of a list, as `member` i), and ends
    its training (`Plan.finalize_weights`) where `fit` does: after the last epoch's
    validation and callbacks, before the callbacks' ``on_train_end``."""
    run = plan.run
    num_epoch = run.settings.num_epoch
    if run.validator is None:
        if not isinstance(model, list):
            plan.finalize_weights(model)
        return
    if isinstance(model, list):
        for member, each in enumerate(model):
            samples, _ = run.trained_so_far(member)
            run.validator.evaluate_model(each, num_epoch, samples, member=member)
        return
    epochs = run.validator.stopped_epoch or num_epoch
    samples, logs = run.trained_so_far(epochs=epochs)
    run.validator.end(model, samples, logs.pop("loss", None), logs,
                      finalize=plan.finalize_weights)
