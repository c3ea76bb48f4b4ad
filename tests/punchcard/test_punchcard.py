"""Punchcard over real HTTP on 127.0.0.1, with real jobs on local Spark."""

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import accuracy, build_mlp

from distkeras.job_deployment import (SECRET_HEADER, BadRequest, Job, JobError, Punchcard,
                                      ServerUnreachable, make_server)
from distkeras.punchcard.job_files import read_status
from distkeras.punchcard.processes import kill_tree, process_alive
from distkeras.punchcard.secrets_file import append_entry, generate_secret, make_entry, secret_hash
from distkeras.punchcard.submissions import check_data_path

NUM_SECRETS = 24
SCRIPTS = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "scripts")


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("secrets")
    path = str(folder / "secrets.json")
    values = [generate_secret() for _ in range(NUM_SECRETS)]
    for index, secret in enumerate(values):
        append_entry(path, make_entry(f"user{index}", secret, hashed=index % 2 == 1))
    return path, values


@pytest.fixture(scope="module")
def data_path(fashion_train, tmp_path_factory):
    path = str(tmp_path_factory.mktemp("punchcard-data") / "fashion.parquet")
    fashion_train.limit(2000).write.parquet(path)
    return path


class RunningServer:
    """A Punchcard application behind waitress, in this process, on a free port."""

    def __init__(self, secrets_path, work_dir, max_request_bytes=64 << 20, max_running=1,
                 port=0, allowed_data_roots=(), punchcard_class=Punchcard, threads=24,
                 model_checker=None, allow_any_data_path=True, punchcard_options=None,
                 **server_options):
        # Any data path by default: these tests' data are local folders of their own.
        self.punchcard = punchcard_class(secrets_path, work_dir, master="local[2]",
                                         max_running=max_running,
                                         allowed_data_roots=allowed_data_roots,
                                         model_checker=model_checker,
                                         allow_any_data_path=allow_any_data_path,
                                         **(punchcard_options or {}))
        # The same waitress server as `scripts/punchcard.py`'s, limits included.
        self.server = make_server(self.punchcard, "127.0.0.1", port, threads=threads,
                                  max_request_bytes=max_request_bytes, **server_options)
        self.port = self.server.effective_port
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.server.run()
        except OSError:
            pass  # stop() closed the listening socket under the loop's select()

    def stop(self):
        self.server.close()
        self.thread.join(timeout=10)
        self.punchcard.close()


@pytest.fixture
def server(secrets, tmp_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"))
    yield running
    running.stop()  # the scheduler first, so no queued job starts while we clean up
    for job in running.punchcard.store.by_state("queued", "running"):
        running.punchcard.cancel(job)


def _trainer(**kwargs):
    from distkeras.trainers import ADAG

    settings = dict(keras_model=build_mlp(), worker_optimizer="adam",
                    loss="categorical_crossentropy", metrics=["accuracy"], num_workers=2,
                    communication_window=4)
    settings.update(kwargs)
    return ADAG(**settings)


def _raw(url, path, secret=None, body=None, method=None, data=None, timeout=60):
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers[SECRET_HEADER] = secret
    payload = data if data is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url + path, data=payload, headers=headers,
                                     method=method or ("POST" if payload is not None else "GET"))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def _upload_status(url, secret, data):
    """The status of a submission of ``data``; 413 also when the server closed the
    connection on a refused body while it was still being sent."""
    request = urllib.request.Request(url + "/api/submit", data=data, method="POST",
                                     headers={SECRET_HEADER: secret})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except urllib.error.URLError as error:
        if isinstance(error.reason, (ConnectionResetError, BrokenPipeError)):
            return 413
        raise


def _wait_for(predicate, timeout=120, interval=0.2):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def _group_alive(pid):
    try:
        os.killpg(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_train_options_reach_the_job(server, secrets, data_path):
    secret = secrets[1][2]
    job = Job(secret, "options", data_path, 1, 2, _trainer(),
              train_options={"validation": 0.2, "shuffle": True, "class_weight": {0: 2.0}})
    job.send(server.url)
    job.wait_completion(timeout=300, poll_interval=0.5)

    trained = sum(record["batch_size"] for record in job.get_history())
    assert 1400 < trained < 1800  # about a fifth of the 2,000 rows held out
    (last,) = job.get_validation_history()[-1:]
    assert last["epoch"] == 1 and last["samples"] == trained and 0 < last["val_loss"] < 5


def test_readme_client_example_runs_as_printed(server, secrets, data_path, fashion_test):
    """The README's client block, as printed; its first job is also the seed's session
    (one job, 1 executor x 2 processes, whose model comes back trained), checked here
    rather than in a job of its own (each job is a Spark application of its own)."""
    from readme_support import readme_block, run_as_main

    code = readme_block("Punchcard: remote jobs")
    # The changes: the block's cluster is this server and its data, and its jobs are of
    # 1 executor x 2 processes (the same 2 workers at a time as 4 x 2 on local[2]).
    for printed, here in (('"hdfs:///data/fashion.parquet"', "path"),
                          ('"http://yourcluster:8000"', "url"), (", 4, 2, ", ", 1, 2, ")):
        assert printed in code
        code = code.replace(printed, here)
    secret = secrets[1][4]
    namespace = run_as_main(code, secret=secret, trainer=_trainer(), path=data_path,
                            url=server.url)

    # The first job's: trained_model and history are not assigned again after it.
    trained_model, history = namespace["trained_model"], namespace["history"]
    assert trained_model.compiled
    assert accuracy(trained_model, fashion_test) > 0.6
    assert sum(record["batch_size"] for record in history) == 2000
    assert {record["worker_id"] for record in history} == {0, 1}  # 1 executor x 2 processes
    assert namespace["job"].state == "cancelled"
    assert _raw(server.url, "/api/state", secret)[0] == 404  # destroyed: the secret is free
    # wait_completion and destroy deleted every job: their files are gone.
    assert os.listdir(os.path.join(server.punchcard.work_dir, "jobs")) == []


class _MisbehavingHandler:
    """Answers of a server that is not (or no longer) a well-behaved Punchcard."""

    ANSWERS = {
        "/html": (200, b"<html>a proxy's login page</html>", None),
        "/list": (200, b"[1, 2]", None),
        "/error-list": (500, b"[1, 2]", None),
        "/cut": (200, b'{"state": "runn', 100),  # says 100 bytes, sends 15, closes
        "/no-model": (200, b'{"state": "finished"}', None),
    }
    REQUESTED = []


@pytest.fixture
def misbehaving_url():
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            _MisbehavingHandler.REQUESTED.append(self.path)
            code, body, claimed = _MisbehavingHandler.ANSWERS[self.path.split("/api")[0]]
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(claimed or len(body)))
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_client_names_answers_that_are_not_punchcards(misbehaving_url):
    """An answer that is not a JSON object was a raw ValueError or AttributeError, and a
    connection cut mid-answer (a restart) an http.client.IncompleteRead, which
    `wait_completion` did not take for the outage it is."""
    def job_at(path):
        job = Job("secret", "probe", "/data/x.parquet", 1, 1, None)
        job.url = misbehaving_url + path
        return job

    for path in ("/html", "/list"):
        with pytest.raises(JobError, match="other than a JSON object.*Punchcard server"):
            job_at(path).get_state()
    with pytest.raises(JobError, match="Punchcard answered 500: Internal Server Error"):
        job_at("/error-list").get_state()
    with pytest.raises(ServerUnreachable, match="IncompleteRead"):
        job_at("/cut").get_state()
    with pytest.raises(JobError, match="unreachable for"):
        job_at("/cut").wait_completion(poll_interval=0.05, max_outage=0.2)
    # A finished job's results cut on their way: the job is not destroyed, so a retry
    # can still fetch them.
    del _MisbehavingHandler.REQUESTED[:]
    with pytest.raises(ServerUnreachable, match="IncompleteRead"):
        job_at("/cut").destroy()
    assert _MisbehavingHandler.REQUESTED == ["/cut/api/result"]
    with pytest.raises(JobError, match="/api/result without a model and history"):
        job_at("/no-model").destroy()


def test_a_submission_that_outlasts_the_clients_timeout_can_be_followed(secrets, tmp_path,
                                                                      data_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0,
                            punchcard_class=_SlowCheckPunchcard)
    try:
        job = Job(secrets[1][9], "slow", data_path, 1, 1, _trainer())
        with pytest.raises(JobError, match="did not answer the submission.*within 0.3 s.*attach"):
            job.send(running.url, timeout=0.3)
        # The server queued it all the same, and the job follows it.
        assert _wait_for(lambda: running.punchcard.store.by_state("queued"), timeout=30)
        assert job.attach(running.url)["state"] == "queued"
    finally:
        running.stop()


def test_refusals(secrets, tmp_path, data_path):
    import keras

    from distkeras.trainers import EnsembleTrainer
    from distkeras.utils import serialize_model

    running = RunningServer(secrets[0], str(tmp_path / "work"), max_request_bytes=4 << 20)
    try:
        url, secret = running.url, secrets[1][3]
        # An optimizer object travels as its Keras config: accepted below.
        good = Job(secret, "ok", data_path, 1, 1,
                   _trainer(worker_optimizer=keras.optimizers.SGD(0.05))).payload()
        config = good["trainer"]["config"]
        ensemble = Job(secret, "ens", data_path, 1, 1, EnsembleTrainer(
            build_mlp(), "adam", "categorical_crossentropy")).payload()["trainer"]
        assert _raw(url, "/api/submit", "not-a-secret", good)[0] == 403
        assert _raw(url, "/api/submit", None, good)[0] == 403
        assert _raw(url, "/api/state", "not-a-secret")[0] == 403
        cases = {
            "job_name": ["../../etc/passwd", "a;rm -rf /", "$(touch /tmp/pwned)", "", "x" * 65,
                         "abc\n"],
            "data_path": ["/data/../../etc", "/data/x\n--master", 42, "--master=yarn"],
            "num_executors": [0, -1, "2", 10**6, True],
            "model": ["not base64!", base64.b64encode(b"PK\x03\x04garbage").decode(), None,
                      base64.b64encode(b"hello").decode()],
            "trainer": [{"class_name": "os.system", "config": {}},
                        {"class_name": "ADAG", "config": {"communication_window": 0}},
                        {"class_name": "ADAG", "config": {"no_such_argument": 1}}, "ADAG",
                        # Valid but for a misspelled name: refused now, not in the job.
                        {"class_name": "ADAG", "config": {**good["trainer"]["config"],
                                                          "loss": "categorical_crossentropyy"}},
                        {"class_name": "ADAG", "config": {**good["trainer"]["config"],
                                                          "worker_optimizer": "adamm"}},
                        # Trains several models; a job returns one.
                        ensemble,
                        {"class_name": "ADAG", "config": {**config, "parallelism_factor": 10**6}}],
            "train_options": [{"validation": 2}, {"validation": "/data/../etc"},
                              {"class_weight": {"a": 1}}, {"sample_weight_col": "a;b"},
                              {"no_such_option": 1}, "shuffle"],
        }
        for field, values in cases.items():
            for value in values:
                status, answer = _raw(url, "/api/submit", secret, {**good, field: value})
                assert status == 400, (field, value, answer)
                assert answer["error"]
        # Optimizer, loss and metric configs that Keras cannot rebuild (nothing is imported
        # from them): refused now, naming the field, rather than failing in the job.
        system = {"module": "os", "class_name": "function", "config": "system",
                  "registered_name": None}
        for field, value in [("loss", system), ("worker_optimizer", system),
                             ("metrics", ["accuracy", system]), ("loss", 5),
                             ("worker_optimizer", {"class_name": "Adamm", "config": {}}),
                             ("loss", {"out": {"class_name": "Nope", "config": {}}})]:
            trainer = {"class_name": "ADAG", "config": {**config, field: value}}
            status, answer = _raw(url, "/api/submit", secret, {**good, "trainer": trainer})
            assert status == 400 and f"'{field}'" in answer["error"], (field, value, answer)
        # The model: missing, or not an archive; no server path in the answer.
        status, answer = _raw(url, "/api/submit", secret, {**good, "model": None})
        assert status == 400 and "'model' is required" in answer["error"]
        for model in (base64.b64encode(b"hello").decode(),
                      base64.b64encode(b"PK\x03\x04garbage").decode()):
            status, answer = _raw(url, "/api/submit", secret, {**good, "model": model})
            assert status == 400 and "/tmp" not in answer["error"], answer
        status, answer = _raw(url, "/api/submit", secret, {**good, "trainer": ensemble})
        assert status == 400 and "several models" in answer["error"]
        # Unknown endpoints and methods answer JSON as the others do.
        status, answer = _raw(url, "/api/nothing", secret)
        assert status == 404 and "/api/submit" in answer["error"]
        status, answer = _raw(url, "/api/submit", secret)  # GET
        assert status == 405 and "POST" in answer["error"]

        lambda_model = keras.Sequential([keras.Input((784,)), keras.layers.Lambda(lambda x: x),
                                         keras.layers.Dense(10, activation="softmax")])
        tampered = {**good, "model": base64.b64encode(serialize_model(lambda_model)).decode()}
        status, answer = _raw(url, "/api/submit", secret, tampered)
        assert status == 400 and "refused" in answer["error"]
        assert "never runs" in answer["error"] and "safe_mode=False" not in answer["error"]
        assert _raw(url, "/api/submit", secret, data=b"{not json")[0] == 400
        assert _upload_status(url, secret, b"x" * (5 << 20)) == 413
        assert not os.path.exists("/tmp/pwned")
        assert running.punchcard.store.by_state(*("queued", "running", "finished")) == []

        # A job name that is merely unusual is fine, and the busy secret is refused.
        assert _raw(url, "/api/submit", secret, good)[0] == 200
        status, answer = _raw(url, "/api/submit", secret, good)
        assert status == 403 and "already has a job" in answer["error"]
        assert "job.destroy()" in answer["error"]
        # Another secret sees nothing of this job.
        assert _raw(url, "/api/state", secrets[1][4])[0] == 404
        assert _raw(url, "/api/destroy", secret)[0] == 409  # still running
        status, answer = _raw(url, "/api/result", secret)
        assert status == 409 and "only a finished job has a trained model" in answer["error"]
        assert _raw(url, "/api/cancel", secret)[0] == 200
        assert _raw(url, "/api/state", secret)[1]["state"] == "cancelled"
    finally:
        running.stop()
        for job in running.punchcard.store.by_state("queued", "running"):
            running.punchcard.cancel(job)


def test_twenty_concurrent_clients_then_cancel_mid_training(server, secrets, data_path):
    payloads = [Job(secret, f"job{index}", data_path, 1, 2, _trainer()).payload()
                for index, secret in enumerate(secrets[1][:20])]
    # Each model is checked in a child process of its own, two at a time: minutes for 20,
    # in which the first job would run to its end. None starts until all are in.
    server.punchcard.max_running = 0
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda args: _raw(server.url, "/api/submit", *args,
                                                  timeout=600),
                                zip(secrets[1][:20], payloads)))
    assert [status for status, _ in answers] == [200] * 20
    states = [_raw(server.url, "/api/state", secret)[1]["state"] for secret in secrets[1][:20]]
    assert set(states) <= {"queued", "running"} and states.count("running") <= 1
    server.punchcard.max_running = 1

    # The one that runs: wait until it trains, cancel it, and its whole process tree is gone.
    store = server.punchcard.store
    assert _wait_for(lambda: any(job["pid"] for job in store.by_state("running")))
    job = store.by_state("running")[0]
    secret = secrets[1][[p["job_name"] for p in payloads].index(job["name"])]
    assert _wait_for(lambda: read_status(job) not in (None, {})
                     and read_status(job)["state"] == "training", timeout=120)
    started = time.monotonic()
    status, answer = _raw(server.url, "/api/cancel", secret)
    assert status == 200 and answer["state"] == "cancelled"
    assert time.monotonic() - started < 8  # not 10 s spent polling an unreaped zombie
    assert not _group_alive(job["pid"])
    client = Job(secret, job["name"], data_path, 1, 2, _trainer())
    client.url = server.url
    with pytest.raises(JobError, match="cancelled"):
        client.wait_completion(timeout=10, poll_interval=0.1)


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
    job = Job(secret, "unrecorded", data_path, 1, 2, _trainer())
    job.send(first.url)
    assert _wait_for(lambda: hasattr(first.punchcard, "launched"))
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
        assert not _group_alive(process.pid)
    finally:
        second.stop()
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait(timeout=30)


def test_restart_mid_job_loses_nothing(secrets, tmp_path, data_path, fashion_test):
    work = str(tmp_path / "work")
    first = RunningServer(secrets[0], work)
    secret, doomed = secrets[1][5], secrets[1][6]
    job = Job(secret, "survivor", data_path, 1, 2, _trainer())
    job.send(first.url)
    store = first.punchcard.store
    assert _wait_for(lambda: any(row["pid"] for row in store.by_state("running")))
    first.stop()  # the server goes away; the job's process keeps going

    second = RunningServer(secrets[0], work, max_running=2)
    try:
        job.url = second.url
        assert job.get_state()["state"] in ("running", "finished")
        job.wait_completion(timeout=300, poll_interval=0.5)
        assert accuracy(job.get_trained_model(), fashion_test) > 0.6

        # A job whose process dies while no server watches is reported failed, not running.
        lost = Job(doomed, "lost", data_path, 1, 1, _trainer())
        lost.send(second.url)
        assert _wait_for(lambda: any(row["pid"] and row["name"] == "lost"
                                     for row in second.punchcard.store.by_state("running")))
        row = [r for r in second.punchcard.store.by_state("running") if r["name"] == "lost"][0]
        second.stop()
        os.killpg(row["pid"], 9)
        # This test process started the job, so it reaps it (a restarted server would not be
        # its parent; the kill alone would do).
        second.punchcard._processes[row["id"]].wait(timeout=30)
        assert _wait_for(lambda: not _group_alive(row["pid"]), timeout=30)
        third = RunningServer(secrets[0], work)
        lost.url = third.url
        state = lost.get_state()
        assert state["state"] == "failed"
        assert state["error"].startswith("the job's process ended without a result")
        third.stop()
    finally:
        second.server.close()


def test_allowed_data_roots_refuse_glob_patterns(secrets, tmp_path, data_path):
    root = os.path.dirname(data_path)
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0,
                            allowed_data_roots=[root])
    try:
        secret = secrets[1][7]
        good = Job(secret, "rooted", data_path, 1, 1, _trainer()).payload()
        # Each names a literal path under the root, but Spark's glob expansion (or its
        # comma-separated list) would read outside it.
        escapes = [f"{root}/{{../secrets.json,zz}}", f"{root}/[.][.]/x", f"{root}/*.parquet",
                   f"{root}/x?", f"{root}/x,/etc/passwd", f"{root}/\\.\\./x"]
        for path in escapes:
            status, answer = _raw(running.url, "/api/submit", secret, {**good, "data_path": path})
            assert status == 400 and "glob" in answer["error"], (path, answer)
            status, answer = _raw(running.url, "/api/submit", secret,
                                  {**good, "train_options": {"validation": path}})
            assert status == 400 and "train_options.validation" in answer["error"], answer
        assert running.punchcard.store.by_state("queued") == []
        assert _raw(running.url, "/api/submit", secret, good)[0] == 200
    finally:
        running.stop()
    # A Hadoop URL under its root is still fine.
    assert check_data_path("hdfs://nn/data/x.parquet", ["hdfs://nn/data"]) == \
        "hdfs://nn/data/x.parquet"


def test_allowed_data_roots_refuse_links_that_lead_out_of_them(secrets, tmp_path, data_path):
    # The data itself, outside the root; a real Parquet folder inside it.
    root, outside = tmp_path / "root", tmp_path / "outside"
    shutil.copytree(data_path, outside / "fashion.parquet")
    shutil.copytree(data_path, root / "fashion.parquet")
    (root / "escape.parquet").symlink_to(outside / "fashion.parquet")
    mixed = root / "mixed.parquet"
    shutil.copytree(data_path, mixed)
    part = sorted(name for name in os.listdir(mixed) if name.startswith("part-"))[0]
    os.remove(mixed / part)
    (mixed / part).symlink_to(outside / "fashion.parquet" / part)
    nested = root / "nested.parquet"
    shutil.copytree(data_path, nested / "year=2026")
    (nested / "year=2025").symlink_to(outside / "fashion.parquet")
    # Links that stay inside the root, and a cycle, are fine.
    (root / "alias.parquet").symlink_to(root / "fashion.parquet")
    (root / "fashion.parquet" / "loop").symlink_to(root / "fashion.parquet")
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0,
                            allowed_data_roots=[str(root)])
    try:
        secret = secrets[1][8]
        good = Job(secret, "linked", str(root / "alias.parquet"), 1, 1, _trainer()).payload()
        for path in [root / "escape.parquet", mixed, nested]:
            status, answer = _raw(running.url, "/api/submit", secret,
                                  {**good, "data_path": str(path)})
            assert status == 400 and "outside the allowed data roots" in answer["error"], \
                (path, answer)
            assert str(outside) not in answer["error"]  # where the link leads is not said
            status, answer = _raw(running.url, "/api/submit", secret,
                                  {**good, "train_options": {"validation": str(path)}})
            assert status == 400 and "train_options.validation" in answer["error"], answer
        assert running.punchcard.store.by_state("queued") == []
        assert _raw(running.url, "/api/submit", secret, good)[0] == 200
        # The job's files are private to the server's user (umask aside).
        job_dir = running.punchcard.store.by_state("queued")[0]["job_dir"]
        for folder in [running.punchcard.work_dir, os.path.dirname(job_dir), job_dir]:
            assert os.stat(folder).st_mode & 0o777 == 0o700, folder
    finally:
        running.stop()
    # A root that is itself a link is resolved the same way as the paths under it.
    (tmp_path / "root-link").symlink_to(root)
    assert check_data_path(f"{tmp_path}/root-link/fashion.parquet",
                            [f"{tmp_path}/root-link"]) == f"{tmp_path}/root-link/fashion.parquet"
    with pytest.raises(BadRequest, match="outside the allowed data roots"):
        check_data_path(f"{tmp_path}/root-link/escape.parquet", [f"{tmp_path}/root-link"])
    with pytest.raises(BadRequest, match="outside the allowed data roots"):
        check_data_path(f"file://{root}/escape.parquet", [f"file://{root}"])


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_oversized_body_is_refused_before_it_is_read(secrets, tmp_path):
    # The server as users start it: scripts/punchcard.py, in its own process.
    port = _free_port()
    script = os.path.join(SCRIPTS, "punchcard.py")
    server = subprocess.Popen([sys.executable, script, "--secrets", secrets[0], "--host",
                               "127.0.0.1", "--port", str(port), "--max-request-mb", "1",
                               "--work-dir", str(tmp_path / "work")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        assert _wait_for(lambda: _reachable(url), timeout=60)
        with socket.create_connection(("127.0.0.1", port), timeout=10) as client:
            client.sendall(f"POST /api/submit HTTP/1.1\r\nHost: x\r\n{SECRET_HEADER}: "
                           f"{secrets[1][8]}\r\nContent-Type: application/json\r\n"
                           f"Content-Length: {300 << 20}\r\n\r\n".encode() + b"x" * 4096)
            # Only 4 KiB of the announced 300 MiB were sent: the answer comes anyway.
            client.settimeout(5)
            answer = client.recv(200)
        assert answer.startswith(b"HTTP/1.1 413"), answer
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_a_port_in_use_is_one_line(secrets, tmp_path):
    # scripts/punchcard.py on a port another server holds: a one-line error, not a trace.
    script = os.path.join(SCRIPTS, "punchcard.py")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        result = subprocess.run(
            [sys.executable, script, "--secrets", secrets[0], "--host", "127.0.0.1",
             "--port", str(taken.getsockname()[1]), "--work-dir", str(tmp_path / "work")],
            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        "punchcard: error: cannot listen on 127.0.0.1:")
    # Started without --allowed-data-root, it said what that exposes (and on loopback,
    # nothing about plain HTTP).
    assert "No --allowed-data-root" in result.stderr, result.stderr
    assert "plain HTTP" not in result.stderr, result.stderr


def test_exposure_warnings_name_what_the_settings_open():
    from distkeras.punchcard.commands import exposure_warnings

    assert exposure_warnings("127.0.0.1", ["/data"]) == []
    (confined,) = exposure_warnings("127.0.0.1", [], allow_any_data_path=False)
    assert "local paths are refused" in confined
    (open_host,) = exposure_warnings("0.0.0.0", ["/data"])
    assert "0.0.0.0 over plain HTTP" in open_host and "TLS" in open_host
    assert len(exposure_warnings("0.0.0.0", [])) == 2


def _reachable(url):
    try:
        return _raw(url, "/api/state", "not-a-secret")[0] == 403
    except urllib.error.URLError:
        return False


def test_failed_or_cancelled_job_is_cleared_with_destroy(secrets, tmp_path, data_path):
    # max_running=0: jobs stay queued, so no Spark is needed here.
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0)
    try:
        secret = secrets[1][9]
        job = Job(secret, "first", data_path, 1, 1, _trainer())
        job.send(running.url)
        with pytest.raises(JobError, match=r"already has a job \('first', queued\).*"
                                           r"job\.destroy\(\)"):
            Job(secret, "second", data_path, 1, 1, _trainer()).send(running.url)
        job.cancel()
        with pytest.raises(JobError, match=r"cancelled.*call job\.destroy\(\)"):
            job.wait_completion(timeout=10, poll_interval=0.1)
        assert job.get_state()["state"] == "cancelled"  # still there, until destroyed
        assert job.destroy() == {"state": "cancelled", "error": "cancelled by the client"}
        with pytest.raises(JobError, match="404"):
            job.get_state()
        Job(secret, "second", data_path, 1, 1, _trainer()).send(running.url)
    finally:
        running.stop()


def test_a_failed_jobs_error_reads_as_one_sentence(secrets, tmp_path, data_path):
    # The job's own error ends with a period (ValueError's messages do): not "..".
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0)
    try:
        secret = secrets[1][14]
        job = Job(secret, "fails", data_path, 1, 1, _trainer())
        job.send(running.url)
        row = running.punchcard.store.by_secret(secret_hash(secret))
        running.punchcard.store.finish(row["id"], "failed", "ValueError: Column 5 is wrong.")
        with pytest.raises(JobError) as raised:
            job.wait_completion(timeout=10, poll_interval=0.1)
        assert "Column 5 is wrong. It keeps this secret busy" in str(raised.value)
    finally:
        running.stop()


def test_wait_completion_rides_out_a_restart_and_reattaches(secrets, tmp_path, data_path):
    work, secret = str(tmp_path / "work"), secrets[1][10]
    first = RunningServer(secrets[0], work, max_running=0)
    job = Job(secret, "patient", data_path, 1, 1, _trainer())
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
        other = Job(secret, "patient", data_path, 1, 1, _trainer())
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


def test_cancel_returns_once_the_process_group_is_gone():
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    started = time.monotonic()
    kill_tree(process.pid, process)
    # The dead leader is reaped while waiting: no 10 s spent polling a zombie.
    assert time.monotonic() - started < 3
    assert process.returncode is not None and not _group_alive(process.pid)


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
        job = Job(secrets[1][11], "crash", data_path, 1, 1, _trainer())
        job.send(running.url)
        assert _wait_for(lambda: job.get_state()["state"] == "failed", timeout=30)
        assert job.get_state()["error"] == ("the job's process ended (exit code 3) without a "
                                            "result: 26/11/30 ERROR Executor: lost executor 1")
    finally:
        running.stop()


@pytest.mark.parametrize("content", ['{"secret": "x", "identity": "a"}', "not json", "[1]"])
def test_generate_secret_refuses_a_malformed_secrets_file(tmp_path, content):
    path = tmp_path / "secrets.json"
    path.write_text(content)
    script = os.path.join(SCRIPTS, "generate_secret.py")
    result = subprocess.run([sys.executable, script, "--identity", "me", "--append", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("generate_secret: error: Secrets file")
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert result.stdout == ""  # no secret printed that was not stored
    assert path.read_text() == content


def test_a_compiled_model_lends_its_settings_to_a_job():
    # README: `ADAG(keras_model=compiled_model, num_workers=4)` trains with what its fit
    # would use; a job of that trainer must be accepted, and its model come back compiled.
    import keras

    from distkeras.job_deployment import validate_submission
    from distkeras.trainers import ADAG
    from distkeras.utils import serialize_model

    model = build_mlp(hidden=8)
    model.compile(keras.optimizers.SGD(0.05), "categorical_crossentropy", metrics=["accuracy"])
    job = Job("secret", "compiled", "/data/fashion.parquet", 1, 2,
              ADAG(keras_model=model, num_workers=2))
    _, _, config, _ = validate_submission(job.payload())
    assert config["worker_optimizer"]["class_name"] == "SGD"
    assert config["loss"] == "categorical_crossentropy" and config["metrics"] == ["accuracy"]

    attached = Job("secret", "compiled", "/data/fashion.parquet", 1, 2,
                   ADAG(keras_model=model, num_workers=2))  # attach(): no payload() sent
    attached.model_bytes = serialize_model(build_mlp(hidden=8))
    trained = attached.get_trained_model()
    assert isinstance(trained.optimizer, keras.optimizers.SGD)
    assert trained.loss == "categorical_crossentropy"


def test_a_job_of_a_model_compiled_without_a_loss_is_accepted():
    # A model whose loss is its own (add_loss), compiled with loss=None, trains in the
    # job's process (which loads it compiled) with or without label_col; the server's
    # checks read the model as that process does, not as uncompiled ("`loss` is required").
    import keras

    from distkeras.job_deployment import BadRequest, validate_submission
    from distkeras.trainers import ADAG

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.ActivityRegularization(l2=0.1)(
        keras.layers.Dense(4)(inputs)))
    model.compile("adam", loss=None)
    for label_col in (None, "features"):
        job = Job("secret", "own_loss", "/data/x.parquet", 1, 2,
                  ADAG(keras_model=model, num_workers=2, label_col=label_col))
        _, _, config, _ = validate_submission(job.payload())
        assert config["label_col"] == label_col and config["loss"] is None
    job = Job("secret", "own_loss", "/data/x.parquet", 1, 2,
              ADAG(keras_model=model, num_workers=2, loss="mse", label_col=None))
    with pytest.raises(BadRequest, match="label_col=None trains without targets"):
        validate_submission(job.payload())


def test_a_fetched_model_keeps_its_optimizer_state_and_attach_needs_no_trainer():
    # The server's archive holds the trained optimizer's state (SingleTrainer's, as after
    # fit); a job followed with trainer=None (`Job(secret, ...); job.attach(url)`) still
    # gets its model.
    import keras
    import numpy as np

    from distkeras.trainers import SingleTrainer
    from distkeras.utils import serialize_model

    trained = build_mlp(hidden=8)
    trained.compile("adam", "sparse_categorical_crossentropy", metrics=["accuracy"])
    rng = np.random.default_rng(0)
    trained.fit(rng.random((64, 784), dtype=np.float32), rng.integers(0, 10, 64),
                batch_size=16, epochs=2, verbose=0)
    archive = serialize_model(trained)
    expected = [np.array(variable.value) for variable in trained.optimizer.variables]

    job = Job("secret", "single", "/data/fashion.parquet", 1, 1,
              SingleTrainer(keras_model=build_mlp(hidden=8), worker_optimizer="adam",
                            loss="sparse_categorical_crossentropy"))
    attached = Job("secret", "single", None, 1, 1, None)
    for follower in (job, attached):
        follower.model_bytes = archive
        model = follower.get_trained_model()
        assert isinstance(model.optimizer, keras.optimizers.Adam)
        assert int(model.optimizer.iterations.numpy()) == 8
        for variable, value in zip(model.optimizer.variables, expected):
            np.testing.assert_allclose(np.array(variable.value), value)
    with pytest.raises(JobError, match="no trainer to send"):
        attached.payload()


def test_the_number_of_workers_is_bounded_as_a_whole():
    from distkeras.job_deployment import MAX_WORKERS, BadRequest, validate_submission

    payload = Job("secret", "wide", "/data/fashion.parquet", 2, 2, _trainer()).payload()
    assert validate_submission(payload)[2]["num_workers"] == 4
    # Each count within bounds, their product (the job's partitions and tasks) far beyond.
    with pytest.raises(BadRequest, match=r"at most 1024. Received: 1024 x 1024 = 1048576"):
        validate_submission({**payload, "num_executors": MAX_WORKERS,
                             "num_processes": MAX_WORKERS})


def test_a_job_larger_than_the_server_accepts_says_so(secrets, tmp_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_request_bytes=1 << 20)
    try:
        job = Job(secrets[1][12], "large", "/data/fashion.parquet", 1, 2,
                  _trainer(keras_model=build_mlp(hidden=1000)))  # a 4 MB submission
        # waitress closes the connection while the body is sent: not "cannot reach".
        with pytest.raises(JobError, match="larger than") as raised:
            job.send(running.url)
        assert not isinstance(raised.value, ServerUnreachable)
        assert running.punchcard.store.by_state("queued", "running") == []
    finally:
        running.stop()


def test_a_model_archive_that_unpacks_to_far_more_than_it_holds_is_refused(secrets, tmp_path):
    """A .keras archive whose config.json deflates 200 MiB (still valid JSON: trailing
    spaces) into 200 KiB: Keras would read all of it into the server's memory as it loads
    the model, and queued the job; it is refused from the archive's directory."""
    payload = Job(secrets[1][13], "bomb", "/data/fashion.parquet", 1, 1, _trainer()).payload()
    bomb = _deflated_config(payload, 200 << 20)
    assert len(bomb) < 4 << 20
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_request_bytes=8 << 20,
                            max_running=0)  # nothing starts, should a job be queued
    try:
        status, answer = _raw(running.url, "/api/submit", secrets[1][13],
                              {**payload, "model": base64.b64encode(bomb).decode()})
        assert status == 400, answer
        assert "declare" in answer["error"] and "keras.saving.save_model" in answer["error"]
        assert running.punchcard.store.by_state("queued", "running") == []
    finally:
        running.stop()


def _deflated_config(payload, padding):
    """The payload's archive with ``padding`` spaces after its config.json, deflated."""
    import io
    import zipfile

    original = zipfile.ZipFile(io.BytesIO(base64.b64decode(payload["model"])))
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        for info in original.infolist():
            content = original.read(info.filename)
            if info.filename == "config.json":
                content += b" " * padding
            archive.writestr(info.filename, content)
    return bomb.getvalue()


def _with_config(model_bytes, edit):
    """``model_bytes`` with its config.json passed through ``edit`` (the weights as they
    were)."""
    import io
    import zipfile

    original = zipfile.ZipFile(io.BytesIO(model_bytes))
    edited = io.BytesIO()
    with zipfile.ZipFile(edited, "w") as archive:
        for info in original.infolist():
            content = original.read(info.filename)
            if info.filename == "config.json":
                content = json.dumps(edit(json.loads(content))).encode()
            archive.writestr(info.filename, content)
    return edited.getvalue()


def _widened(config, units=200_000):
    """The MLP's config with every Dense of ``units`` (and no build shapes to disagree)."""
    for layer in config["config"]["layers"]:
        if layer["class_name"] == "Dense":
            layer["config"]["units"] = units
            layer.pop("build_config", None)
    return config


def test_a_model_declaring_more_weights_than_its_archive_holds_is_refused_unbuilt(secrets,
                                                                                 tmp_path):
    """A valid secret's archive of a few kilobytes whose config declares Dense(200000)
    after Dense(200000): the server built it to validate it, allocating 160 GB of weights
    in its own process. It is refused, by count, before any weight exists."""
    payload = Job(secrets[1][14], "huge", "/data/fashion.parquet", 1, 1, _trainer()).payload()
    huge = _with_config(base64.b64decode(payload["model"]), _widened)
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0)
    try:
        status, answer = _raw(running.url, "/api/submit", secrets[1][14],
                              {**payload, "model": base64.b64encode(huge).decode()})
        assert status == 400, answer
        assert "declares 40157200000 weight values (160628800000 bytes)" in answer["error"]
        assert "67108864 bytes of weights at most" in answer["error"]  # the limit
        assert running.punchcard.store.by_state("queued", "running") == []
        assert not os.path.exists(os.path.join(running.punchcard.work_dir, "jobs"))
        assert _raw(running.url, "/api/submit", secrets[1][14], payload)[0] == 200
    finally:
        running.stop()


def test_counting_declared_weights_leaves_no_variable_to_initialize():
    """The count builds the model in a stateless scope, whose variables Keras initializes
    when a later scope of the same thread ends: the 40 billion must never be."""
    import keras
    from keras.src.backend.common import global_state

    from distkeras.job_deployment import BadRequest, validate_submission

    payload = Job("secret", "huge", "/data/fashion.parquet", 1, 1, _trainer()).payload()
    huge = _with_config(base64.b64decode(payload["model"]), _widened)
    with pytest.raises(BadRequest, match="declares 40157200000 weight values"):
        validate_submission({**payload, "model": base64.b64encode(huge).decode()})
    assert not global_state.get_global_attribute("uninitialized_variables")
    with keras.StatelessScope():
        pass  # would initialize what the count left behind


def test_legitimate_models_pass_the_weight_count():
    import keras

    from distkeras.job_deployment import validate_submission
    from distkeras.utils import declared_weight_bytes, serialize_model

    inputs = keras.Input((28, 28, 1))
    hidden = keras.layers.Conv2D(16, 3, activation="relu")(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    hidden = keras.layers.MaxPooling2D()(hidden)
    hidden = keras.layers.Dropout(0.25)(keras.layers.Flatten()(hidden))
    cnn = keras.Model(inputs, keras.layers.Dense(10, activation="softmax")(hidden))
    text = keras.Sequential([keras.Input((20,), dtype="int32"), keras.layers.Embedding(500, 8),
                             keras.layers.LSTM(4), keras.layers.Dense(10)])
    for model in (build_mlp(), cnn, text):
        assert declared_weight_bytes(serialize_model(model)) == (
            model.count_params(), sum(weight.numpy().nbytes for weight in model.weights))
        validate_submission(Job("secret", "ok", "/data/fashion.parquet", 1, 2,
                                _trainer(keras_model=model)).payload())


def test_an_unknown_custom_layer_is_named_in_a_few_words():
    import keras

    from distkeras.job_deployment import BadRequest, validate_submission

    class Doubling(keras.layers.Layer):  # not registered, and never installed on a server
        def call(self, inputs):
            return inputs * 2

    model = keras.Sequential([keras.Input((784,)), Doubling(),
                              keras.layers.Dense(10, activation="softmax")])
    payload = Job("secret", "custom", "/data/fashion.parquet", 1, 2,
                  _trainer(keras_model=model)).payload()
    with pytest.raises(BadRequest) as refused:
        validate_submission(payload)
    message = str(refused.value)
    assert "the class 'Doubling', which this server does not know" in message
    assert "installed on the server" in message
    assert len(message) < 600 and "config" not in message  # not the model's whole config


@pytest.mark.parametrize("digest", ["é" * 64, "z" * 64, "ab" * 31])
def test_a_hashed_secret_that_is_no_sha256_digest_is_refused_at_load(tmp_path, digest):
    """It would have made every request fail; the server refuses to start instead."""
    from distkeras.punchcard.secrets_file import load_secrets

    path = tmp_path / "secrets.json"
    path.write_text(json.dumps([{"secret_sha256": digest, "identity": "a"}]))
    with pytest.raises(ValueError, match="entry 0: 'secret_sha256' must be 64 hex digits"):
        load_secrets(str(path))
    good = secret_hash("s3cret").upper()  # upper case digits are fine
    path.write_text(json.dumps([{"secret_sha256": good, "identity": "a"}]))
    assert load_secrets(str(path)) == [(good.lower(), "a")]


def test_a_cluster_job_asks_spark_for_the_executors_it_was_given(secrets, tmp_path):
    # No job starts (max_running=0): only the command the job would run matters here.
    punchcard = Punchcard(secrets[0], str(tmp_path / "work"), master="yarn", max_running=0)
    try:
        secret = secrets[1][12]
        body = Job(secret, "sized", "hdfs:///data/fashion.parquet", 3, 2, _trainer()).payload()
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


def test_json_nested_too_deeply_is_a_bad_request(server, secrets):
    # Python's decoder raises RecursionError, which Flask's silent get_json lets through.
    status, answer = _raw(server.url, "/api/submit", secrets[1][13], data=b"[" * 100000)
    assert status == 400 and answer["error"] == "The request body is JSON nested too deeply."


class _SlowReadPunchcard(Punchcard):
    """Holds every request 0.3 s between reading its job and acting on it: the window in
    which a second client's request changes the job."""

    def job_of(self, secret_hash):
        job = super().job_of(secret_hash)
        time.sleep(0.3)
        return job


def _finished_job(running, secret, data_path):
    """A job submitted, then marked finished with its result files written (no Spark)."""
    Job(secret, "done", data_path, 1, 1, _trainer()).send(running.url)
    row = running.punchcard.store.by_secret(secret_hash(secret))
    running.punchcard.store.finish(row["id"], "finished", only_if_state="queued")
    with open(os.path.join(row["job_dir"], "trained.keras"), "wb") as handle:
        handle.write(b"model")
    with open(os.path.join(row["job_dir"], "history.json"), "w", encoding="utf-8") as handle:
        json.dump([{"loss": 1.0}], handle)
    return row


def _staggered(count, call):
    """``call()`` from ``count`` threads, each started 0.1 s after the one before."""
    with ThreadPoolExecutor(count) as pool:
        futures = []
        for _ in range(count):
            futures.append(pool.submit(call))
            time.sleep(0.1)
        return [future.result() for future in futures]


def test_concurrent_destroys_of_a_finished_job_give_it_to_one(secrets, tmp_path, data_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0,
                            punchcard_class=_SlowReadPunchcard)
    try:
        secret = secrets[1][20]
        _finished_job(running, secret, data_path)
        # The results can be read as often as asked, until the job is destroyed.
        for _ in range(2):
            status, body = _raw(running.url, "/api/result", secret)
            assert status == 200 and body["history"] == [{"loss": 1.0}]
            assert base64.b64decode(body["model"]) == b"model"
        answers = _staggered(3, lambda: _raw(running.url, "/api/destroy", secret))
        assert sorted(status for status, _ in answers) == [200, 404, 404]
        assert all("another request destroyed it" in body["error"]
                   for status, body in answers if status == 404)
        # As DESIGN.md has it, the destroy's answer holds the results too.
        assert [body["history"] for status, body in answers if status == 200] == \
            [[{"loss": 1.0}]]
        assert _raw(running.url, "/api/result", secret)[0] == 404
    finally:
        running.stop()


def test_the_client_fetches_the_results_before_it_destroys_the_job(secrets, tmp_path,
                                                                    data_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0)
    try:
        secret = secrets[1][23]
        _finished_job(running, secret, data_path)
        job = Job(secret, "done", data_path, 1, 1, None)
        assert job.attach(running.url)["state"] == "finished"
        assert job.destroy() == {"state": "finished", "error": None}
        assert job.model_bytes == b"model" and job.get_history() == [{"loss": 1.0}]
        assert running.punchcard.store.by_secret(secret_hash(secret)) is None
        # A job that did not finish has no results to fetch: destroyed all the same.
        Job(secret, "queued", data_path, 1, 1, _trainer()).send(running.url)
        cancelled = Job(secret, "queued", data_path, 1, 1, None)
        cancelled.attach(running.url)
        cancelled.cancel()
        assert cancelled.destroy()["state"] == "cancelled"
        assert cancelled.model_bytes is None
        status, answer = _raw(running.url, "/api/result", secret)
        assert status == 404 and answer["error"] == "This secret has no job."
    finally:
        running.stop()


def test_the_second_of_two_cancels_says_the_job_is_cancelled(secrets, tmp_path, data_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0,
                            punchcard_class=_SlowReadPunchcard)
    try:
        secret = secrets[1][21]
        Job(secret, "queued", data_path, 1, 1, _trainer()).send(running.url)
        answers = _staggered(2, lambda: _raw(running.url, "/api/cancel", secret))
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
        Job(secret, "queued", data_path, 1, 1, _trainer()).send(running.url)
        with ThreadPoolExecutor(2) as pool:
            cancel = pool.submit(_raw, running.url, "/api/cancel", secret)
            time.sleep(0.1)
            destroy = pool.submit(_raw, running.url, "/api/destroy", secret)
            assert destroy.result()[0] == 200
            status, body = cancel.result()
        assert status == 404 and "another request destroyed it" in body["error"]
    finally:
        running.stop()


class _SlowCheckPunchcard(Punchcard):
    """Takes 1 s to check each submission, as a model of hundreds of layers takes longer;
    counts the checks."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.checks = 0

    def _queue(self, secret_hash, identity, body):
        self.checks += 1
        time.sleep(1.0)
        return super()._queue(secret_hash, identity, body)


def test_one_secret_has_one_submission_checked_at_a_time(secrets, tmp_path, data_path):
    """Checking a submission builds its model in a request thread: one client sending the
    same slow model many times at once held that many of the server's threads; and a
    secret that already had a job had each submission checked before being refused."""
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0,
                            punchcard_class=_SlowCheckPunchcard)
    try:
        secret, other = secrets[1][21], secrets[1][22]
        payload = Job(secret, "slow", data_path, 1, 1, _trainer()).payload()
        answers = _staggered(3, lambda: _raw(running.url, "/api/submit", secret, payload))
        assert sorted(status for status, _ in answers) == [200, 403, 403], answers
        assert all("still being checked" in body["error"]
                   for status, body in answers if status == 403)
        assert running.punchcard.checks == 1
        # Another secret is not held up by the first one's checks.
        assert _raw(running.url, "/api/submit", other, payload)[0] == 200
        assert running.punchcard.checks == 2
        # A secret that has its job is refused before any check of the new submission.
        status, answer = _raw(running.url, "/api/submit", secret, payload)
        assert status == 403 and "already has a job" in answer["error"]
        assert running.punchcard.checks == 2
        # Once a check failed, the same secret may submit again.
        third = secrets[1][23]
        assert _raw(running.url, "/api/submit", third, {**payload, "model": None})[0] == 400
        assert _raw(running.url, "/api/submit", third, payload)[0] == 200
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
        Job(secret, "starting", str(tmp_path), 1, 1, _trainer()).send(running.url)
        store = running.punchcard.store
        assert _wait_for(lambda: store.by_secret(secret_hash(secret))["state"] == "running",
                         timeout=10, interval=0.02)
        assert _raw(running.url, "/api/cancel", secret)[0] == 200
        processes = running.punchcard._processes
        assert _wait_for(lambda: processes, timeout=10, interval=0.02)
        process = next(iter(processes.values()))
        assert _raw(running.url, "/api/destroy", secret)[0] == 200
        assert _wait_for(lambda: process.poll() is not None, timeout=15)
        assert not processes
    finally:
        running.stop()
        if process is not None and process.poll() is None:
            kill_tree(process.pid, process)


@pytest.mark.parametrize("field", ["loss", "metrics"])
def test_a_trainer_config_nested_too_deeply_is_a_bad_request(server, secrets, tmp_path, field):
    """Parsed, the body was fine; the checks of its loss and metrics recurse into them, and
    ran out of stack: a 500 saying the server failed, for the client's mistake."""
    secret = secrets[1][4]
    payload = Job(secret, "deep", str(tmp_path), 1, 1, _trainer()).payload()
    payload["trainer"]["config"][field] = json.loads("[" * 900 + "]" * 900)
    status, answer = _raw(server.url, "/api/submit", secret, payload)
    assert status == 400 and answer["error"] == "The request body is JSON nested too deeply."
    assert server.punchcard.store.by_secret(secret_hash(secret)) is None
    assert not os.path.exists(os.path.join(server.punchcard.work_dir, "jobs"))


def test_a_json_body_without_its_content_type_is_told_so(server, secrets):
    """`curl -d @job.json` sends JSON as a form: the answer said the body was not JSON."""
    request = urllib.request.Request(
        server.url + "/api/submit", data=b'{"job_name": "x"}', method="POST",
        headers={SECRET_HEADER: secrets[1][5],
                 "Content-Type": "application/x-www-form-urlencoded"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 400
    assert "Content-Type: application/json" in json.loads(refused.value.read())["error"]


def test_a_restart_stops_the_process_of_a_job_cancelled_just_before(secrets, tmp_path):
    """Cancelling marks the job cancelled, then stops its process: a server stopped between
    the two left the process training on after the restart, for a job nobody follows."""
    work = str(tmp_path / "work")
    running = RunningServer(secrets[0], work, max_running=0)
    secret = secrets[1][6]
    Job(secret, "cancelled", str(tmp_path), 1, 1, _trainer()).send(running.url)
    row = running.punchcard.store.by_secret(secret_hash(secret))
    # The job's process, as the scheduler starts it: its own session, the job id in argv.
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                row["id"]], start_new_session=True)
    try:
        assert _wait_for(lambda: process_alive(process.pid, row["id"]), timeout=10)
        running.punchcard.store.update(row["id"], state="cancelled", pid=process.pid,
                                       error="cancelled by the client")
        running.stop()
        restarted = RunningServer(secrets[0], work, max_running=0)
        try:
            assert _wait_for(lambda: process.poll() is not None, timeout=15)
            assert _raw(restarted.url, "/api/state", secret)[1]["state"] == "cancelled"
        finally:
            restarted.stop()
    finally:
        if process.poll() is None:
            kill_tree(process.pid, process)


def test_a_stale_destroy_after_the_secrets_next_job_was_sent_deletes_nothing(secrets, tmp_path):
    """A destroy that read its job before another request destroyed it, and acts once the
    secret has its next job: it went on to read the deleted job's files (a 500)."""
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0)
    try:
        secret = secrets[1][7]
        _finished_job(running, secret, str(tmp_path))
        stale = running.punchcard.job_of(secret_hash(secret))  # as the destroy read it
        assert _raw(running.url, "/api/destroy", secret)[0] == 200
        Job(secret, "next", str(tmp_path), 1, 1, _trainer()).send(running.url)
        assert running.punchcard.results(stale) is None
        assert running.punchcard.destroy(stale) is False
        assert running.punchcard.store.by_secret(secret_hash(secret))["name"] == "next"
    finally:
        running.stop()
