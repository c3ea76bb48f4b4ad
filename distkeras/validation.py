"""Validation during training, as Keras's ``fit(validation_data=...)`` reports it.

``train(df, validation_data=val_df)`` (or a fraction of ``df``, split off at random, or
numpy arrays ``(x, y)`` as for ``fit``) holds the validation rows on the driver as numpy
arrays and evaluates the model on them: the center variable as the workers' samples
complete each epoch (parameter-server trainers), the average after each epoch
(`AveragingTrainer`), the exact end of each epoch (`SingleTrainer`), and the returned
model at the end.
Each evaluation is one record of ``trainer.get_validation_history()``: ``epoch``,
``samples`` (trained so far), ``timestamp``, ``loss`` (the epoch's mean step loss, where
known), ``val_loss`` and ``val_<metric>``.

The code lives in `distkeras.training`: `validation_data` (the rows), `callbacks` (the
Keras callbacks' checks) and `validator` (the per-epoch evaluation). This module is their
face under the old import path.
"""

from distkeras.training.callbacks import (LEARNING_RATE_CALLBACKS, as_callback_list,
                                          check_callbacks, keras_callback_list,
                                          warn_of_step_mean_metrics)
from distkeras.training.validation_data import (MAX_ROWS, SPLIT_COLUMN, collect,
                                                from_arrays, split)
from distkeras.training.validator import Validator, epoch_logs

__all__ = ["LEARNING_RATE_CALLBACKS", "MAX_ROWS", "SPLIT_COLUMN", "Validator",
           "as_callback_list", "check_callbacks", "collect", "epoch_logs", "from_arrays",
           "keras_callback_list", "split", "warn_of_step_mean_metrics"]
