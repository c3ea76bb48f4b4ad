"""The Punchcard client: what a notebook imports to submit a job, follow it and fetch its
model (seed 002's `Job`).

Usage::

    job = Job(secret, job_name, data_path, num_executors, num_processes, trainer)
    job.send("http://yourcluster:8000")
    job.wait_completion()
    trained_model = job.get_trained_model()
    history = job.get_history()

This module runs where the client runs and speaks JSON over HTTP only: it imports nothing
of the server (no Flask, no waitress, no submission checks), and Keras only to serialize
the model it sends and rebuild the one it gets back.
"""

import base64
import http.client
import json
import logging
import time
import urllib.error
import urllib.request

from distkeras.errors import DistkerasError
from distkeras.keras_io.archives import deserialize_model, serialize_model
from distkeras.keras_io.model_state import get_optimizer_state, set_optimizer_state
from distkeras.punchcard.protocol import CANCEL, DESTROY, RESULT, SECRET_HEADER, STATE, SUBMIT

logger = logging.getLogger(__name__)

__all__ = ["SECRET_HEADER", "Job", "JobError", "ServerUnreachable"]


class JobError(DistkerasError, RuntimeError):
    """The server refused a request, or the job failed, was cancelled or was lost.

    Attributes:
        status: The HTTP status of the server's refusal, or None.
    """

    def __init__(self, message, status=None):
        super().__init__(message)
        self.status = status


def _retry_after(error, default=5.0):
    """The seconds a 503's Retry-After asks for (at most a minute)."""
    try:
        return min(60.0, max(0.0, float(getattr(error, "retry_after", None) or default)))
    except ValueError:
        return default


class ServerUnreachable(JobError):
    """The server could not be reached (down, restarting, or a network problem)."""


def _error_message(error):
    """The ``error`` field of an error answer's JSON object, else the HTTP reason."""
    try:
        body = json.loads(error.read().decode("utf-8"))
    except (ValueError, OSError, http.client.HTTPException):
        return error.reason
    return body.get("error", "") if isinstance(body, dict) else error.reason


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
            refused = JobError(f"Punchcard answered {error.code}: {_error_message(error)}",
                               status=error.code)
            refused.retry_after = error.headers.get("Retry-After")
            raise refused from error
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
        self.trainer.adopt_compiled_settings()
        return self.trainer

    def payload(self):
        """The submission: names, numbers, the trainer's class and JSON config, the model."""
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
        deadline = time.monotonic() + timeout
        try:
            answer = self._submit_when_checked(payload, deadline)
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

    def _submit_when_checked(self, payload, deadline):
        """POSTs the job, again after the server's Retry-After while it answers 503 (its
        model checks all busy) and ``deadline`` allows."""
        while True:
            try:
                return self._request("POST", SUBMIT, payload,
                                     timeout=max(1.0, deadline - time.monotonic()))
            except JobError as error:
                wait = _retry_after(error)
                if error.status != 503 or time.monotonic() + wait > deadline:
                    raise
                time.sleep(wait)

    def _probe_status(self):
        """The status of a small request (200, or the refusal's), None if unreachable."""
        try:
            self._request("GET", STATE, timeout=10)
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
        answer = self._request("GET", STATE)
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
        return self._request("GET", CANCEL)

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
        answer = self._request("GET", DESTROY + "?results=no")
        self.state = answer.get("state")
        return {"state": answer.get("state"), "error": answer.get("error")}

    def _fetch_result(self):
        """Keeps a finished job's model and histories; nothing for a job that did not
        finish (the server answers 409)."""
        try:
            answer = self._request("GET", RESULT, timeout=300)
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

        if self.trainer is None:
            return deserialize_model(self.model_bytes, compile=True)
        model = self._settled_trainer().compile_model(deserialize_model(self.model_bytes))
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
