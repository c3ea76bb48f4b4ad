"""Punchcard's job server, independent of HTTP: submissions, job states and the jobs'
processes, kept in its SQLite job table. Run in the server's process.

`app` serves a `Punchcard` over HTTP; what it checks of a submission is in
`submissions`, what it runs in `processes`, when in `scheduler` (fairly: the next job is
of the identity with the fewest running, then of the one served longest ago, so one
identity's many secrets take neither every slot nor every turn).
"""

import logging
import os
import shutil
import subprocess
import threading
import time
import uuid

from distkeras.punchcard import data_roots, job_files, processes, scheduler
from distkeras.punchcard.audit import AuditLog
from distkeras.punchcard.model_check import ModelChecker
from distkeras.punchcard.secrets_file import SecretsFile
from distkeras.punchcard.slots import SecretSlots
from distkeras.punchcard.store import JobStore
from distkeras.punchcard.submissions import check_epochs, validate_submission

logger = logging.getLogger(__name__)

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
        audit_log: The audit log's path (`audit.AuditLog`): ``"default"`` for
            ``audit.jsonl`` in ``work_dir``, None for none.
        job_memory_bytes: Each job process's memory limit (`processes.job_command`).
        audit_max_bytes: The audit log is rotated at this size (4 old files kept).
    """

    def __init__(self, secrets_path, work_dir, master="local[*]", max_running=1,
                 allowed_data_roots=(), model_checker=None, allow_any_data_path=False,
                 max_job_seconds=None, max_epochs=None, audit_log="default",
                 job_memory_bytes=None, audit_max_bytes=64 << 20):
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
                              if audit_log == "default" else audit_log, audit_max_bytes)
        self.master = master
        self.max_running = max_running
        self.allowed_data_roots = tuple(allowed_data_roots)
        self.model_checker = model_checker or ModelChecker()
        self.allow_any_data_path = allow_any_data_path
        self.max_job_seconds = max_job_seconds
        self.max_epochs = max_epochs
        self.job_memory_bytes = job_memory_bytes
        self._processes = {}
        self._starting = set()  # running in the table, but no process yet
        self._destroying = set()  # jobs a destroy request is reading and deleting
        self.slots = SecretSlots(self.store)
        self._turns = {}  # identity -> the scheduler's turn it last had a job started
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.reconcile()
        self._scheduler = scheduler.run_every(self.schedule, self._stop)

    def close(self):
        """Stops the scheduler and the model checker (jobs' processes run on)."""
        self._stop.set()
        self._scheduler.join(timeout=5)
        self.model_checker.close()

    # -- requests ---------------------------------------------------------------------

    def submit(self, secret_hash, identity, body):
        """Checks a submission and queues its job; returns its public state, or None when
        the secret is busy. The caller holds the secret's submission slot
        (`slots.SecretSlots.claim_submission`).

        Raises:
            BadRequest: The submission is malformed.
        """
        if self.store.by_secret(secret_hash) is not None:
            return None
        check_epochs(body, self.max_epochs)
        fields, trainer_class, config, model_bytes = validate_submission(
            body, self.allowed_data_roots,
            lambda *parts: self.model_checker.check_submission(*parts, owner=identity),
            self.allow_any_data_path)
        job_id = uuid.uuid4().hex  # the job's folder is named by it, never by input
        job_dir = job_files.write_submission(self.work_dir, job_id, model_bytes, config,
                                             fields.pop("train_options"))
        job = {"id": job_id, "secret_hash": secret_hash, "identity": identity,
               "trainer_class": trainer_class, "job_dir": job_dir, "state": "queued",
               "created": time.time(), **fields}
        if not self.store.insert_if_free(job):
            shutil.rmtree(job_dir, ignore_errors=True)
            return None
        logger.info("Job %s (%s) queued for %s", job_id, fields["name"], identity)
        return self.public_state(self.store.by_secret(secret_hash))

    def job_of(self, secret_hash):
        """The secret's job's row, brought up to date with its process, or None."""
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
            processes.kill_tree(pid, process)
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
        """A finished job's results (`job_files.open_results`: its model an open file, the
        caller's to close), or None if it was destroyed meanwhile."""
        try:
            return job_files.open_results(job)
        except OSError:
            if self._current_row(job) is None:
                return None  # its files deleted under this read
            raise

    def forget(self, job):
        """Deletes the job's row and folder."""
        self.store.delete(job["id"])
        shutil.rmtree(job["job_dir"], ignore_errors=True)

    # -- state ------------------------------------------------------------------------

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
        alive = exit_code is None and processes.process_alive(pid, job["id"])
        if not alive and process is not None and exit_code is None:
            # It exited between poll() and the look at /proc (a zombie's cmdline is
            # empty): reap it now for its exit code, which the error names.
            exit_code = processes.reaped_exit_code(process)
        # Read once the process is known to be gone: a status written just before it
        # exited counts (read earlier, a finished job could look as if it left no result).
        status = job_files.read_status(job) or {}
        if status.get("state") == "finished" and not alive:
            self.store.finish(job["id"], "finished", only_if_state="running")
        elif status.get("state") == "failed" and not alive:
            self.store.finish(job["id"], "failed", status.get("error"), only_if_state="running")
        elif not alive:
            log_tail = job_files.log_tail(job)
            ended = "the job's process ended" + processes.exit_description(exit_code)
            self.store.finish(job["id"], "failed", ended + " without a result"
                              + (f": {log_tail}" if log_tail else ""), only_if_state="running")
        if not alive:
            with self._lock:
                self._processes.pop(job["id"], None)
        return self.store.by_secret(job["secret_hash"]) or job

    def client_error(self, job):
        """The job's error as its client sees it (`data_roots.redact`)."""
        options = job_files.read_train_options(job)
        own = [job["data_path"]] + ([options["validation"]]
                                    if isinstance(options.get("validation"), str) else [])
        return data_roots.redact(job["error"], self.allowed_data_roots, own)

    def public_state(self, job):
        """What a client sees of its job."""
        status = job_files.read_status(job) or {}
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
                pid = processes.find_job_process(job["id"])
                if pid is not None:
                    logger.warning("Job %s: found its process %s, whose pid was not recorded",
                                   job["id"], pid)
                    self.store.update(job["id"], pid=pid)
        for job in self.store.by_state("running"):
            self._refresh(job)
        for job in self.store.by_state("cancelled"):
            # `cancel` marks the job, then stops its process: a server stopped in between
            # left it training, for a job nobody follows (and that no limit counts).
            if processes.process_alive(job["pid"], job["id"]):
                logger.warning("Job %s was cancelled, but its process %s still runs: "
                               "stopping it", job["id"], job["pid"])
                processes.kill_tree(job["pid"])

    def schedule(self):
        """One turn of the scheduler (every half second): running jobs brought up to date
        (and stopped past ``max_job_seconds``), queued jobs started in free slots."""
        for job in self.store.by_state("running"):
            self._stop_if_overdue(job)
            self._refresh(job)
        for job in scheduler.next_jobs(self.store.by_state("running"),
                                       self.store.by_state("queued"), self.max_running,
                                       self._turns):
            self._start(job)

    def _stop_if_overdue(self, job):
        """Fails and stops a job that has run longer than ``max_job_seconds``."""
        if not scheduler.is_overdue(job, self.max_job_seconds, time.time()):
            return
        if self.store.finish(job["id"], "failed",
                             f"the job ran longer than this server allows "
                             f"({self.max_job_seconds:g} s, punchcard --max-job-minutes), and "
                             "was stopped", only_if_state="running"):
            logger.warning("Job %s ran past %s s: stopped", job["id"], self.max_job_seconds)
            self._stop_process(job["id"], job["pid"])

    def command(self, job):
        """The job's command line (`processes.job_command`)."""
        return processes.job_command(job, self.master, self.job_memory_bytes)

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
        try:
            process = processes.start(self.command(job), job)
        except OSError as error:
            self.store.finish(job["id"], "failed", f"could not start the job: {error}")
            return None
        with self._lock:
            self._processes[job["id"]] = process
        return process

