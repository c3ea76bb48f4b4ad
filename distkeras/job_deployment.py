"""Punchcard: a job server that trains on the cluster what a notebook sends it (seed 002).

The client::

    job = Job(secret, job_name, data_path, num_executors, num_processes, trainer)
    job.send("http://yourcluster:8000")
    job.wait_completion()
    trained_model = job.get_trained_model()
    history = job.get_history()

The server (``python scripts/punchcard.py --secrets secrets.json --port 8000``) is a Flask
application behind the waitress WSGI server. Each job runs as its own process and Spark
application (``python -m distkeras.cli train ...``, arguments as a list, no shell), in its
own folder; the job table lives in SQLite. Nothing a client sends is executed: the trainer
travels as a registered class name and its JSON configuration, the model as a `.keras`
archive loaded with ``safe_mode=True``, after its configuration was walked as JSON
(`config_scan`), and only in a child process with resource limits (`model_check`). The
HTTP front (`http_front`) checks secrets and sizes from the headers and drops slow clients.
"""

import argparse
import base64
import functools
import http.client
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import uuid
import zipfile

from distkeras import data_roots, train_options
from distkeras.model_check import ModelChecker

logger = logging.getLogger(__name__)

SECRET_HEADER = "X-Punchcard-Secret"
# Matched with fullmatch: a pattern ending in `$` would accept a trailing newline.
JOB_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
MAX_WORKERS = 1024
MAX_PARALLELISM_FACTOR = 64
# Lists and objects in a submission: a trainer's settings nest a few levels (a loss per
# output, a learning-rate schedule in an optimizer's config). Deeper, the checks that
# recurse into them (copies, Keras's getters) would run out of stack.
MAX_JSON_DEPTH = 100
# Hadoop glob syntax ({a,b}, [ab], *, ?, and \ escapes) and Spark's comma-separated path
# lists: Spark expands them when it reads, so a path made of them could name files outside
# the allowed roots whatever its literal prefix is.
_GLOB_CHARACTERS = set("{}[]*?\\,")


class JobError(RuntimeError):
    """The server refused a request, or the job failed, was cancelled or was lost.

    Attributes:
        status: The HTTP status of the server's refusal, or None.
    """

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


class ServerUnreachable(JobError):
    """The server could not be reached (down, restarting, or a network problem)."""


def _error_message(error):
    """The ``error`` field of an error answer's JSON object, else the HTTP reason."""
    try:
        body = json.loads(error.read().decode("utf-8"))
    except (ValueError, OSError, http.client.HTTPException):
        return error.reason
    return body.get("error", "") if isinstance(body, dict) else error.reason


# --------------------------------------------------------------------------------------
# The client


class Job:
    """A training job for a Punchcard server.

    Args:
        secret: Your secret (see ``scripts/generate_secret.py``).
        job_name: A name: letters, digits, ``_``, ``.``, ``-`` (at most 64).
        data_path: The Parquet data, as the cluster reads it (``hdfs://...``).
        num_executors: Spark executors; the data is split into
            ``num_executors * num_processes`` partitions, one worker each.
        num_processes: Worker processes per executor.
        trainer: A distkeras trainer (its class must be registered on the server); None
            to follow, with `attach`, a job sent from elsewhere.
        train_options: Options of `train()`, as JSON: ``shuffle`` (bool), ``validation``
            (a fraction of the rows to hold out, or a Parquet path the cluster reads),
            ``sample_weight_col`` (a column name), ``class_weight`` (class index to weight).
    """

    def __init__(self, secret, job_name, data_path, num_executors, num_processes, trainer,
                 train_options=None):
        self.secret = secret
        self.train_options = train_options
        self.validation_history = None
        self.job_name = job_name
        self.data_path = data_path
        self.num_executors = num_executors
        self.num_processes = num_processes
        self.trainer = trainer
        self.url = None
        self.model_bytes = None
        self.history = None
        self.state = None

    def _request(self, method, path, body=None, timeout=60):
        if not self.url:
            raise JobError(f"Job {self.job_name!r} has no server: call job.send(url) to submit "
                           "it, or job.attach(url) to follow a job already submitted with "
                           "this secret.")
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(
            self.url.rstrip("/") + path, data=data, method=method,
            headers={SECRET_HEADER: self.secret, "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            raise JobError(f"Punchcard answered {error.code}: {_error_message(error)}",
                           status=error.code) from error
        # HTTPException: the connection was cut mid-answer (IncompleteRead), as in a
        # restart: transient, as an unreachable server is (wait_completion polls on).
        except (urllib.error.URLError, OSError, http.client.HTTPException) as error:
            raise ServerUnreachable(
                f"Cannot reach the Punchcard server at {self.url}: {error}") from error
        try:
            answer = json.loads(raw.decode("utf-8"))
        except ValueError:  # UnicodeDecodeError is one
            answer = None
        if not isinstance(answer, dict):
            raise JobError(f"{self.url} answered {path} with something other than a JSON "
                           f"object ({raw[:80]!r}): is it a Punchcard server's address?")
        return answer

    def _settled_trainer(self):
        """The trainer, its optimizer, loss and metrics not given taken from its compiled
        model (as `train()` takes them): the server and `get_trained_model` need them
        explicit, for the archive travels without its compile configuration's objects."""
        self.trainer._use_compiled_settings()
        return self.trainer

    def payload(self):
        """The submission: names, numbers, the trainer's class and JSON config, the model."""
        from distkeras.utils import serialize_model

        if self.trainer is None:
            raise JobError(f"Job {self.job_name!r} has no trainer to send: give one (ADAG(...), "
                           "...) to Job(...); trainer=None only follows a job already sent, "
                           "with job.attach(url).")
        self._settled_trainer()
        return {
            "job_name": self.job_name,
            "data_path": self.data_path,
            "num_executors": self.num_executors,
            "num_processes": self.num_processes,
            "trainer": {"class_name": type(self.trainer).__name__,
                        "config": self.trainer.get_config()},
            "model": base64.b64encode(serialize_model(self.trainer.master_model)).decode(),
            "train_options": self.train_options,
        }

    def send(self, url, timeout=600):
        """Submits the job to the server at ``url``.

        Args:
            url: The server's address (``http://host:8000``).
            timeout: Seconds to wait for the answer: the server checks the model (builds
                it, and the trainer) before it answers, minutes for a model of hundreds
                of layers.

        Raises:
            JobError: With the server's message (403: unknown secret or a job already
                submitted with it; 400: a malformed job; 413, or the connection closed
                while the job was sent: a job larger than the server accepts); or no
                answer within ``timeout`` seconds.
        """
        self.url = url
        payload = self.payload()
        try:
            answer = self._request("POST", "/api/submit", payload, timeout=timeout)
        except ServerUnreachable as error:
            if _timed_out(error):
                raise JobError(
                    f"The Punchcard server at {url} did not answer the submission of job "
                    f"{self.job_name!r} within {timeout} s. It may still be checking the "
                    "model and then queue the job: follow it with job.attach(url) in a "
                    "while, or send it with a longer timeout=.") from error
            status = self._probe_status() if _closed_while_sending(error) else None
            if status is None:
                raise
            if status == 403:  # the server refuses a large body of an unknown secret unread
                raise JobError(f"Punchcard answered 403: Unknown secret (job "
                               f"{self.job_name!r} was not sent).", status=403) from error
            megabytes = len(json.dumps(payload)) / (1 << 20)
            raise JobError(
                f"The Punchcard server at {url} closed the connection while job "
                f"{self.job_name!r} ({megabytes:.1f} MB, the model in base64) was being sent: "
                "it is larger than the server accepts (punchcard --max-request-mb). Ask its "
                "administrator to raise the limit, or send a smaller model.") from error
        self.state = answer.get("state")
        return answer

    def _probe_status(self):
        """The status of a small request (200, or the refusal's), None if unreachable."""
        try:
            self._request("GET", "/api/state", timeout=10)
        except ServerUnreachable:
            return None
        except JobError as refused:
            return refused.status  # 403 or 404: it answered
        return 200

    def attach(self, url):
        """Follows the job already submitted with this secret to the server at ``url``
        (from another notebook, or after a restart); returns its state.

        Raises:
            JobError: If the server knows no job for this secret.
        """
        self.url = url
        return self.get_state()

    def get_state(self):
        """The job's state: ``{"state", "running", "error", "progress", ...}``."""
        answer = self._request("GET", "/api/state")
        self.state = answer.get("state")
        return answer

    def wait_completion(self, timeout=None, poll_interval=2.0, max_outage=60.0):
        """Waits for the job, then fetches the model and history (and the server forgets
        the job).

        A failed or cancelled job stays on the server (its error can be read again with
        `get_state`) until `destroy` clears it.

        Args:
            timeout: Seconds to wait in all, or None to wait for as long as the job runs.
            poll_interval: Seconds between two looks at the job's state.
            max_outage: Seconds the server may stay unreachable (a restart, a network
                blip) before giving up; polling goes on meanwhile.

        Raises:
            JobError: If the job failed or was cancelled (with the server's error), the
                server stayed unreachable for ``max_outage`` seconds, or ``timeout``
                seconds passed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        unreachable_since = None
        while True:
            try:
                state = self.get_state()
                unreachable_since = None
            except ServerUnreachable as error:
                now = time.monotonic()
                if unreachable_since is None:
                    unreachable_since = now
                    logger.warning("%s; trying again for up to %s s.", error, max_outage)
                elif now - unreachable_since >= max_outage:
                    raise JobError(f"The Punchcard server at {self.url} has been unreachable "
                                   f"for {now - unreachable_since:.0f} s ({error}). The job "
                                   "may still run: call job.wait_completion() again once "
                                   "the server is back.") from error
                state = {"state": "unreachable"}
            if state["state"] == "finished":
                break
            if state["state"] in ("failed", "cancelled"):
                # Most errors end a sentence already: no "..", the job's error as it is.
                details = (state.get("error") or "no details").rstrip(".")
                raise JobError(f"Job {self.job_name!r} {state['state']}: "
                               f"{details}. It keeps this "
                               "secret busy: call job.destroy() to clear it before "
                               "submitting again.")
            if deadline is not None and time.monotonic() > deadline:
                raise JobError(f"Job {self.job_name!r} still {state['state']} after "
                               f"{timeout} s.")
            time.sleep(poll_interval)
        self.destroy()
        return self

    def cancel(self):
        """Stops the job on the server (it stays there, cancelled, until `destroy`)."""
        return self._request("GET", "/api/cancel")

    def destroy(self):
        """Deletes the job on the server, freeing the secret for another job.

        A finished job's model and histories are fetched first and kept here (as by
        `wait_completion`), so a connection cut on the way loses nothing: the job stays on
        the server until its results are here. Returns ``{"state", "error"}`` of the job
        as it was.

        Raises:
            JobError: If the job is still queued or running (cancel it first), or the
                server has no job for this secret.
        """
        if self.model_bytes is None:
            self._fetch_result()
        answer = self._request("GET", "/api/destroy?results=no")
        self.state = answer.get("state")
        return {"state": answer.get("state"), "error": answer.get("error")}

    def _fetch_result(self):
        """Keeps a finished job's model and histories; nothing for a job that did not
        finish (the server answers 409)."""
        try:
            answer = self._request("GET", "/api/result", timeout=300)
        except JobError as error:
            if error.status == 409:
                return
            raise
        if not isinstance(answer.get("model"), str) or not isinstance(answer.get("history"),
                                                                      list):
            raise JobError(f"{self.url} answered /api/result without a model and history: "
                           "is it a Punchcard server's address?")
        self.model_bytes = base64.b64decode(answer["model"])
        self.history = answer["history"]
        self.validation_history = answer.get("validation_history") or []

    def get_trained_model(self):
        """The trained model, compiled as the trainer compiles its result.

        Its optimizer holds the state the server's run left (SingleTrainer's step count
        and moments), as `train()` returns it. A job followed with ``trainer=None`` (by
        `attach`) gets the model compiled as the server saved it.
        """
        if self.model_bytes is None:
            raise JobError("No model yet: call wait_completion() first.")
        from distkeras.utils import deserialize_model

        if self.trainer is None:
            return deserialize_model(self.model_bytes, compile=True)
        model = self._settled_trainer()._compile(deserialize_model(self.model_bytes))
        _restore_optimizer_state(model, self.model_bytes)
        return model

    def get_history(self):
        """The training history (one record per step)."""
        if self.history is None:
            raise JobError("No history yet: call wait_completion() first.")
        return self.history

    def get_validation_history(self):
        """The validation records (with ``train_options={"validation": ...}``)."""
        if self.validation_history is None:
            raise JobError("No history yet: call wait_completion() first.")
        return self.validation_history


def _restore_optimizer_state(model, model_bytes):
    """Gives ``model``'s optimizer the state saved in the server's archive: recompiling
    it from the trainer alone would start the optimizer afresh (step 0, no moments)."""
    from distkeras.utils import deserialize_model
    from distkeras.model_state import get_optimizer_state, set_optimizer_state

    try:
        saved = deserialize_model(model_bytes, compile=True)
        set_optimizer_state(model, get_optimizer_state(saved))
    except (ValueError, TypeError, AttributeError) as error:
        # An archive without a compiled optimizer, or another one: the weights matter most.
        logger.warning("The trained model's optimizer starts afresh: %s", error)


def _timed_out(error):
    """Whether a request failed because its answer did not come within its timeout."""
    cause = error.__cause__
    return isinstance(getattr(cause, "reason", cause), TimeoutError)


def _closed_while_sending(error):
    """Whether a request failed because the server closed the connection under it (as
    waitress does on a body larger than its limit, while the client still sends it)."""
    cause = error.__cause__
    reason = getattr(cause, "reason", cause)
    return isinstance(reason, (ConnectionResetError, BrokenPipeError))


# --------------------------------------------------------------------------------------
# The server


class BadRequest(ValueError):
    """A malformed submission (HTTP 400)."""


class SubmissionInProgress(RuntimeError):
    """Another submission with the same secret is still being checked (HTTP 403)."""


def _check_data_path(path, allowed_roots, name="data_path", any_local_path=True):
    """``path`` if a job may read it, else BadRequest.

    Args:
        path: The path the client gave.
        allowed_roots: The allowed data roots (empty: any path of a cluster file system).
        name: The field, for the message.
        any_local_path: Whether, without roots, a local path (no scheme, or ``file:``)
            is accepted: the server would read any file its user can.
    """
    if not isinstance(path, str) or not path or len(path) > 4096:
        raise BadRequest(f"'{name}' must be a non-empty string.")
    if any(ord(char) < 32 for char in path):
        raise BadRequest(f"'{name}' must not contain control characters.")
    if path.startswith("-"):
        raise BadRequest(f"'{name}' must not start with '-'. Received: {path!r}")
    if ".." in re.split(r"[/\\]", path):
        raise BadRequest(f"'{name}' must not contain '..' segments.")
    if not allowed_roots and not any_local_path and data_roots.local_path(path) is not None:
        raise BadRequest(
            f"'{name}' must be a path of the cluster's file system (hdfs://..., s3a://...): "
            "this server reads no local path, as its administrator named no folder of "
            "training data (punchcard --allowed-data-root).")
    if allowed_roots and _GLOB_CHARACTERS & set(path):
        raise BadRequest(
            f"'{name}' must not contain any of {' '.join(sorted(_GLOB_CHARACTERS))}: this "
            "server only reads under its allowed data roots, and Spark would expand glob "
            "patterns and comma-separated lists into other paths. Give the path of one "
            f"Parquet file or folder. Received: {path!r}")
    if allowed_roots and not any(path == root or path.startswith(root.rstrip("/") + "/")
                                 for root in allowed_roots):
        raise BadRequest(f"'{name}' must be under one of: {', '.join(allowed_roots)}.")
    if allowed_roots:
        try:
            data_roots.check_resolves_under(path, allowed_roots)
        except data_roots.OutsideRoots as error:
            raise BadRequest(f"'{name}': {error}") from error
    return path


def _nesting_depth(value):
    """How deep lists and objects nest in ``value`` (a loop: recursing is what fails)."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            pending.extend((child, depth + 1)
                           for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _check_count(body, name):
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_WORKERS:
        raise BadRequest(f"'{name}' must be an integer in 1..{MAX_WORKERS}. "
                         f"Received: {value!r}")
    return value


def validate_submission(body, allowed_roots=(), check=None, any_local_path=True):
    """Checks a submission; returns ``(fields, trainer class name, config, model bytes)``.

    The fields are checked here; the model and the trainer (`check_keras_parts`: the
    model is loaded with ``safe_mode=True`` and the trainer built from its config) by
    ``check``, so a bad archive or configuration is refused now rather than failing later
    in the job.

    Args:
        body: The parsed JSON submission.
        allowed_roots: The allowed data roots (empty: any path).
        check: A function of ``(model base64, trainer class name, config, workers)``
            returning the config to run, or raising BadRequest: a `model_check.ModelChecker`
            's in a server (a child process), `check_keras_parts` (in this process) if None.
        any_local_path: Without roots, whether local paths are accepted.

    Raises:
        BadRequest: Saying what was wrong.
    """
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    if _nesting_depth(body) > MAX_JSON_DEPTH:
        raise BadRequest("The request body is JSON nested too deeply.")
    name = body.get("job_name")
    if not isinstance(name, str) or not JOB_NAME_PATTERN.fullmatch(name):
        raise BadRequest("'job_name' must be 1-64 letters, digits, '_', '.' or '-', "
                         "starting with a letter or digit.")
    fields = {"name": name, "data_path": _check_data_path(body.get("data_path"), allowed_roots,
                                                          any_local_path=any_local_path),
              "num_executors": _check_count(body, "num_executors"),
              "num_processes": _check_count(body, "num_processes")}
    trainer = body.get("trainer")
    if not isinstance(trainer, dict) or not isinstance(trainer.get("class_name"), str) or \
            not isinstance(trainer.get("config"), dict):
        raise BadRequest("'trainer' must be {\"class_name\": ..., \"config\": {...}}.")
    _trainer_class(trainer["class_name"])
    model_bytes = _model_bytes(body.get("model"))
    _scan_configs(model_bytes, trainer["config"])
    try:
        fields["train_options"] = train_options.normalize(
            body.get("train_options"),
            lambda path: _check_data_path(path, allowed_roots, "train_options.validation",
                                          any_local_path))
    except ValueError as error:
        raise BadRequest(str(error)) from error
    config = dict(trainer["config"])
    if "master_port" in config:
        config["master_port"] = 0  # the server's OS picks the port, never the client
    workers = fields["num_executors"] * fields["num_processes"]
    if workers > MAX_WORKERS:
        raise BadRequest(f"'num_executors' x 'num_processes' is the number of workers, at "
                         f"most {MAX_WORKERS}. Received: {fields['num_executors']} x "
                         f"{fields['num_processes']} = {workers}")
    factor = config.get("parallelism_factor", 1)
    if isinstance(factor, int) and not isinstance(factor, bool) and \
            factor > MAX_PARALLELISM_FACTOR:
        raise BadRequest(f"'parallelism_factor' must be at most {MAX_PARALLELISM_FACTOR} (it "
                         f"multiplies the {workers} workers' partitions). Received: {factor}")
    config = (check or check_keras_parts)(body["model"], trainer["class_name"], config,
                                          workers)
    return fields, trainer["class_name"], config, model_bytes


def check_keras_parts(model_text, trainer_class_name, config, workers):
    """Checks what Keras builds of a submission: the model archive and the trainer.

    The configurations are scanned as JSON first (`config_scan`: no code references, no
    oversized metric state), the declared weights counted, then the model loaded
    (``safe_mode=True``) and the trainer built. Run in a `model_check` child process
    by the server: building allocates what the client's configuration declares.

    Args:
        model_text: The base64 `.keras` archive.
        trainer_class_name: The registered trainer class's name.
        config: The trainer's JSON config.
        workers: The job's number of workers.

    Returns:
        The trainer config to run (``num_workers`` set to ``workers``).

    Raises:
        BadRequest: Saying what was wrong.
    """
    import keras

    from distkeras.utils import check_compile_arguments, deserialize_model

    model_bytes = _model_bytes(model_text)
    _scan_configs(model_bytes, config, frozenset(keras.saving.get_custom_objects()))
    trainer_class = _trainer_class(trainer_class_name)
    _check_declared_weights(model_bytes)
    try:
        # Compiled, as the job's process loads it (`cli`): a model compiled with
        # loss=None trains on its own loss, which the trainer's checks read from it.
        model = deserialize_model(model_bytes, compile=True)
    except Exception as error:  # any failure to load is the client's archive's fault
        raise BadRequest(f"The model archive was refused: {_archive_error(error)}") \
            from error
    config = dict(config)
    _check_compile_configs(config)
    try:
        built = trainer_class.from_config(config, keras_model=model)
        for attribute in ("num_workers", "num_ensembles"):
            if attribute in built.get_config():
                config[attribute] = workers
        built = trainer_class.from_config(config, keras_model=model)
        built.validate_arguments()
        check_compile_arguments(built.worker_optimizer, built.loss, built.metrics)
    except (TypeError, ValueError) as error:
        raise BadRequest(f"Bad trainer configuration: {error}") from error
    return config


def _trainer_class(name):
    """The registered trainer class ``name``, refused if unknown or an ensemble."""
    from distkeras.registry import get_trainer_class
    from distkeras.trainers import EnsembleTrainer

    try:
        trainer_class = get_trainer_class(name)
    except ValueError as error:
        raise BadRequest(str(error)) from error
    if issubclass(trainer_class, EnsembleTrainer):
        raise BadRequest(f"{name} trains several models, and a Punchcard job "
                         "returns one: train an ensemble from Python with your own Spark "
                         "session, or submit another trainer.")
    return trainer_class


def _scan_configs(model_bytes, trainer_config, registered=None):
    """Refuses code references and oversized state in the archive's config.json and the
    trainer's config (`config_scan`), before Keras reads either."""
    from distkeras import config_scan

    try:
        config_scan.scan(config_scan.read_config(model_bytes), registered)
    except config_scan.ConfigRefused as error:
        raise BadRequest(f"The model archive was refused: {error}") from error
    for field, value in trainer_config.items():
        try:
            config_scan.scan(value, registered, f"'{field}'")
        except config_scan.ConfigRefused as error:
            raise BadRequest(f"Bad trainer configuration: {error}") from error


def _model_bytes(text):
    """The model archive of a submission's ``model`` field."""
    if not text:
        raise BadRequest("'model' is required: a base64 .keras archive.")
    try:
        data = base64.b64decode(text, validate=True)
    except (ValueError, TypeError) as error:
        raise BadRequest("'model' must be a base64 .keras archive: it is not valid "
                         "base64.") from error
    if not zipfile.is_zipfile(io.BytesIO(data)):
        raise BadRequest("'model' must be a base64 .keras archive: it decodes to "
                         f"{len(data)} bytes that are not a zip file.")
    _check_unpacked_size(data)
    return data


# Keras stores an archive's files uncompressed: what they unpack to is about what travelled.
# More than this many times the archive (past a floor) is a decompression bomb, which Keras
# would read into this server's memory as it loads the model (its own guard starts at 4 GiB).
MAX_ARCHIVE_EXPANSION = 10
ARCHIVE_EXPANSION_FLOOR = 64 << 20


def _unpack_limit(data):
    """The most bytes this server unpacks, or builds weights of, for the archive ``data``."""
    return max(ARCHIVE_EXPANSION_FLOOR, MAX_ARCHIVE_EXPANSION * len(data))


def _check_unpacked_size(data):
    """Refuses an archive whose files declare far more bytes than it holds."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            unpacked = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, ValueError) as error:
        raise BadRequest(f"'model' must be a base64 .keras archive: {error}") from error
    limit = _unpack_limit(data)
    if unpacked > limit:
        raise BadRequest(
            f"The model archive was refused: its {len(data)} bytes declare {unpacked} bytes "
            f"of files, more than this server unpacks ({limit}). Send the archive as "
            "keras.saving.save_model writes it.")


def _check_declared_weights(data):
    """Refuses an archive whose configuration declares far more weights than it holds.

    Building the model to load it allocates every weight its configuration declares,
    whatever the archive carries: a few kilobytes declaring Dense(200000) after
    Dense(200000) would take 160 GB of this server's memory. The weights are counted
    without allocating them (`utils.declared_weight_bytes`) and may take no more than the
    archive's files may unpack to: an archive that ``keras.saving.save_model`` wrote
    holds every weight, uncompressed.
    """
    from distkeras.utils import declared_weight_bytes

    try:
        values, nbytes = declared_weight_bytes(data)
    except Exception as error:  # any failure to build is the client's archive's fault
        raise BadRequest(f"The model archive was refused: {_archive_error(error)}") \
            from error
    limit = _unpack_limit(data)
    if nbytes > limit:
        raise BadRequest(
            f"The model archive was refused: its configuration declares {values} weight "
            f"values ({nbytes} bytes), more than this server builds for an archive of "
            f"{len(data)} bytes ({limit} bytes of weights at most: {MAX_ARCHIVE_EXPANSION} "
            f"times the archive, or {ARCHIVE_EXPANSION_FLOOR >> 20} MiB). An archive that "
            "keras.saving.save_model writes holds all its weights; send the model "
            "itself, saved that way.")


# Keras's words for a class or function it cannot find: "Could not locate class 'X'".
_UNKNOWN_OBJECT = re.compile(r"Could not locate (\w+) '([^']+)'")


def _archive_error(error):
    """Why an archive did not load, in a few lines: Keras's errors for an unknown class
    hold the whole model's configuration, twice, around the one name that matters."""
    unknown = _UNKNOWN_OBJECT.search(str(error))
    if unknown:
        kind, name = unknown.groups()
        return (f"it uses the {kind} {name!r}, which this server does not know. A custom "
                "layer, activation, loss or metric must be registered "
                "(@keras.saving.register_keras_serializable()) in a package installed on "
                "the server: code sent by a client is never run. Ask the server's "
                "administrator to install yours, or use built-in Keras objects.")
    if "safe_mode=False" in str(error):
        # Keras advises loading unsafely, which a client cannot ask of this server.
        return ("it holds Python code (a `Lambda` layer's function or another lambda), which "
                "this server never runs: archives load with safe_mode=True. Replace the "
                "lambda with built-in layers, or with a custom layer registered "
                "(@keras.saving.register_keras_serializable()) in a package installed on "
                "the server.")
    return _short(_without_temp_paths(error), 1000)


def _without_temp_paths(error):
    """An error's message without the server's temporary paths (which say nothing useful
    to a client, and something about the server)."""
    return re.sub(re.escape(tempfile.gettempdir()) + r"/[^\s'\",;)]*", "<the archive>",
                  str(error))


def _check_compile_configs(config):
    """Refuses the trainer's optimizer, loss or metrics when Keras cannot rebuild them.

    Names were checked with the trainer; this resolves the configuration objects the same
    way the job will (`keras.optimizers.get` and friends, in safe mode, with the classes
    registered on this server). Keras imports nothing outside its own packages for this.
    """
    import copy

    import keras

    optimizer = config.get("worker_optimizer")
    checks = (("worker_optimizer", keras.optimizers.get,
               [] if optimizer is None or isinstance(optimizer, str) else [optimizer]),
              ("loss", keras.losses.get, _config_leaves(config.get("loss"))),
              ("metrics", keras.metrics.get, _config_leaves(config.get("metrics"))))
    for field, getter, values in checks:
        for value in values:
            try:
                resolved = getter(copy.deepcopy(value))  # getters edit their argument
            except Exception as error:  # whatever Keras raises, the config is unusable
                raise BadRequest(f"Bad trainer configuration: Keras cannot rebuild "
                                 f"'{field}' from {_short(value)} ({_short(error)}). Give a "
                                 "name, or the config of a built-in or server-registered "
                                 "Keras object.") from error
            if resolved is None:
                raise BadRequest(f"Bad trainer configuration: '{field}' holds "
                                 f"{_short(value)}, which names no Keras object.")


def _short(value, limit=200):
    text = str(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _config_leaves(value):
    """The objects of an optimizer, loss or metrics setting that are not names."""
    if value is None or isinstance(value, str):
        return []
    if isinstance(value, list):
        return [leaf for item in value for leaf in _config_leaves(item)]
    if isinstance(value, dict) and "class_name" not in value:  # one entry per output
        return [leaf for item in value.values() for leaf in _config_leaves(item)]
    return [value]


def _process_alive(pid, job_id):
    """Whether ``pid`` is still the job's process (not a reused pid)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return job_id.encode() in handle.read()
    except OSError:
        return False


def _find_job_process(job_id):
    """The pid of a running process whose command line is job ``job_id``'s (`command`),
    or None: after a restart, for a job whose server stopped between starting its
    process and recording its pid."""
    marker = b"\0--job-id\0" + job_id.encode() + b"\0"
    try:
        names = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:  # no /proc (not Linux): such a process cannot be found
        return None
    for name in names:
        try:
            with open(f"/proc/{name}/cmdline", "rb") as handle:
                command_line = handle.read()
        except OSError:  # it ended meanwhile, or is not ours to read
            continue
        if marker in command_line + b"\0":
            return int(name)
    return None


_ERROR_LINE = re.compile(r"\bERROR\b|^Traceback |^[\w.]*(Error|Exception)\b")


def _reaped_exit_code(process, timeout=5.0):
    """The exit code of a child process that has just ended, or None if it has not."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def _exit_description(exit_code):
    if exit_code is None:
        return ""  # not this server's child (started before a restart): unknown
    if exit_code < 0:
        try:
            return f" (killed by {signal.Signals(-exit_code).name})"
        except ValueError:
            return f" (killed by signal {-exit_code})"
    return f" (exit code {exit_code})"


def _kill_tree(pid, process=None):
    """Stops the job's whole process group (Spark's JVM and Python workers included).

    Args:
        pid: The group leader's pid (the job's process).
        process: Its `subprocess.Popen`, when this server started it.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        for _ in range(50):
            # A dead leader that nobody reaped is a zombie, and a zombie keeps its group
            # alive for killpg: reap it (if it is ours) so the wait ends when all are gone.
            if process is not None:
                process.poll()
            else:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass  # not our child: its own parent (or init) reaps it
            try:
                os.killpg(pid, 0)
            except (ProcessLookupError, PermissionError):
                return
            time.sleep(0.1)


class Punchcard:
    """The job server's state and logic, independent of HTTP.

    Args:
        secrets_path: The secrets file.
        work_dir: Where job folders and the SQLite database live.
        master: The Spark master jobs run on (``local[*]``, ``yarn``, ``spark://...``).
        max_running: Jobs running at once; the others wait, queued.
        allowed_data_roots: If given, ``data_path`` must be under one of these.
        model_checker: The `model_check.ModelChecker` that checks submitted models in
            child processes (a default one if None).
        allow_any_data_path: Without ``allowed_data_roots``, accept local paths (any file
            this server's user can read) rather than refuse them.
        max_job_seconds: A running job is stopped (failed) after this long; None: never.
        max_epochs: Submissions of more epochs (``num_epoch``) are refused; None: any.
        audit_log: The audit log's path (`audit_log.AuditLog`): ``"default"`` for
            ``audit.jsonl`` in ``work_dir``, None for none.

    Notes:
        Queued jobs start fairly: the next one is of the identity with the fewest jobs
        running (then the oldest), so one identity's many secrets cannot take every slot
        while another waits.
    """

    def __init__(self, secrets_path, work_dir, master="local[*]", max_running=1,
                 allowed_data_roots=(), model_checker=None, allow_any_data_path=False,
                 max_job_seconds=None, max_epochs=None, audit_log="default"):
        from distkeras.job_store import JobStore
        from distkeras.audit_log import AuditLog
        from distkeras.secrets_file import SecretsFile

        self.checker = SecretsFile(secrets_path)
        self.work_dir = os.path.abspath(work_dir)
        # Owner only: it holds the job table (secret hashes) and every job's model, data
        # path and log, which no other user of this machine should read.
        os.makedirs(self.work_dir, mode=0o700, exist_ok=True)
        if os.stat(self.work_dir).st_mode & 0o077:
            logger.warning("The work folder %s may be read by other users of this machine "
                           "(mode %o): its job table and models are private; chmod 700 it.",
                           self.work_dir, os.stat(self.work_dir).st_mode & 0o777)
        self.store = JobStore(os.path.join(self.work_dir, "jobs.sqlite"))
        self.audit = AuditLog(os.path.join(self.work_dir, "audit.jsonl")
                              if audit_log == "default" else audit_log)
        self.master = master
        self.max_running = max_running
        self.allowed_data_roots = tuple(allowed_data_roots)
        self.model_checker = model_checker or ModelChecker()
        self.allow_any_data_path = allow_any_data_path
        self.max_job_seconds = max_job_seconds
        self.max_epochs = max_epochs
        self._processes = {}
        self._starting = set()  # running in the table, but no process yet
        self._destroying = set()  # jobs a destroy request is reading and deleting
        self._validating = set()  # secrets whose submission is being checked
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.reconcile()
        self._scheduler = threading.Thread(target=self._schedule_loop, daemon=True,
                                           name="punchcard-scheduler")
        self._scheduler.start()

    def close(self):
        self._stop.set()
        self._scheduler.join(timeout=5)
        self.model_checker.close()

    def _check_epochs(self, body):
        """Refuses more epochs than the operator allows (before the model is checked)."""
        trainer = body.get("trainer") if isinstance(body, dict) else None
        config = trainer.get("config") if isinstance(trainer, dict) else None
        epochs = config.get("num_epoch", 1) if isinstance(config, dict) else 1
        if self.max_epochs is not None and isinstance(epochs, (int, float)) and \
                not epochs <= self.max_epochs:  # NaN too
            raise BadRequest(f"'num_epoch' must be at most {self.max_epochs} on this server "
                             f"(punchcard --max-epochs). Received: {epochs!r}")

    def _check_in_child(self, model_text, trainer_class_name, config, workers):
        """`check_keras_parts` in a `model_check` child process (never in this one)."""
        from distkeras.model_check import CheckFailed

        try:
            answer = self.model_checker.check({
                "model": model_text, "trainer_class": trainer_class_name, "config": config,
                "workers": workers})
        except CheckFailed as error:
            logger.warning("A submission's check failed: %s", error)
            raise BadRequest(f"The model archive was refused: {error}") from error
        if not answer["ok"]:
            raise BadRequest(str(answer.get("error")))
        if not isinstance(answer.get("config"), dict):
            raise BadRequest("The model check answered no trainer configuration.")
        return answer["config"]

    # -- requests ---------------------------------------------------------------------

    def identify(self, secret):
        return self.checker.identify(secret)

    def submit(self, secret_hash, identity, body):
        """Queues a job; returns its public state, or None when the secret is busy.

        Raises:
            BadRequest: The submission is malformed.
            SubmissionInProgress: Another submission with this secret is being checked.
        """
        # Checking a submission builds its model, which can take a request thread for
        # minutes (a Sequential of hundreds of layers): a secret that already has a job is
        # refused before that, and one secret's submissions are checked one at a time, so
        # no client can hold more than one of the server's threads this way.
        if self.store.by_secret(secret_hash) is not None:
            return None
        with self._lock:
            if secret_hash in self._validating:
                raise SubmissionInProgress(
                    "Another submission with this secret is still being checked: wait for "
                    "its answer (a secret has one job at a time).")
            self._validating.add(secret_hash)
        try:
            return self._queue(secret_hash, identity, body)
        finally:
            with self._lock:
                self._validating.discard(secret_hash)

    def _queue(self, secret_hash, identity, body):
        """Validates a submission and stores it as a queued job (`submit`)."""
        self._check_epochs(body)
        fields, trainer_class, config, model_bytes = validate_submission(
            body, self.allowed_data_roots, self._check_in_child, self.allow_any_data_path)
        job_id = uuid.uuid4().hex
        job_dir = os.path.join(self.work_dir, "jobs", job_id)  # never derived from input
        os.makedirs(os.path.dirname(job_dir), mode=0o700, exist_ok=True)
        os.makedirs(job_dir, mode=0o700)
        with open(os.path.join(job_dir, "model.keras"), "wb") as handle:
            handle.write(model_bytes)
        with open(os.path.join(job_dir, "trainer.json"), "w", encoding="utf-8") as handle:
            json.dump(config, handle)
        with open(os.path.join(job_dir, "train_options.json"), "w", encoding="utf-8") as handle:
            json.dump(fields.pop("train_options"), handle)
        job = {"id": job_id, "secret_hash": secret_hash, "identity": identity,
               "trainer_class": trainer_class, "job_dir": job_dir, "state": "queued",
               "created": time.time(), **fields}
        if not self.store.insert_if_free(job):
            shutil.rmtree(job_dir, ignore_errors=True)
            return None
        logger.info("Job %s (%s) queued for %s", job_id, fields["name"], identity)
        return self.public_state(self.store.by_secret(secret_hash))

    def job_of(self, secret_hash):
        job = self.store.by_secret(secret_hash)
        if job is not None:
            job = self._refresh(job)
        return job

    def cancel(self, job):
        """Stops a queued or running job; its state becomes cancelled."""
        if not self.store.finish(job["id"], "cancelled", "cancelled by the client"):
            return False
        self._stop_process(job["id"], job["pid"])
        return True

    def _current_row(self, job):
        """``job``'s row as the store has it now, or None if it was deleted (the secret
        may hold its next job's row since)."""
        current = self.store.by_secret(job["secret_hash"])
        return current if current is not None and current["id"] == job["id"] else None

    def _stop_process(self, job_id, pid=None):
        with self._lock:
            process = self._processes.pop(job_id, None)
        pid = process.pid if process is not None else pid
        if pid:
            _kill_tree(pid, process)
        if process is not None:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                logger.warning("Job %s: process %s did not exit after SIGKILL", job_id, pid)

    def destroy(self, job):
        """Deletes the job (its row and files).

        Returns:
            Whether this call deleted it: False when another request destroyed the job
            first (two clients, or a retried request).
        """
        with self._lock:
            if job["id"] in self._destroying:
                return False
            self._destroying.add(job["id"])
        try:
            # The row read before the claim may be of a job another request has deleted,
            # and the secret may have its next job since: that one is not this request's.
            if self._current_row(job) is None:
                return False
            self.forget(job)
            return True
        finally:
            with self._lock:
                self._destroying.discard(job["id"])

    def results(self, job):
        """A finished job's results (`_results`), or None if it was destroyed meanwhile."""
        try:
            return self._results(job)
        except OSError:
            if self._current_row(job) is None:
                return None  # its files deleted under this read
            raise

    @staticmethod
    def _results(job):
        """A finished job's trained model (base64), history and validation history."""
        model_path = os.path.join(job["job_dir"], "trained.keras")
        with open(model_path, "rb") as handle:
            model = base64.b64encode(handle.read()).decode()
        history_path = os.path.join(job["job_dir"], "history.json")
        with open(history_path, encoding="utf-8") as handle:
            history = json.load(handle)
        validation_path = os.path.join(job["job_dir"], "validation.json")
        validation = []
        if os.path.exists(validation_path):  # jobs queued before train options existed
            with open(validation_path, encoding="utf-8") as handle:
                validation = json.load(handle)
        return {"model": model, "history": history, "validation_history": validation}

    def forget(self, job):
        self.store.delete(job["id"])
        shutil.rmtree(job["job_dir"], ignore_errors=True)

    # -- state ------------------------------------------------------------------------

    @staticmethod
    def _read_status(job):
        try:
            with open(os.path.join(job["job_dir"], "status.json"), encoding="utf-8") as handle:
                return json.load(handle)
        except (OSError, ValueError):
            return None

    def _refresh(self, job):
        """Brings a running job's row up to date with its process and status file."""
        if job["state"] != "running":
            return job
        with self._lock:
            process = self._processes.get(job["id"])
            if process is None and job["id"] in self._starting:
                return job  # being started by the scheduler: not a lost process
        exit_code = process.poll() if process is not None else None
        # The process's own pid: the table's is written just after it started.
        pid = process.pid if process is not None else job["pid"]
        alive = exit_code is None and _process_alive(pid, job["id"])
        if not alive and process is not None and exit_code is None:
            # It exited between poll() and the look at /proc (a zombie's cmdline is
            # empty): reap it now for its exit code, which the error names.
            exit_code = _reaped_exit_code(process)
        # Read once the process is known to be gone: a status written just before it
        # exited counts (read earlier, a finished job could look as if it left no result).
        status = self._read_status(job) or {}
        if status.get("state") == "finished" and not alive:
            self.store.finish(job["id"], "finished", only_if_state="running")
        elif status.get("state") == "failed" and not alive:
            self.store.finish(job["id"], "failed", status.get("error"), only_if_state="running")
        elif not alive:
            log_tail = self._log_tail(job)
            self.store.finish(job["id"], "failed",
                              "the job's process ended" + _exit_description(exit_code)
                              + " without a result" + (f": {log_tail}" if log_tail else ""),
                              only_if_state="running")
        if not alive:
            with self._lock:
                self._processes.pop(job["id"], None)
        return self.store.by_secret(job["secret_hash"]) or job

    @staticmethod
    def _log_tail(job, count=3):
        """The last ``count`` error lines of the job's log (log ERRORs, tracebacks and
        their exception lines), or "" when there are none: other lines say nothing about
        why a job died."""
        try:
            with open(os.path.join(job["job_dir"], "job.log"), "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 8000))
                lines = handle.read().decode("utf-8", "replace").strip().splitlines()
        except OSError:
            return ""
        errors = [line.strip() for line in lines if _ERROR_LINE.search(line)]
        return " | ".join(errors[-count:])[-500:]

    def client_error(self, job):
        """The job's error as its client sees it (`data_roots.redact`)."""
        options = self._train_options(job)
        own = [job["data_path"]] + ([options["validation"]]
                                    if isinstance(options.get("validation"), str) else [])
        return data_roots.redact(job["error"], self.allowed_data_roots, own)

    @staticmethod
    def _train_options(job):
        try:
            with open(os.path.join(job["job_dir"], "train_options.json"),
                      encoding="utf-8") as handle:
                options = json.load(handle)
        except (OSError, ValueError):
            return {}
        return options if isinstance(options, dict) else {}

    def public_state(self, job):
        """What a client sees of its job."""
        status = self._read_status(job) or {}
        now = time.time()
        return {
            "job_name": job["name"],
            "state": job["state"],
            "running": job["state"] in ("queued", "running"),
            "error": self.client_error(job),
            "progress": {"phase": status.get("state", job["state"]),
                         "seconds_running": round(now - job["started"], 1)
                         if job["started"] and job["state"] == "running" else None},
            "trainer": job["trainer_class"],
            "created": job["created"],
        }

    def reconcile(self):
        """After a restart: running jobs whose process is gone are finished or failed, and
        cancelled jobs whose process still runs are stopped."""
        for job in self.store.by_state("running", "cancelled"):
            if not job["pid"] and job["started"]:
                # Stopped between starting the process and recording its pid: find it
                # by its command line, to follow it (or stop it), not leave it orphaned.
                pid = _find_job_process(job["id"])
                if pid is not None:
                    logger.warning("Job %s: found its process %s, whose pid was not recorded",
                                   job["id"], pid)
                    self.store.update(job["id"], pid=pid)
        for job in self.store.by_state("running"):
            self._refresh(job)
        for job in self.store.by_state("cancelled"):
            # `cancel` marks the job, then stops its process: a server stopped in between
            # left it training, for a job nobody follows (and that no limit counts).
            if _process_alive(job["pid"], job["id"]):
                logger.warning("Job %s was cancelled, but its process %s still runs: "
                               "stopping it", job["id"], job["pid"])
                _kill_tree(job["pid"])

    def _schedule_loop(self):
        while not self._stop.is_set():
            try:
                for job in self.store.by_state("running"):
                    self._stop_if_overdue(job)
                    self._refresh(job)
                for job in self._next_jobs():
                    self._start(job)
            except Exception:  # the scheduler must survive anything one job does
                logger.exception("Punchcard scheduler error")
            self._stop.wait(0.5)

    def _next_jobs(self):
        """The queued jobs to start now: one at a time to the identity with the fewest
        jobs running (then the oldest job), for as many slots as are free."""
        running = self.store.by_state("running")
        counts = {}
        for job in running:
            counts[job["identity"]] = counts.get(job["identity"], 0) + 1
        queued, chosen = self.store.by_state("queued"), []
        for _ in range(max(0, self.max_running - len(running))):
            if not queued:
                break
            job = min(queued, key=lambda job: (counts.get(job["identity"], 0), job["created"]))
            queued.remove(job)
            chosen.append(job)
            counts[job["identity"]] = counts.get(job["identity"], 0) + 1
        return chosen

    def _stop_if_overdue(self, job):
        """Fails and stops a job that has run longer than ``max_job_seconds``."""
        if self.max_job_seconds is None or not job["started"] or \
                time.time() - job["started"] <= self.max_job_seconds:
            return
        if self.store.finish(job["id"], "failed",
                             f"the job ran longer than this server allows "
                             f"({self.max_job_seconds:g} s, punchcard --max-job-minutes), and "
                             "was stopped", only_if_state="running"):
            logger.warning("Job %s ran past %s s: stopped", job["id"], self.max_job_seconds)
            self._stop_process(job["id"], job["pid"])

    def command(self, job):
        """The job's command line: the same entry point as a user's own run."""
        return [sys.executable, "-m", "distkeras.cli", "train",
                "--data", job["data_path"],
                "--model", os.path.join(job["job_dir"], "model.keras"),
                "--trainer", job["trainer_class"],
                "--trainer-config", os.path.join(job["job_dir"], "trainer.json"),
                "--output", os.path.join(job["job_dir"], "trained.keras"),
                "--history", os.path.join(job["job_dir"], "history.json"),
                "--validation-history", os.path.join(job["job_dir"], "validation.json"),
                "--status", os.path.join(job["job_dir"], "status.json"),
                "--master", self.master,
                "--job-id", job["id"]] + self._executor_arguments(job) + \
            self._options_arguments(job)

    def _executor_arguments(self, job):
        """The job's executors, as it asked: ``num_executors`` of ``num_processes`` task
        slots each, one worker a slot. A local master has one process whose threads
        are its slots (``local[N]``): the server's administrator sizes it."""
        if self.master.startswith("local"):
            return []
        return ["--conf", f"spark.executor.instances={job['num_executors']}",
                "--conf", f"spark.executor.cores={job['num_processes']}"]

    @staticmethod
    def _options_arguments(job):
        path = os.path.join(job["job_dir"], "train_options.json")
        # A job queued by a server from before train options has no such file.
        return ["--train-options", path] if os.path.exists(path) else []

    def _start(self, job):
        with self._lock:
            self._starting.add(job["id"])
        try:
            process = self._launch(job)
        finally:
            with self._lock:
                self._starting.discard(job["id"])
        if process is None:
            return
        self.store.update(job["id"], pid=process.pid)
        current = self._current_row(job)
        # Cancelled while it was being started (that cancel found no process to stop), and
        # perhaps destroyed since. Either way the process is this server's to stop, or it
        # runs on, owned by nobody.
        if current is None or current["state"] != "running":
            self._stop_process(job["id"])
            return
        logger.info("Job %s started, pid %s", job["id"], process.pid)

    def _launch(self, job):
        """Marks a queued job running and starts its process; None if it did not start."""
        if not self.store.update(job["id"], only_if_state="queued", state="running",
                                 started=time.time()):
            return None  # cancelled in the meantime
        log = open(os.path.join(job["job_dir"], "job.log"), "wb")
        env = dict(os.environ)
        env.pop("PYSPARK_GATEWAY_PORT", None)
        try:
            process = subprocess.Popen(self.command(job), cwd=job["job_dir"], stdout=log,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True, env=env)
        except OSError as error:
            self.store.finish(job["id"], "failed", f"could not start the job: {error}")
            return None
        finally:
            log.close()
        with self._lock:
            self._processes[job["id"]] = process
        return process


def create_app(punchcard, max_request_bytes=256 << 20):
    """The Flask application serving ``punchcard``."""
    from flask import Flask, g, jsonify, request

    app = Flask("punchcard")
    app.config["MAX_CONTENT_LENGTH"] = max_request_bytes

    def error(status, message):
        response = jsonify({"error": message})
        response.status_code = status
        return response

    def caller():
        return punchcard.identify(request.headers.get(SECRET_HEADER, ""))

    @app.after_request
    def audit(response):
        # Every request but a successful look at a job's state (clients poll it).
        if request.path == "/api/state" and response.status_code < 400:
            return response
        who = caller()
        answer = response.get_json(silent=True) if response.status_code >= 400 else None
        punchcard.audit.record(
            who[1] if who else None, request.path.rsplit("/", 1)[-1] or request.path,
            "refused" if response.status_code >= 400 else "accepted",
            response.status_code, g.get("job_id"),
            answer.get("error") if isinstance(answer, dict) else None)
        return response

    @app.errorhandler(413)
    def too_large(_error):
        return error(413, f"The request is larger than {max_request_bytes} bytes.")

    @app.errorhandler(404)
    def not_found(_error):
        return error(404, f"No such endpoint: {request.path}. The endpoints are POST "
                          "/api/submit and GET /api/state, /api/result, /api/cancel, /api/destroy.")

    @app.errorhandler(500)
    def internal_error(_error):
        return error(500, "The server failed on this request; its log says why.")

    @app.errorhandler(405)
    def wrong_method(_error):
        return error(405, f"{request.method} is not allowed on {request.path}: submit with "
                          "POST, everything else with GET.")

    def busy(secret_hash):
        job = punchcard.job_of(secret_hash)
        known = f" ({job['name']!r}, {job['state']})" if job is not None else ""
        return error(403, f"This secret already has a job{known}: wait for it with "
                          "job.wait_completion(), or clear it with job.destroy() (after "
                          "job.cancel() if it still runs), before submitting another.")

    @app.post("/api/submit")
    def submit():
        from distkeras.config_scan import ConfigRefused, loads_bounded

        who = caller()
        if who is None:
            return error(403, "Unknown secret.")
        # Before the body is parsed: a busy secret's body costs nothing to refuse.
        if punchcard.store.by_secret(who[0]) is not None:
            return busy(who[0])
        if not request.is_json:
            # Flask reads no body of another type: it may be JSON, sent as a form.
            return error(400, "The request body must be JSON, sent with the header "
                              "Content-Type: application/json.")
        try:
            body = loads_bounded(request.get_data(cache=False))
        except ConfigRefused as refused:
            return error(400, str(refused))
        try:
            state = punchcard.submit(who[0], who[1], body)
        except BadRequest as bad:
            return error(400, str(bad))
        except SubmissionInProgress as in_progress:
            return error(403, str(in_progress))
        if state is None:
            return busy(who[0])
        job = punchcard.job_of(who[0])
        g.job_id = job["id"] if job is not None else None
        return jsonify(state)

    def own_job():
        who = caller()
        if who is None:
            return None, error(403, "Unknown secret.")
        job = punchcard.job_of(who[0])
        if job is None:
            return None, error(404, "This secret has no job.")
        g.job_id = job["id"]
        return job, None

    @app.get("/api/state")
    def state():
        job, failure = own_job()
        return failure or jsonify(punchcard.public_state(job))

    @app.get("/api/cancel")
    def cancel():
        job, failure = own_job()
        if failure:
            return failure
        cancelled = punchcard.cancel(job)
        # Read again: another request may have cancelled, finished or destroyed the job
        # since ``job`` was read (its state there is the one cancel() found changed).
        current = punchcard.job_of(job["secret_hash"])
        if current is None:
            return error(404, "This secret has no job: another request destroyed it.")
        if not cancelled:
            return error(409, f"The job is {current['state']}; only a queued or running "
                              "job can be cancelled.")
        return jsonify(punchcard.public_state(current))

    @app.get("/api/result")
    def result():
        job, failure = own_job()
        if failure:
            return failure
        if job["state"] != "finished":
            return error(409, f"The job is {job['state']}: only a finished job has a "
                              "trained model.")
        results = punchcard.results(job)
        if results is None:
            return error(404, "This secret has no job: another request destroyed it.")
        return jsonify({**results, "state": "finished"})

    @app.get("/api/destroy")
    def destroy():
        # A finished job's model and histories come with the answer, unless the client
        # says it has them (``?results=no``): distkeras's client fetches them from
        # /api/result first, as they are deleted here before this answer is sent, and a
        # cut connection would lose them.
        job, failure = own_job()
        if failure:
            return failure
        if job["state"] in ("queued", "running"):
            return error(409, "The job is still running: wait for it or cancel it first.")
        results = {"model": None, "history": None, "validation_history": None}
        if job["state"] == "finished" and request.args.get("results") != "no":
            results = punchcard.results(job)
        if results is None or not punchcard.destroy(job):
            return error(404, "This secret has no job: another request destroyed it.")
        return jsonify({**results, "state": job["state"], "error": punchcard.client_error(job)})

    return app


def make_server(punchcard, host, port, threads=16, max_request_bytes=256 << 20,
                **limits):
    """The HTTP server of `create_app(punchcard)` (call its ``run()``).

    Args:
        punchcard: The `Punchcard`.
        host: Where to listen.
        port: The port to listen on.
        threads: Worker threads serving requests.
        max_request_bytes: The largest submission.
        **limits: `http_front.make_front`'s ``connection_limit``, ``header_timeout``,
            ``min_upload_rate``, ``channel_timeout``.
    """
    from distkeras.http_front import make_front

    # The secret and the body's size are checked from the headers, before the body is
    # read: Flask's own limit only applies once the whole body has been buffered.
    def audit(who, path, status, message):
        punchcard.audit.record(who[1] if who else None, path.rsplit("/", 1)[-1] or path,
                               "refused", status, None, message)

    return make_front(create_app(punchcard, max_request_bytes), punchcard.identify, host,
                      port, threads=threads, max_request_bytes=max_request_bytes,
                      secret_header=SECRET_HEADER, audit=audit, **limits)


def _exposure_warnings(host, allowed_data_roots, allow_any_data_path=True):
    """What a server started with these settings exposes that its administrator may not
    mean to: said once, at start-up."""
    warnings = []
    if not allowed_data_roots and not allow_any_data_path:
        warnings.append(
            "No --allowed-data-root: jobs may read paths of cluster file systems "
            "(hdfs://, s3a://) only, and local paths are refused. Give the folders that "
            "hold training data.")
    elif not allowed_data_roots:
        warnings.append(
            "No --allowed-data-root: a job may train on any path this server's user can "
            "read (its model then carries what it learned from that data back to the "
            "client). Give the folders that hold training data.")
    if host not in ("127.0.0.1", "localhost", "::1"):
        warnings.append(
            f"Listening on {host} over plain HTTP: secrets, models and histories cross the "
            "network unencrypted. Serve it behind a TLS-terminating proxy, or listen on "
            "127.0.0.1.")
    return warnings


# The model check's and the HTTP front's limits: (flag, type, default, help).
_LIMIT_FLAGS = (
    ("--check-memory-mb", int, 4096,
     "address space of the child process that checks a submitted model (RLIMIT_AS)"),
    ("--check-seconds", int, 300,
     "CPU time (RLIMIT_CPU) and wall-clock time of a model's check"),
    ("--max-concurrent-checks", int, 2, "model checks running at once (each a child process)"),
    ("--connection-limit", int, 1000,
     "connections held at once; past it, the oldest connection still sending its headers "
     "is closed for a new one"),
    ("--header-timeout", float, 10.0,
     "seconds a request's headers may take to arrive (a trickling client is dropped after "
     "it)"),
    ("--min-upload-kbps", int, 64, "slowest accepted upload of a submission, in KiB/s"),
    ("--idle-timeout", int, 30, "seconds an idle kept-alive connection is held"),
)


def serve(argv=None, prog="punchcard"):
    """``punchcard``: runs the job server (waitress, a production WSGI server)."""
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Punchcard: accept distkeras training jobs over HTTP.")
    parser.add_argument("--secrets", default="secrets.json", help="the secrets file")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--host", default="0.0.0.0", help="address to listen on")
    parser.add_argument("--work-dir", default="punchcard-jobs",
                        help="folder for job files and the SQLite job table")
    parser.add_argument("--master", default="local[*]",
                        help="Spark master for jobs: local[*], yarn (client mode), "
                             "spark://..., k8s://...")
    parser.add_argument("--max-running", type=int, default=1, help="jobs running at once")
    parser.add_argument("--max-job-minutes", type=float, default=24 * 60,
                        help="a running job is stopped (failed) after this long; 0: never")
    parser.add_argument("--max-epochs", type=int, default=1000,
                        help="submissions of more epochs (num_epoch) are refused")
    parser.add_argument("--max-request-mb", type=int, default=256,
                        help="largest accepted submission")
    parser.add_argument("--allowed-data-root", action="append", default=[],
                        help="only accept data_path under this prefix (repeatable); "
                             "without one, local paths are refused")
    parser.add_argument("--allow-any-data-path", action="store_true",
                        help="without --allowed-data-root, accept local paths too: a job "
                             "then reads any file this server's user can read, and its "
                             "model carries what it learned back to the client")
    parser.add_argument("--threads", type=int, default=16, help="HTTP worker threads")
    parser.add_argument("--audit-log", default=None,
                        help="the audit log (JSON lines; default: audit.jsonl in the work "
                             "folder); 'none' for none")
    for flag, kind, default, text in _LIMIT_FLAGS:
        parser.add_argument(flag, type=kind, default=default, help=text)
    args = parser.parse_args(argv)
    # force: `distkeras punchcard` runs after the CLI configured WARNING, which dropped
    # this server's INFO lines (jobs queued, started, reloads).
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        force=True)
    audit_log = {None: "default", "none": None}.get(args.audit_log, args.audit_log)
    try:
        punchcard = Punchcard(args.secrets, args.work_dir, args.master, args.max_running,
                              args.allowed_data_root,
                              allow_any_data_path=args.allow_any_data_path,
                              max_job_seconds=args.max_job_minutes * 60 or None,
                              max_epochs=args.max_epochs, audit_log=audit_log,
                              model_checker=ModelChecker(
                                  args.check_memory_mb << 20, args.check_seconds,
                                  args.check_seconds, args.max_concurrent_checks))
    except (OSError, ValueError) as error:
        sys.stderr.write(f"punchcard: error: {error}\n")
        return 1
    for warning in _exposure_warnings(args.host, args.allowed_data_root,
                                      args.allow_any_data_path):
        logger.warning(warning)
    try:
        server = make_server(punchcard, args.host, args.port, args.threads,
                             args.max_request_mb << 20, connection_limit=args.connection_limit,
                             header_timeout=args.header_timeout,
                             min_upload_rate=args.min_upload_kbps << 10,
                             channel_timeout=args.idle_timeout)
    except OSError as error:  # the port taken (another server running?) or not ours
        punchcard.close()
        sys.stderr.write(f"punchcard: error: cannot listen on {args.host}:{args.port}: "
                         f"{error}\n")
        return 1
    punchcard.model_checker.prestart()  # the first submission's check, warm
    # SIGHUP reads the secrets file again (as a change to it does, within a second).
    signal.signal(signal.SIGHUP, lambda _signum, _frame: punchcard.checker.reload())
    logger.info("Punchcard listening on %s:%s, jobs on %s", args.host, args.port, args.master)
    try:
        server.run()
    except KeyboardInterrupt:
        logger.info("Punchcard stopped")
    finally:
        punchcard.close()
    return 0


def secret_command(argv=None, prog="generate_secret"):
    """``generate_secret``: prints a new secret as JSON; can add it to a secrets file."""
    from distkeras.secrets_file import append_entry, generate_secret, make_entry

    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description="Generate a Punchcard secret (64 characters from a secure source).")
    parser.add_argument("--identity", required=True, help="who the secret belongs to")
    parser.add_argument("--append", metavar="SECRETS_FILE", default=None,
                        help="also add the entry to this secrets file")
    parser.add_argument("--hashed", action="store_true",
                        help="store only the secret's SHA-256 in the secrets file")
    args = parser.parse_args(argv)
    secret = generate_secret()
    if args.append:
        try:
            append_entry(args.append, make_entry(args.identity, secret, hashed=args.hashed))
        except (OSError, ValueError) as error:
            sys.stderr.write(f"generate_secret: error: {error}\n")
            return 2
    sys.stdout.write(json.dumps({"secret": secret, "identity": args.identity}) + "\n")
    return 0


# Named in their usage lines as the `distkeras` command runs them.
CLI_COMMANDS = {"punchcard": functools.partial(serve, prog="distkeras punchcard"),
                "secret": functools.partial(secret_command, prog="distkeras secret")}
