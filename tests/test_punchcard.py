"""Punchcard over real HTTP on 127.0.0.1, with real jobs on local Spark."""

import base64
import json
import os
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import accuracy, build_mlp

from distkeras.job_deployment import SECRET_HEADER, Job, JobError, Punchcard, create_app
from distkeras.secrets_file import append_entry, generate_secret, make_entry

NUM_SECRETS = 24


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

    def __init__(self, secrets_path, work_dir, max_request_bytes=64 << 20, max_running=1):
        import waitress

        self.punchcard = Punchcard(secrets_path, work_dir, master="local[2]",
                                   max_running=max_running)
        self.server = waitress.create_server(create_app(self.punchcard, max_request_bytes),
                                             host="127.0.0.1", port=0, threads=24)
        self.url = f"http://127.0.0.1:{self.server.effective_port}"
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.close()
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


def _raw(url, path, secret=None, body=None, method=None, data=None):
    headers = {"Content-Type": "application/json"}
    if secret is not None:
        headers[SECRET_HEADER] = secret
    payload = data if data is not None else (None if body is None else json.dumps(body).encode())
    request = urllib.request.Request(url + path, data=payload, headers=headers,
                                     method=method or ("POST" if payload is not None else "GET"))
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


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


def test_seed_session_trains_and_returns_the_model(server, secrets, data_path, fashion_test):
    secret, job_name, num_executors, num_processes = secrets[1][0], "fashion-adag", 1, 2
    trainer = _trainer()
    job = Job(secret, job_name, data_path, num_executors, num_processes, trainer)
    job.send(server.url)
    job.wait_completion(timeout=300, poll_interval=0.5)
    trained_model = job.get_trained_model()
    history = job.get_history()
    assert trained_model.compiled
    assert accuracy(trained_model, fashion_test) > 0.6
    assert sum(record["batch_size"] for record in history) == 2000
    assert {record["worker_id"] for record in history} == {0, 1}  # 1 executor x 2 processes
    # destroy deleted the job: the secret is free again and the job's files are gone
    assert _raw(server.url, "/api/state", secret)[0] == 404
    assert os.listdir(os.path.join(server.punchcard.work_dir, "jobs")) == []


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


def test_refusals(secrets, tmp_path, data_path):
    import keras

    from distkeras.utils import serialize_model

    running = RunningServer(secrets[0], str(tmp_path / "work"), max_request_bytes=4 << 20)
    try:
        url, secret = running.url, secrets[1][3]
        good = Job(secret, "ok", data_path, 1, 1, _trainer()).payload()
        assert _raw(url, "/api/submit", "not-a-secret", good)[0] == 403
        assert _raw(url, "/api/submit", None, good)[0] == 403
        assert _raw(url, "/api/state", "not-a-secret")[0] == 403
        cases = {
            "job_name": ["../../etc/passwd", "a;rm -rf /", "$(touch /tmp/pwned)", "", "x" * 65],
            "data_path": ["/data/../../etc", "/data/x\n--master", 42],
            "num_executors": [0, -1, "2", 10**6, True],
            "model": ["not base64!", base64.b64encode(b"PK\x03\x04garbage").decode()],
            "trainer": [{"class_name": "os.system", "config": {}},
                        {"class_name": "ADAG", "config": {"communication_window": 0}},
                        {"class_name": "ADAG", "config": {"no_such_argument": 1}}, "ADAG",
                        # Valid but for a misspelled name: refused now, not in the job.
                        {"class_name": "ADAG", "config": {**good["trainer"]["config"],
                                                          "loss": "categorical_crossentropyy"}},
                        {"class_name": "ADAG", "config": {**good["trainer"]["config"],
                                                          "worker_optimizer": "adamm"}}],
            "train_options": [{"validation": 2}, {"validation": "/data/../etc"},
                              {"class_weight": {"a": 1}}, {"sample_weight_col": "a;b"},
                              {"no_such_option": 1}, "shuffle"],
        }
        for field, values in cases.items():
            for value in values:
                status, answer = _raw(url, "/api/submit", secret, {**good, field: value})
                assert status == 400, (field, value, answer)
                assert answer["error"]
        lambda_model = keras.Sequential([keras.Input((784,)), keras.layers.Lambda(lambda x: x),
                                         keras.layers.Dense(10, activation="softmax")])
        tampered = {**good, "model": base64.b64encode(serialize_model(lambda_model)).decode()}
        status, answer = _raw(url, "/api/submit", secret, tampered)
        assert status == 400 and "refused" in answer["error"]
        assert _raw(url, "/api/submit", secret, data=b"{not json")[0] == 400
        assert _raw(url, "/api/submit", secret, data=b"x" * (5 << 20))[0] == 413
        assert not os.path.exists("/tmp/pwned")
        assert running.punchcard.store.by_state(*("queued", "running", "finished")) == []

        # A job name that is merely unusual is fine, and the busy secret is refused.
        assert _raw(url, "/api/submit", secret, good)[0] == 200
        status, answer = _raw(url, "/api/submit", secret, good)
        assert status == 403 and "already has a job" in answer["error"]
        # Another secret sees nothing of this job.
        assert _raw(url, "/api/state", secrets[1][4])[0] == 404
        assert _raw(url, "/api/destroy", secret)[0] == 409  # still running
        assert _raw(url, "/api/cancel", secret)[0] == 200
        assert _raw(url, "/api/state", secret)[1]["state"] == "cancelled"
    finally:
        running.stop()
        for job in running.punchcard.store.by_state("queued", "running"):
            running.punchcard.cancel(job)


def test_twenty_concurrent_clients_then_cancel_mid_training(server, secrets, data_path):
    payloads = [Job(secret, f"job{index}", data_path, 1, 2, _trainer()).payload()
                for index, secret in enumerate(secrets[1][:20])]
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda args: _raw(server.url, "/api/submit", *args),
                                zip(secrets[1][:20], payloads)))
    assert [status for status, _ in answers] == [200] * 20
    states = [_raw(server.url, "/api/state", secret)[1]["state"] for secret in secrets[1][:20]]
    assert set(states) <= {"queued", "running"} and states.count("running") <= 1

    # The one that runs: wait until it trains, cancel it, and its whole process tree is gone.
    store = server.punchcard.store
    assert _wait_for(lambda: any(job["pid"] for job in store.by_state("running")))
    job = store.by_state("running")[0]
    secret = secrets[1][[p["job_name"] for p in payloads].index(job["name"])]
    assert _wait_for(lambda: Punchcard._read_status(job) not in (None, {})
                     and Punchcard._read_status(job)["state"] == "training", timeout=120)
    status, answer = _raw(server.url, "/api/cancel", secret)
    assert status == 200 and answer["state"] == "cancelled"
    assert _wait_for(lambda: not _group_alive(job["pid"]), timeout=30)
    client = Job(secret, job["name"], data_path, 1, 2, _trainer())
    client.url = server.url
    with pytest.raises(JobError, match="cancelled"):
        client.wait_completion(timeout=10, poll_interval=0.1)


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
        assert state["state"] == "failed" and "ended without finishing" in state["error"]
        third.stop()
    finally:
        second.server.close()
