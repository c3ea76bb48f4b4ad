"""Punchcard, under its dist-keras name: the client, and the job server's public API.

The client::

    job = Job(secret, job_name, data_path, num_executors, num_processes, trainer)
    job.send("http://yourcluster:8000")
    job.wait_completion()
    trained_model = job.get_trained_model()
    history = job.get_history()

The server (``distkeras punchcard --secrets secrets.json --port 8000``) lives in
`distkeras.punchcard`, whose package docstring maps its modules. This module is a thin
face: the client's names are imported here, the server's only when one is asked for, so
a notebook that imports `Job` loads neither Flask nor the server.
"""

import importlib

from distkeras.punchcard.client import Job, JobError, ServerUnreachable
from distkeras.punchcard.protocol import SECRET_HEADER

# The server's names, by the `distkeras.punchcard` module that defines each.
_SERVER_NAMES = {
    "BadRequest": "refusals", "SubmissionInProgress": "submissions",
    "validate_submission": "submissions", "JOB_NAME_PATTERN": "submissions",
    "MAX_WORKERS": "submissions", "MAX_PARALLELISM_FACTOR": "submissions",
    "MAX_JSON_DEPTH": "submissions", "MAX_ARCHIVE_EXPANSION": "refusals",
    "ARCHIVE_EXPANSION_FLOOR": "refusals",
    "check_keras_parts": "keras_checks",
    "ModelChecker": "model_check",
    "Punchcard": "service",
    "create_app": "app", "make_server": "app",
    "serve": "commands", "secret_command": "commands", "CLI_COMMANDS": "commands",
}

__all__ = ["SECRET_HEADER", "Job", "JobError", "ServerUnreachable",
           "BadRequest", "SubmissionInProgress", "validate_submission", "JOB_NAME_PATTERN",
           "MAX_WORKERS", "MAX_PARALLELISM_FACTOR", "MAX_JSON_DEPTH", "MAX_ARCHIVE_EXPANSION",
           "ARCHIVE_EXPANSION_FLOOR", "check_keras_parts", "ModelChecker", "Punchcard",
           "create_app", "make_server", "serve", "secret_command", "CLI_COMMANDS"]


def __getattr__(name):
    """The server's names, imported when first asked for (PEP 562)."""
    if name not in _SERVER_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"distkeras.punchcard.{_SERVER_NAMES[name]}")
    return getattr(module, name)


def __dir__():
    return sorted(set(globals()) | set(_SERVER_NAMES))
