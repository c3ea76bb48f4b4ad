"""Checks a training DataFrame against the model and lays it out for the workers.

A thin face: the column expressions live in `distkeras.data.frame_columns`, the checks
against the model in `distkeras.data.frame_checks`, and the layout for the workers in
`distkeras.data.frame_layout`.
"""

import logging

from distkeras.data.frame_checks import (check_column_order, check_first_row,
                                         check_input_count, check_known_inputs,
                                         check_spark_dataframe, columns_by_name,
                                         model_names, validate)
from distkeras.data.frame_columns import (as_column_list, check_output_column_free, column,
                                          features_type_hint, same_column,
                                          string_features_hint, training_column,
                                          vector_values)
from distkeras.data.frame_layout import (barrier_compatible, kept_for_epochs, lay_out,
                                         sparse_vector_columns, training_frame)

# Its name from before distkeras.data: logging set-ups (and the tests) select it. The same
# logger as `frame_layout`'s.
logger = logging.getLogger("distkeras.dataframes")

__all__ = ["column", "vector_values", "as_column_list", "same_column",
           "check_output_column_free", "training_column", "string_features_hint",
           "features_type_hint", "check_known_inputs", "check_input_count",
           "check_spark_dataframe", "columns_by_name", "model_names", "check_column_order",
           "validate", "check_first_row", "sparse_vector_columns", "training_frame",
           "lay_out", "barrier_compatible", "kept_for_epochs"]
