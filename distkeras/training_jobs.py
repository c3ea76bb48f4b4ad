"""The Spark jobs a trainer runs its workers in, under its old import path.

A thin face: the names live in `distkeras.training.spark_jobs` (see there).
"""

from distkeras.training.spark_jobs import (ARROW_BATCH_KEY, FEED_RECORDS_PER_BATCH,
                                           feed_batch_rows, begin_run, end_run,
                                           UNEVEN_TOLERANCE, warn_if_uneven,
                                           warn_if_speculative, worker_error_message,
                                           check_executor_python, raise_reported_failure,
                                           register_user_module, UNRETRYABLE,
                                           arrow_training_job, REPLY_CHUNK_BYTES, reply_chunks,
                                           joined_replies, driver_address, bind_address)

__all__ = ["ARROW_BATCH_KEY", "FEED_RECORDS_PER_BATCH", "feed_batch_rows", "begin_run",
           "end_run", "UNEVEN_TOLERANCE", "warn_if_uneven", "warn_if_speculative",
           "worker_error_message", "check_executor_python", "raise_reported_failure",
           "register_user_module", "UNRETRYABLE", "arrow_training_job", "REPLY_CHUNK_BYTES",
           "reply_chunks", "joined_replies", "driver_address", "bind_address"]
