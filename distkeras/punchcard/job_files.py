"""A Punchcard job's folder: what the server writes there, and what the job leaves in it.

Each job has a folder of its own under the server's work folder, named by the job's id
(never by anything a client sent), readable by the server's user only. The server writes
the submission there (`write_submission`); the job's process writes its status, log,
trained model and histories, which the server reads back. Run in the server.
"""

import json
import os
import re

# The files of a job's folder.
MODEL = "model.keras"  # the submitted model
TRAINER = "trainer.json"  # the trainer's checked configuration
TRAIN_OPTIONS = "train_options.json"
STATUS = "status.json"  # written by the job as it runs
LOG = "job.log"
TRAINED = "trained.keras"
HISTORY = "history.json"
VALIDATION = "validation.json"

# The lines of a job's log that say why it died: log ERRORs, tracebacks and their
# exception lines.
_ERROR_LINE = re.compile(r"\bERROR\b|^Traceback |^[\w.]*(Error|Exception)\b")


def path(job, name):
    """The path of the file ``name`` (`MODEL`, `STATUS`, ...) in ``job``'s folder."""
    return os.path.join(job["job_dir"], name)


def write_submission(work_dir, job_id, model_bytes, config, train_options):
    """Makes job ``job_id``'s folder and writes its model, trainer config and train
    options there; returns the folder's path.

    Raises:
        OSError: If the folder exists already, or cannot be written.
    """
    job_dir = os.path.join(work_dir, "jobs", job_id)
    os.makedirs(os.path.dirname(job_dir), mode=0o700, exist_ok=True)
    os.makedirs(job_dir, mode=0o700)
    job = {"job_dir": job_dir}
    with open(path(job, MODEL), "wb") as handle:
        handle.write(model_bytes)
    with open(path(job, TRAINER), "w", encoding="utf-8") as handle:
        json.dump(config, handle)
    with open(path(job, TRAIN_OPTIONS), "w", encoding="utf-8") as handle:
        json.dump(train_options, handle)
    return job_dir


def read_status(job):
    """The job's status file (``{"state": ...}``), or None if it has written none yet."""
    try:
        with open(path(job, STATUS), encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return None


def read_train_options(job):
    """The job's train options, or ``{}`` if it has none (a job from before them)."""
    try:
        with open(path(job, TRAIN_OPTIONS), encoding="utf-8") as handle:
            options = json.load(handle)
    except (OSError, ValueError):
        return {}
    return options if isinstance(options, dict) else {}


def open_results(job):
    """A finished job's results: its trained model as an open binary file (the caller's to
    close; it stays readable if the job is deleted meanwhile), its history and validation
    history.

    Raises:
        OSError: If the files are missing (or were deleted under this read).
    """
    model = open(path(job, TRAINED), "rb")
    try:
        with open(path(job, HISTORY), encoding="utf-8") as handle:
            history = json.load(handle)
        validation = []
        if os.path.exists(path(job, VALIDATION)):  # jobs queued before train options
            with open(path(job, VALIDATION), encoding="utf-8") as handle:
                validation = json.load(handle)
    except (OSError, ValueError):
        model.close()
        raise
    return {"model": model, "history": history, "validation_history": validation}


def log_tail(job, count=3):
    """The last ``count`` error lines of the job's log, or "" when there are none: other
    lines say nothing about why a job died."""
    try:
        with open(path(job, LOG), "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 8000))
            lines = handle.read().decode("utf-8", "replace").strip().splitlines()
    except OSError:
        return ""
    errors = [line.strip() for line in lines if _ERROR_LINE.search(line)]
    return " | ".join(errors[-count:])[-500:]
