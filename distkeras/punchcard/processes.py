"""A Punchcard job's process: its command line, its start, and how it is watched and stopped.

Each job runs as its own process and Spark application (``python -m distkeras.cli train
...``, arguments as a list, no shell), in its own folder and its own process group, so
that stopping it stops Spark's JVM and Python workers too. Run in the server.
"""

import json
import os
import signal
import subprocess
import sys
import time

from distkeras.punchcard import job_files


def default_job_memory_bytes():
    """Half of this machine's memory: what one process of a job may write by default."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    except (ValueError, OSError):  # no such setting on this system
        return 16 << 30


def job_command(job, master, memory_bytes=None):
    """The job's command line: ``distkeras train``, the same entry point as a user's own
    run, started by `distkeras.cli.punchcard_job` (its memory limit, its checks).

    Args:
        job: The job's row (`store.JobStore`).
        master: The Spark master it runs on.
        memory_bytes: The data-segment limit (RLIMIT_DATA) of each of the job's processes
            (Spark's JVM and Python workers inherit it); None: `default_job_memory_bytes`.
    """
    limits = json.dumps({"memory_bytes": memory_bytes or default_job_memory_bytes()})
    return [sys.executable, "-m", "distkeras.cli.punchcard_job", limits, "train",
            "--data", job["data_path"],
            "--model", job_files.path(job, job_files.MODEL),
            "--trainer", job["trainer_class"],
            "--trainer-config", job_files.path(job, job_files.TRAINER),
            "--output", job_files.path(job, job_files.TRAINED),
            "--history", job_files.path(job, job_files.HISTORY),
            "--validation-history", job_files.path(job, job_files.VALIDATION),
            "--status", job_files.path(job, job_files.STATUS),
            "--master", master,
            "--job-id", job["id"]] + _executor_arguments(job, master) + \
        _options_arguments(job)


def _executor_arguments(job, master):
    """The job's executors, as it asked: ``num_executors`` of ``num_processes`` task
    slots each, one worker a slot. A local master has one process whose threads
    are its slots (``local[N]``): the server's administrator sizes it."""
    if master.startswith("local"):
        return []
    return ["--conf", f"spark.executor.instances={job['num_executors']}",
            "--conf", f"spark.executor.cores={job['num_processes']}"]


def _options_arguments(job):
    path = job_files.path(job, job_files.TRAIN_OPTIONS)
    # A job queued by a server from before train options has no such file.
    return ["--train-options", path] if os.path.exists(path) else []


def start(command, job):
    """Starts ``command`` in the job's folder, in a new process group, its output in the
    job's log.

    Returns:
        The `subprocess.Popen`.

    Raises:
        OSError: If it could not start.
    """
    env = dict(os.environ)
    env.pop("PYSPARK_GATEWAY_PORT", None)
    with open(job_files.path(job, job_files.LOG), "wb") as log:
        return subprocess.Popen(command, cwd=job["job_dir"], stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)


def process_alive(pid, job_id):
    """Whether ``pid`` is still the job's process (not a reused pid)."""
    if not pid:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return job_id.encode() in handle.read()
    except OSError:
        return False


def find_job_process(job_id):
    """The pid of a running process whose command line is job ``job_id``'s
    (`job_command`), or None: after a restart, for a job whose server stopped between
    starting its process and recording its pid."""
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


def reaped_exit_code(process, timeout=5.0):
    """The exit code of a child process that has just ended, or None if it has not."""
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return None


def exit_description(exit_code):
    if exit_code is None:
        return ""  # not this server's child (started before a restart): unknown
    if exit_code < 0:
        try:
            return f" (killed by {signal.Signals(-exit_code).name})"
        except ValueError:
            return f" (killed by signal {-exit_code})"
    return f" (exit code {exit_code})"


def kill_tree(pid, process=None):
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

