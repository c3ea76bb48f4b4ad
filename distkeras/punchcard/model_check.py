"""Checks a client's model and trainer in a short-lived process of their own.

Building a client's model runs Keras on the client's configuration: it allocates what the
configuration declares and may change Keras's process-wide state. Punchcard never does
that in its own process. Each check runs in a child (``python -m distkeras.punchcard.model_check``)
under an address-space limit (RLIMIT_AS), a CPU-time limit (RLIMIT_CPU) and a wall-clock
timeout; the child reads one JSON request on stdin, answers JSON on its original stdout
and exits. What comes back is data only.

A child importing Keras takes seconds, so one child is kept ready ("warm") ahead of the
next check: it imports Keras, then waits for its request. Each child serves one check.

Checks take a few slots, and never a request thread's wait: one identity has one check at
a time, and a check that finds no free slot is refused at once (`ChecksBusy`, HTTP 503
with Retry-After), so a client submitting endless models holds one slot, not the server.
"""

import json
import logging
import os
import signal
import subprocess
import sys
import threading

from distkeras.errors import DistkerasError
from distkeras.keras_io.archives import serialize_model
from distkeras.punchcard.keras_checks import check_keras_parts
from distkeras.punchcard.refusals import BadRequest
from distkeras.training.registry import get_trainer_class
from distkeras.punchcard.processes import default_job_memory_bytes

logger = logging.getLogger(__name__)

DEFAULT_MEMORY_BYTES = 4 << 30
DEFAULT_CPU_SECONDS = 300
DEFAULT_TIMEOUT = 300
RETRY_AFTER_SECONDS = 5


class CheckFailed(DistkerasError, ValueError):
    """The check did not end with an answer: it ran out of memory, CPU time or time."""


class ChecksBusy(DistkerasError, RuntimeError):
    """No check can start now (HTTP 503): every slot is taken, or this identity's other
    submission is being checked. ``retry_after``: seconds to wait before trying again."""

    def __init__(self, message, retry_after=RETRY_AFTER_SECONDS):
        super().__init__(message)
        self.retry_after = retry_after


class ModelChecker:
    """Runs `keras_checks.check_keras_parts` in child processes with resource limits.

    Args:
        memory_bytes: The child's address-space limit (RLIMIT_AS).
        cpu_seconds: The child's CPU-time limit (RLIMIT_CPU), its Keras import included.
        timeout: Seconds a check may take, from the request sent to the answer.
        max_concurrent: Checks running at once; more are refused (`ChecksBusy`).
        activation_bytes: The most memory a model's activations for one batch may take
            (`keras_checks.check_activations`): a job process's memory limit; None: the
            default one (`processes.default_job_memory_bytes`), 0: no limit.
    """

    def __init__(self, memory_bytes=DEFAULT_MEMORY_BYTES, cpu_seconds=DEFAULT_CPU_SECONDS,
                 timeout=DEFAULT_TIMEOUT, max_concurrent=2, activation_bytes=None):
        self.memory_bytes = memory_bytes
        self.cpu_seconds = cpu_seconds
        self.timeout = timeout
        self.max_concurrent = max_concurrent
        if activation_bytes is None:
            activation_bytes = default_job_memory_bytes()
        self.activation_bytes = activation_bytes
        self._slots = threading.BoundedSemaphore(max_concurrent)
        self._owners = set()  # identities with a check running
        self._lock = threading.Lock()
        self._spare = None
        self._closed = False

    def _spawn(self):
        limits = json.dumps({"memory_bytes": self.memory_bytes,
                             "cpu_seconds": self.cpu_seconds,
                             "activation_bytes": self.activation_bytes})
        # Fewer malloc arenas: each thread's reserves 64 MiB of address space otherwise.
        env = dict(os.environ, MALLOC_ARENA_MAX="2", TF_CPP_MIN_LOG_LEVEL="2")
        env.pop("PYSPARK_GATEWAY_PORT", None)
        return subprocess.Popen([sys.executable, "-m", "distkeras.punchcard.model_check", limits],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=env, start_new_session=True)

    def prestart(self):
        """Starts the warm child now (rather than at the first check)."""
        with self._lock:
            if self._spare is None and not self._closed:
                self._spare = self._spawn()

    def _take(self):
        with self._lock:
            spare, self._spare = self._spare, None
        if spare is not None and spare.poll() is None:
            return spare
        return self._spawn()

    def check_submission(self, model_text, trainer_class_name, config, workers, owner=None):
        """`keras_checks.check_keras_parts` of a submission, in a child (`check`).

        Returns:
            The trainer's configuration as the child resolved it.

        Raises:
            BadRequest: The child refused the model or the trainer, or exceeded a limit.
            ChecksBusy: ``owner`` has a check running, or every slot is taken.
        """
        try:
            answer = self.check({"model": model_text, "trainer_class": trainer_class_name,
                                 "config": config, "workers": workers}, owner)
        except CheckFailed as error:
            logger.warning("A submission's check failed: %s", error)
            raise BadRequest(f"The model archive was refused: {error}") from error
        if not answer["ok"]:
            raise BadRequest(str(answer.get("error")))
        if not isinstance(answer.get("config"), dict):
            raise BadRequest("The model check answered no trainer configuration.")
        return answer["config"]

    def check(self, request, owner=None):
        """The child's answer to ``request`` (a JSON-able dict).

        Args:
            request: The model, trainer and workers to check.
            owner: Who asks (an identity): one check at a time each; None: not counted.

        Returns:
            The answer: ``{"ok": True, "config": ...}`` or ``{"ok": False, "error": ...}``.

        Raises:
            ChecksBusy: ``owner`` has a check running, or every slot is taken.
            CheckFailed: The child exceeded a limit, or ended without an answer.
        """
        with self._lock:
            if owner is not None and owner in self._owners:
                raise ChecksBusy("Another submission of yours is being checked: this server "
                                 "checks one at a time for each user. Try again when it "
                                 "has its answer.")
            if not self._slots.acquire(blocking=False):
                raise ChecksBusy(f"All {self.max_concurrent} of this server's model checks "
                                 "are busy: try again in a few seconds.")
            if owner is not None:
                self._owners.add(owner)
        try:
            process = self._take()
            try:
                return self._run(process, json.dumps(request).encode("utf-8"))
            finally:
                self.prestart()  # the next check's child imports Keras meanwhile
        finally:
            with self._lock:
                self._owners.discard(owner)
                self._slots.release()

    def _run(self, process, request):
        try:
            out, _ = process.communicate(request, timeout=self.timeout)
        except subprocess.TimeoutExpired as error:
            _kill(process)
            raise CheckFailed(f"the check took longer than {self.timeout} s, the most this "
                              "server gives one.") from error
        except OSError as error:  # the child died before it read the request
            _kill(process)
            raise CheckFailed(_ended(process.returncode, self)) from error
        try:
            answer = json.loads(out.decode("utf-8"))
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or not isinstance(answer.get("ok"), bool):
            raise CheckFailed(_ended(process.returncode, self))
        return answer

    def close(self):
        with self._lock:
            self._closed = True
            spare, self._spare = self._spare, None
        if spare is not None:
            _kill(spare)


def _kill(process):
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


def _ended(code, checker):
    """Why a child ended without an answer, in the client's terms."""
    if code in (-signal.SIGXCPU, -signal.SIGKILL):
        return (f"the check used more CPU time than this server gives one "
                f"({checker.cpu_seconds} s).")
    return (f"the check stopped without an answer (exit {code}): it may need more memory "
            f"than this server gives one ({checker.memory_bytes >> 20} MiB).")


def _limit_resources(limits):
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)
    cpu = limits["cpu_seconds"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _warm_up():
    """A check of this module's own small model and trainer, before the request comes:
    the imports and the backend's start-up (seconds) are then out of the client's check."""
    import base64

    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    trainer = get_trainer_class("ADAG")(
        keras_model=model, worker_optimizer="adam", loss="categorical_crossentropy",
        metrics=["accuracy"], num_workers=1)
    check_keras_parts(base64.b64encode(serialize_model(model)).decode(), "ADAG",
                      trainer.get_config(), 1)


def main(argv=None):
    """The child: limits itself, imports Keras, answers one request, exits."""
    argv = sys.argv[1:] if argv is None else argv
    limits = json.loads(argv[0])
    _limit_resources(limits)
    # The answer goes to the original stdout; anything Keras prints, to stderr.
    answer_fd = os.dup(1)
    os.dup2(2, 1)

    _warm_up()
    try:
        request = json.loads(sys.stdin.buffer.read())
        config = check_keras_parts(
            request["model"], request["trainer_class"], request["config"],
            request["workers"], limits.get("activation_bytes"))
        answer = {"ok": True, "config": config}
    except BadRequest as error:
        answer = {"ok": False, "error": str(error)}
    except MemoryError:
        answer = {"ok": False, "error": "The submission needs more memory to check than "
                                        "this server gives a check."}
    except Exception as error:  # anything Keras raises on a client's config
        answer = {"ok": False, "error": "The submission could not be checked: "
                                        f"{type(error).__name__}: {str(error)[:500]}"}
    with os.fdopen(answer_fd, "wb") as out:
        out.write(json.dumps(answer).encode("utf-8"))
    return 0


if __name__ == "__main__":
    main()
    # Without the interpreter's teardown (seconds with the backend's threads): the
    # answer is written, and nothing else of this process is kept.
    os._exit(0)
