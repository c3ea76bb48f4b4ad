"""What the driver checks and builds before a run's first Spark job.

The custom objects the executors need, the compile arguments against the data's shapes,
the sample and class weights, and the `validator.Validator` of the validation data and
the callbacks. Everything here raises on the driver, naming what to change, rather than
on every executor.
"""

from distkeras.data import frame_columns
from distkeras.data import sample_weights
from distkeras.keras_io import custom_objects
from distkeras.keras_io.archives import deserialize_model, serialize_model
from distkeras.keras_io.compile_config import check_compile_arguments, serialize_keras_object
from distkeras.training import validation_data
from distkeras.training import validator
from distkeras.training.callbacks import warn_of_step_mean_metrics


def check_run(run, dataframe, label_shapes, sample_weight_col, class_weight):
    """Checks here what would fail on every executor; keeps on ``run`` what the workers
    need (the custom objects, the weight column, the class weights)."""
    settings = run.settings
    run.custom_objects = find_custom_objects(settings)
    output_shapes = [tuple(tensor.shape[1:]) for tensor in settings.master_model.outputs]
    check_compile_arguments(settings.worker_optimizer, settings.loss, settings.metrics,
                            label_shapes, output_shapes, settings.loss_weights)
    if settings.label_col is None and (sample_weight_col is not None
                                       or class_weight is not None):
        # fit(x, sample_weight=w) drops the weights (y is None: x alone reaches the step).
        raise ValueError(
            "sample_weight_col and class_weight weigh the rows' targets: with "
            "label_col=None there are none (Keras's fit(x) drops sample weights without y). "
            "Name a label column, or leave the weights out.")
    run.sample_weight_col = sample_weight_col
    run.class_table = sample_weights.validate(
        dataframe, sample_weight_col, class_weight,
        frame_columns.as_column_list(settings.features_col)
        + frame_columns.as_column_list(settings.label_col), label_shapes, output_shapes)


def find_custom_objects(settings):
    """The user's own layers, losses, metrics the executors need; checked here first."""
    model = settings.master_model
    compile_objects = (settings.worker_optimizer, settings.loss, settings.metrics)
    found, unresolved = custom_objects.find(
        model, compile_objects + (settings.weighted_metrics,))
    # Keras's own objects rebuild, but for those holding Python code (a Lambda's).
    if found or unresolved or custom_objects.holds_python_code(model):
        custom_objects.check_rebuildable(
            serialize_model(model),
            [serialize_keras_object(obj) for obj in compile_objects]
            + [settings.loss_weights, serialize_keras_object(settings.weighted_metrics)],
            found, unresolved)
    return found


def make_validator(run, validation_frame, callbacks, compile_model):
    """A `validator.Validator` for the validation rows and the callbacks, or None
    without either.

    Args:
        run: The `run.Run`.
        validation_frame: A DataFrame, ``(x, y[, sample_weight])`` arrays, or None.
        callbacks: The checked callbacks, or None.
        compile_model: ``compile_model(model)`` compiles the driver's model as the
            returned one is.
    """
    if validation_frame is None and not callbacks:
        return None

    settings = run.settings
    if callbacks:
        warn_of_step_mean_metrics(settings.metrics)
    x = y = weights = None
    if isinstance(validation_frame, tuple):
        x, y, weights = validation_data.from_arrays(validation_frame, settings.master_model)
        check_validation_labels(settings, y)
    elif validation_frame is not None:
        x, y, weights = validation_data.collect(validation_frame, settings.master_model,
                                                settings.features_col, settings.label_col,
                                                run.sample_weight_col)
        check_validation_labels(settings, y)
    model = compile_model(deserialize_model(serialize_model(settings.master_model)))
    # In minibatches of the training's size, as `fit` validates (its
    # validation_batch_size defaults to batch_size): a loss summed per minibatch
    # (reduction="sum"), or averaged over the elements it does not ignore (ignore_class),
    # is a mean over minibatches whose value depends on their size.
    return validator.Validator(model, x, y, batch_size=settings.batch_size,
                               callbacks=callbacks, num_epoch=settings.num_epoch,
                               sample_weight=weights)


def check_validation_labels(settings, y):
    """Checks the validation labels against the loss, as the training labels are
    (class indices with a one-hot loss, or one-hot labels with a sparse loss, would
    fail at the first epoch's end, after it trained).

    Args:
        settings: The run's `Settings`.
        y: The validation labels as the model is evaluated on them: an array, or a
            list of arrays for several outputs.

    Raises:
        ValueError: Saying that the validation data is at fault, and what to change.
    """
    if y is None:  # no targets (label_col=None), as for fit(x): nothing to check
        if settings.label_col is not None or settings.loss is not None:
            raise ValueError(
                "validation_data holds no labels (y is None), but the model trains on "
                f"label_col={settings.label_col!r} with loss={settings.loss!r}: give (x, y).")
        return
    labels = y if isinstance(y, list) else [y]
    output_shapes = [tuple(tensor.shape[1:]) for tensor in settings.master_model.outputs]
    label_shapes = [label.shape[1:] if shape and shape[-1] > 1
                    and label.shape[1:] == shape[:-1] else shape
                    for label, shape in zip(labels, output_shapes)]
    try:
        check_compile_arguments(settings.worker_optimizer, settings.loss, settings.metrics,
                                label_shapes, output_shapes)
    except ValueError as error:
        raise ValueError(f"In validation_data: {error}") from error
