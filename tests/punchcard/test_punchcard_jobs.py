"""Punchcard's jobs over real HTTP on 127.0.0.1: many clients at once, and each job's
process, cancelled, crashed or destroyed while another request acts on it."""

import base64
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from punchcard_support import (RunningServer, adag_trainer, call_api, finished_job,
                               group_alive, staggered, wait_for)

from distkeras.job_deployment import Job, Punchcard
from distkeras.punchcard.client import JobError
from distkeras.punchcard.job_files import read_status
from distkeras.punchcard.processes import kill_tree
from distkeras.punchcard.secrets_file import secret_hash


def _submit_retrying(url, secret, payload):
    """A submission, sent again after 5 s (the server's Retry-After) while the server's
    model checks are all busy (503), as `Job.send` does."""
    while True:
        status, answer = call_api(url, "/api/submit", secret, payload, timeout=600)
        if status != 503:
            return status, answer
        time.sleep(5)


def test_concurrent_clients_then_cancel_mid_training(server, secrets, data_path):
    clients = 6
    payloads = [Job(secret, f"job{index}", data_path, 1, 2, adag_trainer()).payload()
                for index, secret in enumerate(secrets[1][:clients])]
    # Each model is checked in a child process of its own, two at a time: half a minute for 6,
    # in which the first job would run to its end. None starts until all are in.
    server.punchcard.max_running = 0
    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(lambda args: _submit_retrying(server.url, *args),
                                zip(secrets[1][:clients], payloads)))
    assert [status for status, _ in answers] == [200] * clients
    states = [call_api(server.url, "/api/state", secret)[1]["state"]
              for secret in secrets[1][:clients]]
    assert set(states) <= {"queued", "running"} and states.count("running") <= 1
    server.punchcard.max_running = 1

    # The one that runs: wait until it trains, cancel it, and its whole process tree is gone.
    store = server.punchcard.store
    assert wait_for(lambda: any(job["pid"] for job in store.by_state("running")))
    job = store.by_state("running")[0]
    secret = secrets[1][[p["job_name"] for p in payloads].index(job["name"])]
    assert wait_for(lambda: read_status(job) not in (None, {})
                     and read_status(job)["state"] == "training", timeout=120)
    started = time.monotonic()
    status, answer = call_api(server.url, "/api/cancel", secret)
    assert status == 200 and answer["state"] == "cancelled"
    assert time.monotonic() - started < 8  # not 10 s spent polling an unreaped zombie
    assert not group_alive(job["pid"])
    client = Job(secret, job["name"], data_path, 1, 2, adag_trainer())
    client.url = server.url
    with pytest.raises(JobError, match="cancelled"):
        client.wait_completion(timeout=10, poll_interval=0.1)


def test_cancel_returns_once_the_process_group_is_gone():
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    started = time.monotonic()
    kill_tree(process.pid, process)
    # The dead leader is reaped while waiting: no 10 s spent polling a zombie.
    assert time.monotonic() - started < 3
    assert process.returncode is not None and not group_alive(process.pid)


class _CrashingPunchcard(Punchcard):
    """Runs, instead of training, a process that logs and dies (the job id in its argv)."""

    def command(self, job):
        script = ("import sys; print('Loading the data...'); "
                  "print('26/11/30 ERROR Executor: lost executor 1', file=sys.stderr); "
                  "print('progress: 40%'); sys.exit(3)")
        return [sys.executable, "-c", script, job["id"]]


class _PollsJustBeforeTheExit:
    """A job's process whose poll() always answers just before it exits: the race in
    which the process is gone by the time /proc is read (a zombie's cmdline is empty)."""

    def __init__(self, process):
        self._process = process

    def poll(self):
        return None

    def __getattr__(self, name):
        return getattr(self._process, name)


class _RacingCrashPunchcard(_CrashingPunchcard):
    def _launch(self, job):
        process = super()._launch(job)
        if process is not None:
            with self._lock:
                self._processes[job["id"]] = _PollsJustBeforeTheExit(process)
        return process


@pytest.mark.parametrize("punchcard_class", [_CrashingPunchcard, _RacingCrashPunchcard],
                         ids=["dies", "dies-just-after-its-poll"])
def test_a_job_whose_process_dies_reports_its_exit_and_error_lines(punchcard_class, secrets,
                                                                    tmp_path, data_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), punchcard_class=punchcard_class)
    try:
        job = Job(secrets[1][11], "crash", data_path, 1, 1, adag_trainer())
        job.send(running.url)
        assert wait_for(lambda: job.get_state()["state"] == "failed", timeout=30)
        assert job.get_state()["error"] == ("the job's process ended (exit code 3) without a "
                                            "result: 26/11/30 ERROR Executor: lost executor 1")
    finally:
        running.stop()


def test_a_cluster_job_asks_spark_for_the_executors_it_was_given(secrets, tmp_path):
    # No job starts (max_running=0): only the command the job would run matters here.
    punchcard = Punchcard(secrets[0], str(tmp_path / "work"), master="yarn", max_running=0)
    try:
        secret = secrets[1][12]
        body = Job(secret, "sized", "hdfs:///data/fashion.parquet", 3, 2, adag_trainer()).payload()
        punchcard.submit(secret_hash(secret), "user12", body)
        command = punchcard.command(punchcard.job_of(secret_hash(secret)))
        settings = [command[index + 1] for index, word in enumerate(command)
                    if word == "--conf"]
        # Spark's defaults otherwise (2 one-core executors on YARN): 6 workers taking turns.
        assert settings == ["spark.executor.instances=3", "spark.executor.cores=2"]
    finally:
        punchcard.close()
    local = Punchcard(secrets[0], str(tmp_path / "local"), master="local[2]", max_running=0)
    try:
        local.submit(secret_hash(secret), "user12", body)
        assert "--conf" not in local.command(local.job_of(secret_hash(secret)))
    finally:
        local.close()


class _SlowReadPunchcard(Punchcard):
    """Holds every request 0.3 s between reading its job and acting on it: the window in
    which a second client's request changes the job."""

    def job_of(self, secret_hash):
        job = super().job_of(secret_hash)
        time.sleep(0.3)
        return job


def test_concurrent_destroys_of_a_finished_job_give_it_to_one(secrets, tmp_path, data_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0,
                            punchcard_class=_SlowReadPunchcard)
    try:
        secret = secrets[1][20]
        finished_job(running, secret, data_path)
        # The results can be read as often as asked, until the job is destroyed.
        for _ in range(2):
            status, body = call_api(running.url, "/api/result", secret)
            assert status == 200 and body["history"] == [{"loss": 1.0}]
            assert base64.b64decode(body["model"]) == b"model"
        answers = staggered(3, lambda: call_api(running.url, "/api/destroy", secret))
        assert sorted(status for status, _ in answers) == [200, 404, 404]
        assert all("another request destroyed it" in body["error"]
                   for status, body in answers if status == 404)
        # As DESIGN.md has it, the destroy's answer holds the results too.
        assert [body["history"] for status, body in answers if status == 200] == \
            [[{"loss": 1.0}]]
        assert call_api(running.url, "/api/result", secret)[0] == 404
    finally:
        running.stop()


def test_the_second_of_two_cancels_says_the_job_is_cancelled(secrets, tmp_path, data_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0,
                            punchcard_class=_SlowReadPunchcard)
    try:
        secret = secrets[1][21]
        Job(secret, "queued", data_path, 1, 1, adag_trainer()).send(running.url)
        answers = staggered(2, lambda: call_api(running.url, "/api/cancel", secret))
        assert [status for status, _ in answers] == [200, 409]
        assert answers[1][1]["error"].startswith("The job is cancelled;")
    finally:
        running.stop()


class _SlowCancelPunchcard(Punchcard):
    """Holds 0.3 s after cancelling, before the request reads the job's new state."""

    def cancel(self, job):
        cancelled = super().cancel(job)
        time.sleep(0.3)
        return cancelled


def test_a_job_destroyed_while_its_cancel_answers_gives_404(secrets, tmp_path, data_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0,
                            punchcard_class=_SlowCancelPunchcard)
    try:
        secret = secrets[1][22]
        Job(secret, "queued", data_path, 1, 1, adag_trainer()).send(running.url)
        with ThreadPoolExecutor(2) as pool:
            cancel = pool.submit(call_api, running.url, "/api/cancel", secret)
            time.sleep(0.1)
            destroy = pool.submit(call_api, running.url, "/api/destroy", secret)
            assert destroy.result()[0] == 200
            status, body = cancel.result()
        assert status == 404 and "another request destroyed it" in body["error"]
    finally:
        running.stop()


class _SlowStartPunchcard(Punchcard):
    """Starts, instead of training, a process that sleeps (the job id in its argv), 1 s
    after marking the job running and 1 s before telling the scheduler it started: the
    windows in which a client's cancel, then its destroy, land."""

    def command(self, job):
        time.sleep(1.0)
        return [sys.executable, "-c", "import time; time.sleep(60)", job["id"]]

    def _launch(self, job):
        process = super()._launch(job)
        time.sleep(1.0)
        return process


def test_a_job_cancelled_then_destroyed_while_it_starts_leaves_no_process(secrets, tmp_path):
    """A cancel that came before the job's process existed stopped nothing, and a destroy
    right after deleted the row: the scheduler then read no row, failed, and left the
    process running, owned by nobody."""
    running = RunningServer(secrets[0], str(tmp_path / "work"),
                            punchcard_class=_SlowStartPunchcard)
    process = None
    try:
        secret = secrets[1][3]
        Job(secret, "starting", str(tmp_path), 1, 1, adag_trainer()).send(running.url)
        store = running.punchcard.store
        assert wait_for(lambda: store.by_secret(secret_hash(secret))["state"] == "running",
                         timeout=10, interval=0.02)
        assert call_api(running.url, "/api/cancel", secret)[0] == 200
        processes = running.punchcard._processes
        assert wait_for(lambda: processes, timeout=10, interval=0.02)
        process = next(iter(processes.values()))
        assert call_api(running.url, "/api/destroy", secret)[0] == 200
        assert wait_for(lambda: process.poll() is not None, timeout=15)
        assert not processes
    finally:
        running.stop()
        if process is not None and process.poll() is None:
            kill_tree(process.pid, process)


def test_a_stale_destroy_after_the_secrets_next_job_was_sent_deletes_nothing(secrets, tmp_path):
    """A destroy that read its job before another request destroyed it, and acts once the
    secret has its next job: it went on to read the deleted job's files (a 500)."""
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0)
    try:
        secret = secrets[1][7]
        finished_job(running, secret, str(tmp_path))
        stale = running.punchcard.job_of(secret_hash(secret))  # as the destroy read it
        assert call_api(running.url, "/api/destroy", secret)[0] == 200
        Job(secret, "next", str(tmp_path), 1, 1, adag_trainer()).send(running.url)
        assert running.punchcard.results(stale) is None
        assert running.punchcard.destroy(stale) is False
        assert running.punchcard.store.by_secret(secret_hash(secret))["name"] == "next"
    finally:
        running.stop()
