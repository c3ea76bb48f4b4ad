"""Punchcard restarted while its jobs run: the jobs' processes are found again, followed
or stopped, and the client rides out the outage."""

import os
import subprocess
import sys
import threading
import time

import pytest
from conftest import accuracy
from punchcard_support import RunningServer, adag_trainer, call_api, group_alive, wait_for

from distkeras.job_deployment import Job, Punchcard
from distkeras.punchcard.client import JobError
from distkeras.punchcard.processes import kill_tree, process_alive
from distkeras.punchcard.secrets_file import secret_hash


class _StoppedBeforeThePidPunchcard(Punchcard):
    """Starts a job's process and stops there, as a server killed before it records the
    pid would: the scheduler starts nothing more."""

    def _start(self, job):
        process = self._launch(job)
        if process is not None:
            self.launched = process
            self._stop.set()


def test_a_restart_finds_a_job_whose_pid_was_not_recorded(secrets, tmp_path, data_path):
    work = str(tmp_path / "work")
    first = RunningServer(secrets[0], work, punchcard_class=_StoppedBeforeThePidPunchcard)
    secret = secrets[1][10]
    job = Job(secret, "unrecorded", data_path, 1, 2, adag_trainer())
    job.send(first.url)
    assert wait_for(lambda: hasattr(first.punchcard, "launched"))
    process = first.punchcard.launched
    first.stop()
    [row] = first.punchcard.store.by_state("running")
    assert row["pid"] is None
    second = RunningServer(secrets[0], work)
    try:
        # Found by its command line and followed, not failed as "ended without a result"
        # while it trains on, owned by nobody.
        [row] = second.punchcard.store.by_state("running")
        assert row["pid"] == process.pid
        job.url = second.url
        assert job.cancel()["state"] == "cancelled"
        assert process.wait(timeout=30) is not None
        assert not group_alive(process.pid)
    finally:
        second.stop()
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait(timeout=30)


def test_restart_mid_job_loses_nothing(secrets, tmp_path, data_path, fashion_test):
    work = str(tmp_path / "work")
    first = RunningServer(secrets[0], work)
    secret, doomed = secrets[1][5], secrets[1][6]
    job = Job(secret, "survivor", data_path, 1, 2, adag_trainer())
    job.send(first.url)
    store = first.punchcard.store
    assert wait_for(lambda: any(row["pid"] for row in store.by_state("running")))
    first.stop()  # the server goes away; the job's process keeps going

    second = RunningServer(secrets[0], work, max_running=2)
    try:
        job.url = second.url
        assert job.get_state()["state"] in ("running", "finished")
        job.wait_completion(timeout=300, poll_interval=0.5)
        assert accuracy(job.get_trained_model(), fashion_test) > 0.6

        # A job whose process dies while no server watches is reported failed, not running.
        lost = Job(doomed, "lost", data_path, 1, 1, adag_trainer())
        lost.send(second.url)
        assert wait_for(lambda: any(row["pid"] and row["name"] == "lost"
                                     for row in second.punchcard.store.by_state("running")))
        row = [r for r in second.punchcard.store.by_state("running") if r["name"] == "lost"][0]
        second.stop()
        os.killpg(row["pid"], 9)
        # This test process started the job, so it reaps it (a restarted server would not be
        # its parent; the kill alone would do).
        second.punchcard._processes[row["id"]].wait(timeout=30)
        assert wait_for(lambda: not group_alive(row["pid"]), timeout=30)
        third = RunningServer(secrets[0], work)
        lost.url = third.url
        state = lost.get_state()
        assert state["state"] == "failed"
        assert state["error"].startswith("the job's process ended without a result")
        third.stop()
    finally:
        second.server.close()


def test_wait_completion_rides_out_a_restart_and_reattaches(secrets, tmp_path, data_path):
    work, secret = str(tmp_path / "work"), secrets[1][10]
    first = RunningServer(secrets[0], work, max_running=0)
    job = Job(secret, "patient", data_path, 1, 1, adag_trainer())
    with pytest.raises(JobError, match=r"job\.send\(url\).*job\.attach\(url\)"):
        job.get_state()  # not sent yet: no server to ask
    job.send(first.url)
    restarted = []

    def restart():
        time.sleep(1)
        first.stop()
        time.sleep(3)  # the server is down for a few polls
        second = RunningServer(secrets[0], work, max_running=0, port=first.port)
        restarted.append(second)
        # Attaching from elsewhere: a new client with the same secret follows the job.
        other = Job(secret, "patient", data_path, 1, 1, adag_trainer())
        assert other.attach(second.url)["state"] == "queued"
        other.cancel()

    thread = threading.Thread(target=restart)
    thread.start()
    try:
        # The outage does not end the wait: the job's cancellation on the new server does.
        with pytest.raises(JobError, match="cancelled"):
            job.wait_completion(timeout=60, poll_interval=0.2, max_outage=30)
    finally:
        thread.join()
    second = restarted[0]
    second.stop()
    # A server that stays away: a clear error once max_outage has passed.
    started = time.monotonic()
    with pytest.raises(JobError, match=r"unreachable for \d+ s"):
        job.wait_completion(poll_interval=0.2, max_outage=1.5)
    assert time.monotonic() - started < 10


def test_a_restart_stops_the_process_of_a_job_cancelled_just_before(secrets, tmp_path):
    """Cancelling marks the job cancelled, then stops its process: a server stopped between
    the two left the process training on after the restart, for a job nobody follows."""
    work = str(tmp_path / "work")
    running = RunningServer(secrets[0], work, max_running=0)
    secret = secrets[1][6]
    Job(secret, "cancelled", str(tmp_path), 1, 1, adag_trainer()).send(running.url)
    row = running.punchcard.store.by_secret(secret_hash(secret))
    # The job's process, as the scheduler starts it: its own session, the job id in argv.
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                row["id"]], start_new_session=True)
    try:
        assert wait_for(lambda: process_alive(process.pid, row["id"]), timeout=10)
        running.punchcard.store.update(row["id"], state="cancelled", pid=process.pid,
                                       error="cancelled by the client")
        running.stop()
        restarted = RunningServer(secrets[0], work, max_running=0)
        try:
            assert wait_for(lambda: process.poll() is not None, timeout=15)
            assert call_api(restarted.url, "/api/state", secret)[1]["state"] == "cancelled"
        finally:
            restarted.stop()
    finally:
        if process.poll() is None:
            kill_tree(process.pid, process)
