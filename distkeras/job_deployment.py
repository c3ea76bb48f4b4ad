"""Punchcard, under its dist-keras name: the client `Job`, and the job server `Punchcard`.

The client::

    job = Job(secret, job_name, data_path, num_executors, num_processes, trainer)
    job.send("http://yourcluster:8000")
    job.wait_completion()
    trained_model = job.get_trained_model()
    history = job.get_history()

The server (``distkeras punchcard --secrets secrets.json --port 8000``) lives in
`distkeras.punchcard`, whose package docstring maps its modules. This module is a thin
face: `Job` is imported here, `Punchcard` only when asked for, so a notebook that imports
`Job` loads neither Flask nor the server. The client's errors (`JobError`,
`ServerUnreachable`) are imported from `distkeras.punchcard.client`.
"""

import importlib

from distkeras.punchcard.client import Job

__all__ = ["Job", "Punchcard"]


def __getattr__(name):
    """`Punchcard`, imported when first asked for (PEP 562)."""
    if name != "Punchcard":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    # The server's modules load Flask and waitress, which a client never needs.
    return importlib.import_module("distkeras.punchcard.service").Punchcard


def __dir__():
    return sorted(set(globals()) | {"Punchcard"})
