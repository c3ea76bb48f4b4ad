"""How a worker's failure reaches the driver: its one-line form, whether a retry could
get past it, and the report to the driver's server."""

import logging
import re

from distkeras.errors import DistkerasError, UnretryableError
from distkeras.transport import networking

logger = logging.getLogger(__name__)


class WorkerFailure(DistkerasError, RuntimeError):
    """A worker's training failed; the message names its partition and the cause."""


def unretryable_error(error):
    """The `UnretryableError` that caused ``error`` (itself, or one it was raised from),
    or None."""
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UnretryableError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def one_line(error):
    """``"Type: message"`` of an exception on one line: the driver shows the line of a
    failed Spark job that names the worker's exception, and Keras's layer errors put their
    cause on the lines after "Exception encountered when calling ..." (in bold: ANSI
    codes)."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", f"{type(error).__name__}: {error}")
    return " ".join(text.split())


def send_failure(sock, error, worker_id):
    """Tells the driver's server on ``sock`` of the error that stops worker ``worker_id``
    (`SocketParameterServer.handle_failure`); the server then closes the connection. A
    failure to send only logs: the task's own reply still carries the error."""
    try:
        networking.send_action(sock, networking.ACTION_FAILURE)
        networking.send_data(sock, {"error": one_line(error)})
    except OSError as cause:
        logger.warning("Worker %s could not report its failure: %s", worker_id, cause)
