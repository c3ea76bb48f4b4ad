"""Errors that say what kind of failure happened, so each is handled as it should be."""


class InvalidDataError(ValueError):
    """Rows that no retry can train on: nulls, NaN or infinite values, arrays of the wrong
    length, class indices out of range, negative sample weights.

    A worker that meets them tells the driver instead of failing its Spark task: Spark
    retries a failed task (4 times on a cluster's defaults), and each retry would read
    the same rows to the same error, after training again up to them.
    """
