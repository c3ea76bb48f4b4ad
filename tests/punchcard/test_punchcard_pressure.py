"""Punchcard under pressure (issue #47): withheld bodies, busy secrets, large bodies and
downloads, the audit log and the scheduler, against a real server on 127.0.0.1."""

import base64
import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from punchcard_support import SCRIPTS, RunningServer, call_api, free_port, reachable, wait_for

from distkeras.job_deployment import Job
from distkeras.punchcard.protocol import SECRET_HEADER
from distkeras.punchcard.secrets_file import append_entry, generate_secret, make_entry, secret_hash
from distkeras.punchcard.store import JobStore


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    """user0 .. user7, and alice0 .. alice4 (one identity, five secrets)."""
    path = str(tmp_path_factory.mktemp("pressure-secrets") / "secrets.json")
    values = {}
    for name in [f"user{index}" for index in range(8)] + [f"alice{i}" for i in range(5)]:
        values[name] = generate_secret()
        append_entry(path, make_entry(name.rstrip("0123456789") if name.startswith("alice")
                                      else name, values[name]))
    return path, values


def Server(secrets_path, work_dir, **options):
    """A `RunningServer` whose jobs never start."""
    return RunningServer(secrets_path, work_dir, max_running=0, threads=4, **options)


def _job_row(work_dir, secret, identity, state, index=0, model_bytes=None):
    """A job row in ``work_dir``'s table (the server's own, or one it will open), with a
    trained model of ``model_bytes`` and a history when given."""
    os.makedirs(work_dir, mode=0o700, exist_ok=True)
    job_dir = os.path.join(work_dir, "jobs", f"job{index}-{identity}")
    os.makedirs(job_dir, mode=0o700, exist_ok=True)
    if model_bytes is not None:
        with open(os.path.join(job_dir, "trained.keras"), "wb") as handle:
            handle.write(model_bytes)
        with open(os.path.join(job_dir, "history.json"), "w", encoding="utf-8") as handle:
            json.dump([{"loss": 1.0}], handle)
    row = {"id": f"job{index}-{identity}", "secret_hash": secret_hash(secret),
           "identity": identity, "trainer_class": "ADAG", "job_dir": job_dir,
           "state": state, "created": 1000.0 + index, "name": f"job{index}",
           "data_path": "hdfs:///x", "num_executors": 1, "num_processes": 1}
    store = JobStore(os.path.join(work_dir, "jobs.sqlite"))
    assert store.insert_if_free(row)
    store.close()
    return row


def _headers(path, secret, length, method="POST"):
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    if secret is not None:
        head += f"{SECRET_HEADER}: {secret}\r\n"
    return (head + f"Content-Length: {length}\r\n\r\n").encode()


def _answer(client, timeout=10):
    """What the server sends on ``client`` until it closes the connection (or resets
    it, or ``timeout`` seconds pass)."""
    client.settimeout(timeout)
    answer = b""
    try:
        while chunk := client.recv(65536):
            answer += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return answer


def _one_answer(client, timeout=10):
    """The first answer the server sends on ``client``, headers and body."""
    client.settimeout(timeout)
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer.split(b"\r\n\r\n", 1)[1]) < int(
            answer.lower().split(b"content-length: ")[1].split(b"\r\n")[0]):
        chunk = client.recv(65536)
        assert chunk, answer
        answer += chunk
    return answer


def _withhold(port, count, requests, stop):
    """``count`` clients that send one of ``requests``' headers whole and withhold the
    body, reconnecting as soon as the server answers or drops them, until ``stop``."""
    def connect(index):
        client = socket.socket()
        try:
            client.connect(("127.0.0.1", port))
            client.sendall(requests[index % len(requests)])
        except OSError:
            client.close()
            return None
        return client

    clients = [connect(index) for index in range(count)]
    opened = count
    while not stop.is_set():
        live = [client for client in clients if client is not None]
        readable = select.select(live, [], [], 0.05)[0] if live else []
        for index, client in enumerate(clients):
            if client is None or client in readable:  # answered, dropped or never in
                if client is not None:
                    client.close()
                clients[index] = connect(opened)
                opened += 1
    for client in clients:
        if client is not None:
            client.close()
    return opened


def test_withheld_bodies_do_not_lock_out_a_legitimate_client(secrets, tmp_path):
    """Clients that sent whole headers (Content-Length: 1 MiB, any secret) and withheld
    the body were never evicted; at the connection limit the newest connection, the
    legitimate one, was closed: 2 of 58 `GET /api/state` answered in 60 s."""
    path, values = secrets
    running = Server(path, str(tmp_path / "work"), connection_limit=20, header_timeout=2.0)
    port = int(running.server.effective_port)
    requests = [_headers("/api/submit", values["user1"], 1 << 20),
                _headers("/api/submit", "wrong", 1 << 20),
                _headers("/api/submit", None, 1 << 20),
                _headers("/api/state", values["user2"], 60_000, method="GET"),
                _headers("/api/submit", values["user3"], 1 << 20)]
    stop = threading.Event()
    attack = threading.Thread(target=_withhold, args=(port, 60, requests, stop), daemon=True)
    attack.start()
    latencies = []
    try:
        time.sleep(3)  # three times the limit connected, many dropped and back
        for _ in range(20):
            started = time.monotonic()
            status, _ = call_api(running.url, "/api/state", values["user0"], timeout=20)
            latencies.append(time.monotonic() - started)
            assert status == 404  # this secret has no job: it was answered
            time.sleep(0.1)
        assert len(running.server.active_channels) <= 20 + 2
    finally:
        stop.set()
        attack.join(timeout=30)
        running.stop()
    # benchmarks/punchcard_pressure.py measures it at a larger scale for the docs.
    # Locked out, a call waited out its 20 s; answered, it takes milliseconds (a loaded
    # machine: a few seconds at most).
    assert max(latencies) < 6.0, latencies


def test_a_withheld_body_is_dropped_after_its_allowance(secrets, tmp_path):
    """With a valid secret one withheld body held its connection for content length /
    min upload rate (68 minutes for 256 MB)."""
    path, values = secrets
    # Two seconds: a server loop slowed by a busy machine still reads a legitimate
    # request within its header timeout.
    running = Server(path, str(tmp_path / "work"), header_timeout=2.0)
    try:
        with socket.create_connection(("127.0.0.1", int(running.server.effective_port)),
                                      timeout=10) as client:
            client.sendall(_headers("/api/submit", values["user4"], 60 << 20) + b"{" * 1000)
            started = time.monotonic()
            assert _answer(client, timeout=15) == b""  # closed, unanswered
            assert time.monotonic() - started < 8.0  # the allowance was minutes
        # Its secret's submission slot was given back with the connection.
        try:
            status = call_api(running.url, "/api/submit", values["user4"], data=b"{no")[0]
        except ConnectionResetError:
            # In 2 of 4 full runs (never alone) the first request after the drop was
            # reset before any answer; why is still open. The slot is what this checks.
            status = call_api(running.url, "/api/submit", values["user4"], data=b"{no")[0]
        assert status == 400
        # An unknown secret's body is answered at once, then dropped for the header
        # timeout at most, however fast it keeps coming.
        with socket.create_connection(("127.0.0.1", int(running.server.effective_port)),
                                      timeout=10) as client:
            client.sendall(_headers("/api/submit", "wrong", 256 << 20))
            assert b'{"error": "Unknown secret."}' in _one_answer(client)
            started = time.monotonic()
            with pytest.raises(OSError):
                while time.monotonic() - started < 15:
                    client.sendall(b"x" * (256 << 10))  # 1 MiB/s, 16 times the minimum
                    time.sleep(0.25)
            assert time.monotonic() - started < 8.0
    finally:
        running.stop()


def test_a_busy_secret_is_refused_from_its_headers(secrets, tmp_path):
    """A busy secret's submission had its whole body parsed before it was refused."""
    path, values = secrets
    work = str(tmp_path / "work")
    _job_row(work, values["user5"], "user5", "queued")
    running = Server(path, work)
    port = int(running.server.effective_port)
    try:
        # Invalid JSON: parsed, it would be a 400; refused from the headers, a 403.
        status, answer = call_api(running.url, "/api/submit", values["user5"], data=b"{no")
        assert status == 403 and "already has a job ('job0', queued)" in answer["error"]
        # The answer comes before the body: only the headers of 50 MB were sent.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(_headers("/api/submit", values["user5"], 50 << 20))
            answer = _one_answer(client)
        assert answer.startswith(b"HTTP/1.1 403") and b"already has a job" in answer
        # One submission of a secret at a time, from its headers on: a second one is
        # refused while the first is still being sent, and taken once it is gone.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as first:
            first.sendall(_headers("/api/submit", values["user6"], 10 << 20) + b"{")
            time.sleep(0.3)
            status, answer = call_api(running.url, "/api/submit", values["user6"], data=b"{")
            assert status == 403 and "still being sent, or still being checked" in \
                answer["error"]
        assert wait_for(lambda: call_api(running.url, "/api/submit", values["user6"],
                                         data=b"{no")[0] == 400, timeout=10)
        records = [json.loads(line) for line in
                   open(os.path.join(work, "audit.jsonl"), encoding="utf-8")]
        assert ("user5", "submit", 403) in {(r["identity"], r["action"], r["status"])
                                            for r in records}
    finally:
        running.stop()


def test_cancel_and_destroy_with_an_unknown_secret_are_refused(secrets, tmp_path):
    path, values = secrets
    work = str(tmp_path / "work")
    row = _job_row(work, values["user7"], "user7", "failed")
    running = Server(path, work)
    try:
        for route in ["/api/cancel", "/api/destroy", "/api/result"]:
            for secret in ["wrong", "", None, values["user7"] + "x"]:
                status, answer = call_api(running.url, route, secret)
                assert (status, answer) == (403, {"error": "Unknown secret."}), (route, secret)
        assert running.punchcard.store.by_secret(row["secret_hash"])["state"] == "failed"
        assert os.path.isdir(row["job_dir"])
    finally:
        running.stop()


def _download(url, secret, read=True):
    """A GET of /api/result: (status, the answer's bytes)."""
    request = urllib.request.Request(url + "/api/result", headers={SECRET_HEADER: secret})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()


def test_results_are_streamed_a_few_at_a_time_per_secret(secrets, tmp_path):
    """The model was base64-encoded whole in memory, for any number of downloads."""
    path, values = secrets
    work = str(tmp_path / "work")
    model = os.urandom(40 << 20)
    _job_row(work, values["user1"], "user1", "finished", model_bytes=model)
    running = Server(path, work)
    port = int(running.server.effective_port)
    try:
        stalled = []
        for _ in range(2):  # two downloads that read nothing hold both of the secret's slots
            client = socket.create_connection(("127.0.0.1", port), timeout=10)
            client.sendall(f"GET /api/result HTTP/1.1\r\nHost: x\r\n{SECRET_HEADER}: "
                           f"{values['user1']}\r\n\r\n".encode())
            stalled.append(client)
        time.sleep(1.0)
        status, answer = _download(running.url, values["user1"])
        assert status == 429 and b"already sent 2 results at once" in answer, answer[:200]
        for client in stalled:
            client.close()
        assert wait_for(lambda: _download(running.url, values["user1"])[0] == 200, timeout=20)
        status, answer = _download(running.url, values["user1"])
        decoded = json.loads(answer)
        assert base64.b64decode(decoded["model"]) == model
        assert decoded["history"] == [{"loss": 1.0}] and decoded["state"] == "finished"
        # The client reads it as before, and destroy streams it too.
        job = Job(values["user1"], "done", "hdfs:///x", 1, 1, None)
        job.attach(running.url)
        assert job.destroy()["state"] == "finished" and job.model_bytes == model
        assert job.get_history() == [{"loss": 1.0}]
        assert running.punchcard.store.by_secret(secret_hash(values["user1"])) is None
    finally:
        running.stop()


def test_a_download_read_too_slowly_is_dropped(secrets, tmp_path):
    """A client that read its result a trickle at a time held a request thread (and its
    secret's download slot) for as long as it kept reading."""
    path, values = secrets
    work = str(tmp_path / "work")
    _job_row(work, values["user2"], "user2", "finished", model_bytes=os.urandom(40 << 20))
    running = Server(path, work, channel_timeout=1, min_upload_rate=4 << 20)
    try:
        with socket.socket() as client:
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)  # reads little
            client.settimeout(10)
            client.connect(("127.0.0.1", int(running.server.effective_port)))
            client.sendall(f"GET /api/result HTTP/1.1\r\nHost: x\r\n{SECRET_HEADER}: "
                           f"{values['user2']}\r\n\r\n".encode())
            started, read = time.monotonic(), 0
            with pytest.raises(ConnectionResetError):
                while chunk := client.recv(16 << 10):  # 64 KiB/s
                    read += len(chunk)
                    time.sleep(0.25)
                    assert time.monotonic() - started < 20
                raise ConnectionResetError("closed")  # closed cleanly: also dropped
        assert read < 5 << 20
        # Both of the secret's download slots are free again.
        answers = _concurrently(2, lambda _: _download(running.url, values["user2"])[0])
        assert answers == [200, 200]
    finally:
        running.stop()


def _peak_rss(pid):
    """The process's peak resident memory (VmHWM), in bytes."""
    with open(f"/proc/{pid}/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) << 10
    raise AssertionError("no VmHWM")


def _reset_peak_rss(pid):
    with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as handle:
        handle.write("5")


def _concurrently(count, call):
    answers = [None] * count

    def run(index):
        answers[index] = call(index)

    threads = [threading.Thread(target=run, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    return answers


def test_large_bodies_and_downloads_keep_the_server_memory_bounded(secrets, tmp_path):
    """6 concurrent 100 MB bodies of one secret took the server from 160 MB to 1.40 GB;
    8 downloads of a 40 MB model from 354 MB to 997 MB."""
    path, values = secrets
    work = str(tmp_path / "work")
    model_size, body_size = 40 << 20, 40 << 20
    users = ["user1", "user2", "user3", "user4"]
    for index, user in enumerate(users):
        _job_row(work, values[user], user, "finished", index, os.urandom(model_size))
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, os.path.join(SCRIPTS, "punchcard.py"), "--secrets", path,
         "--host", "127.0.0.1", "--port", str(port), "--work-dir", work,
         "--max-running", "0", "--max-request-mb", "64"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        assert wait_for(lambda: reachable(url), timeout=120)
        _reset_peak_rss(server.pid)
        before = _peak_rss(server.pid)
        answers = _concurrently(8, lambda index: _download(url, values[users[index % 4]]))
        assert all(status == 200 for status, _ in answers), [s for s, _ in answers]
        assert all(len(body) > model_size * 4 // 3 for _, body in answers)
        downloads = _peak_rss(server.pid) - before
        # A submission whose model is a large base64 string (not an archive), sent once
        # small first: the modules that a check imports are in memory before the count.
        def body(size):
            return json.dumps({"job_name": "big", "data_path": "hdfs:///x",
                               "num_executors": 1, "num_processes": 1,
                               "trainer": {"class_name": "ADAG", "config": {}},
                               "model": "A" * size}).encode()

        assert call_api(url, "/api/submit", values["user5"], data=body(4096))[0] == 400
        large = body(body_size)
        _reset_peak_rss(server.pid)
        before = _peak_rss(server.pid)
        answers = _concurrently(6, lambda _: call_api(url, "/api/submit", values["user5"],
                                                      data=large, timeout=300))
        bodies = _peak_rss(server.pid) - before
        assert sorted(status for status, _ in answers) == [400] + [403] * 5, answers
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert downloads < model_size, downloads >> 20
    assert bodies < 4 * body_size, bodies >> 20


def test_the_audit_log_is_bounded_per_line_and_rotated(secrets, tmp_path):
    """An unauthenticated request's path was written twice per line, whole, to a file
    that grew for ever."""
    path, _ = secrets
    work = tmp_path / "work"
    running = Server(path, str(work), punchcard_options={"audit_max_bytes": 4000})
    try:
        long_path = "/api/" + "a" * 60_000
        for _ in range(60):
            assert call_api(running.url, long_path, "wrong")[0] == 404
    finally:
        running.stop()
    files = sorted(os.listdir(work))
    assert [name for name in files if name.startswith("audit")] == [
        "audit.jsonl", "audit.jsonl.1", "audit.jsonl.2", "audit.jsonl.3", "audit.jsonl.4"]
    for name in files:
        if name.startswith("audit"):
            lines = (work / name).read_text().splitlines()
            assert (work / name).stat().st_size <= 4000 and lines
            assert all(len(line) < 1000 and json.loads(line)["status"] == 404
                       for line in lines)
            assert oct((work / name).stat().st_mode & 0o777) == "0o600"


class _QuickJobs:
    """A Punchcard whose jobs are a short sleep that then says it finished (the order in
    which the scheduler starts them is under test, not Spark)."""

    def command(self, job):
        status = os.path.join(job["job_dir"], "status.json")
        return [sys.executable, "-c", "import json, sys, time; time.sleep(0.3); "
                "json.dump({'state': 'finished'}, open(sys.argv[1], 'w'))", status, job["id"]]


def test_the_scheduler_takes_identities_in_turn(secrets, tmp_path):
    """At --max-running 1, five queued jobs of one identity ran before another's."""
    from distkeras.job_deployment import Punchcard

    path, values = secrets
    work = str(tmp_path / "work")
    for index in range(5):
        _job_row(work, values[f"alice{index}"], "alice", "queued", index)
    _job_row(work, values["user0"], "bob", "queued", 10)
    quick = type("QuickPunchcard", (_QuickJobs, Punchcard), {})
    running = RunningServer(path, work, max_running=1, threads=4, punchcard_class=quick)
    try:
        store = running.punchcard.store
        assert wait_for(lambda: len(store.by_state("finished")) == 6, timeout=120)
        order = [job["identity"] for job in sorted(store.by_state("finished"),
                                                   key=lambda job: job["started"])]
    finally:
        running.stop()
    assert order == ["alice", "bob", "alice", "alice", "alice", "alice"], order
