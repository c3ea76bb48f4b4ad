"""Punchcard under attack (issue #32): hostile clients against a real server on 127.0.0.1."""

import base64
import json
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest
from punchcard_support import RunningServer, adag_trainer, call_api, deflated_config, with_config

from distkeras.job_deployment import Job
from distkeras.punchcard.client import JobError
from distkeras.punchcard.protocol import SECRET_HEADER
from distkeras.punchcard.model_check import ModelChecker
from distkeras.punchcard.secrets_file import append_entry, generate_secret, make_entry, secret_hash


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("attack-secrets") / "secrets.json")
    values = [generate_secret() for _ in range(8)]
    for index, secret in enumerate(values):
        append_entry(path, make_entry(f"user{index}", secret))
    return path, values


def Server(secrets_path, work_dir, threads=4, **options):
    """A `RunningServer` whose jobs never start (only their submission is under test)."""
    return RunningServer(secrets_path, work_dir, max_running=0, threads=threads, **options)


@pytest.fixture
def server(secrets, tmp_path):
    running = Server(secrets[0], str(tmp_path / "work"))
    yield running
    running.stop()


def _payload(secret="s"):
    return Job(secret, "attack", "/data/fashion.parquet", 1, 1, adag_trainer()).payload()


def _function(module, name):
    return {"module": module, "class_name": "function", "config": name,
            "registered_name": None}


def _lambda_layer(config):
    """The issue's archive: a Lambda of keras.ops.relu whose output_shape is
    keras.distribution.set_distribution, which building the model calls."""
    config["config"]["layers"].insert(1, {
        "module": "keras.layers", "class_name": "Lambda", "registered_name": None,
        "config": {"name": "evil", "trainable": True, "arguments": {},
                   "function": _function("keras.ops", "relu"),
                   "output_shape": _function("keras.distribution", "set_distribution")}})
    return config


def _activation(module, name):
    def edit(config):
        config["config"]["layers"][1]["config"]["activation"] = _function(module, name)
        return config
    return edit


def _archive(payload, edit):
    return base64.b64encode(with_config(base64.b64decode(payload["model"]), edit)).decode()


def _with_metric(payload, metric):
    trainer = json.loads(json.dumps(payload["trainer"]))
    trainer["config"]["metrics"] = ["accuracy", metric]
    return {**payload, "trainer": trainer}


def _hostile_submissions(payload):
    """(what, submission, words the refusal must hold)."""
    auc = {"module": "keras.metrics", "class_name": "AUC", "registered_name": None,
           "config": {"name": "auc", "num_thresholds": 30_000_000}}
    iou = {"module": "keras.metrics", "class_name": "MeanIoU", "registered_name": None,
           "config": {"name": "iou", "num_classes": 100_000}}
    return [
        ("Lambda calling set_distribution",
         {**payload, "model": _archive(payload, _lambda_layer)},
         "Lambda layer"),
        ("activation set_distribution",
         {**payload, "model": _archive(payload, _activation("keras.distribution",
                                                            "set_distribution"))},
         "keras.distribution.set_distribution, which this server does not call"),
        ("activation get_file (a download)",
         {**payload, "model": _archive(payload, _activation("keras.utils", "get_file"))},
         "does not call"),
        ("loss set_epsilon", {**payload, "trainer": {**payload["trainer"], "config": {
            **payload["trainer"]["config"],
            "loss": _function("keras.config", "set_epsilon")}}}, "does not call"),
        ("AUC(num_thresholds=3e7)", _with_metric(payload, auc), "num_thresholds=30000000"),
        ("MeanIoU(num_classes=1e5)", _with_metric(payload, iou), "num_classes=100000"),
        ("60 MB config.json deflated",
         {**payload, "model": base64.b64encode(deflated_config(payload, 60 << 20)).decode()},
         "config.json unpacks to"),
    ]


def test_hostile_configurations_are_refused_before_keras_reads_them(server, secrets):
    """Each was built in a request thread: the Lambda and the activation poisoned its
    Keras state for every later submission, the AUC and MeanIoU allocated gigabytes, the
    deflated config.json was read whole and accepted."""
    import keras

    secret = secrets[1][0]
    payload = _payload(secret)
    for what, submission, words in _hostile_submissions(payload):
        status, answer = call_api(server.url, "/api/submit", secret, submission)
        assert status == 400, (what, answer)
        assert words in answer["error"], (what, answer)
    assert keras.distribution.distribution() is None
    assert keras.config.epsilon() == 1e-7
    assert server.punchcard.store.by_state("queued") == []


def test_threads_stay_healthy_after_hostile_submissions(secrets, tmp_path):
    """More hostile archives than the server has threads, then a legitimate submission
    per thread: all accepted (each poisoned thread refused every later model before)."""
    running = Server(secrets[0], str(tmp_path / "work"), threads=2)
    try:
        payload = _payload()
        hostile = [{**payload, "model": _archive(payload, _lambda_layer)},
                   {**payload, "model": _archive(payload, _activation(
                       "keras.distribution", "set_distribution"))}]
        for round_ in range(10):
            status, _ = call_api(running.url, "/api/submit", secrets[1][1], hostile[round_ % 2])
            assert status == 400
        for secret in secrets[1][2:4]:
            status, answer = call_api(running.url, "/api/submit", secret, _payload(secret))
            assert status == 200, answer
    finally:
        running.stop()


def test_a_body_of_millions_of_objects_is_refused_unparsed(server, secrets):
    """30 MB of ``[{},{},...]`` took ~1 GB of the server's memory to parse."""
    body = b"[" + b"{}," * (10 << 20) + b"{}]"
    status, answer = call_api(server.url, "/api/submit", secrets[1][4], data=body)
    assert status == 400 and "JSON lists and objects" in answer["error"], answer


@pytest.mark.parametrize("limits, words", [
    ({"cpu_seconds": 1}, "more CPU time than this server gives one (1 s)"),
    ({"timeout": 0.5}, "took longer than 0.5 s"),
    ({"memory_bytes": 200 << 20}, "more memory than this server gives one (200 MiB)"),
])
def test_the_check_runs_in_a_child_under_limits(secrets, tmp_path, limits, words):
    """A legitimate submission, checked by a child too small for it: refused, naming the
    limit, and the server goes on."""
    running = Server(secrets[0], str(tmp_path / "work"), model_checker=ModelChecker(**limits))
    try:
        status, answer = call_api(running.url, "/api/submit", secrets[1][5], _payload())
        assert status == 400 and words in answer["error"], answer
        assert call_api(running.url, "/api/state", secrets[1][5])[0] == 404
    finally:
        running.stop()


def _trickle(port, count, stop):
    """``count`` clients that send a request's headers a byte at a time, reconnecting
    when the server drops them, until ``stop`` is set."""
    header = b"POST /api/submit HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: a\r\n" * 1000

    def connect():
        client = socket.socket()
        client.settimeout(2)
        try:
            client.connect(("127.0.0.1", port))
        except OSError:
            client.close()
            return None
        return [client, 0]

    clients = [connect() for _ in range(count)]
    while not stop.wait(0.2):
        for index, state in enumerate(clients):
            try:
                state[0].send(header[state[1]:state[1] + 1])
                state[1] += 1
            except (OSError, TypeError):  # dropped (or never connected): again
                if state is not None:
                    state[0].close()
                clients[index] = connect()
    for state in clients:
        if state is not None:
            state[0].close()


def test_trickling_clients_cannot_starve_an_authenticated_one(secrets, tmp_path):
    """Ten times the connection limit of clients trickling their headers held every
    connection (waitress's timeout counts from the last byte): no request was answered."""
    running = Server(secrets[0], str(tmp_path / "work"), connection_limit=20,
                     header_timeout=2.0)
    stop = threading.Event()
    trickler = threading.Thread(target=_trickle, args=(int(running.server.effective_port), 200,
                                                       stop), daemon=True)
    trickler.start()
    try:
        time.sleep(3)  # every trickler connected, some dropped and back
        for _ in range(5):
            request = urllib.request.Request(running.url + "/api/state",
                                             headers={SECRET_HEADER: secrets[1][6]})
            with pytest.raises(urllib.error.HTTPError) as answered:
                urllib.request.urlopen(request, timeout=20)
            assert answered.value.code == 404  # this secret has no job: it was answered
        assert len(running.server.active_channels) <= 20 + 2
    finally:
        stop.set()
        trickler.join(timeout=30)
        running.stop()


def _answer_to_headers(server, headers):
    """What the server answers a request of which only ``headers`` were sent."""
    with socket.create_connection(("127.0.0.1", int(server.server.effective_port)),
                                  timeout=10) as client:
        client.sendall(headers.encode() + b"\r\n")
        answer = b""
        while chunk := client.recv(4096):  # the server closes once it has answered
            answer += chunk
        return answer


def test_an_unknown_secrets_upload_is_refused_before_its_body(server, secrets):
    """waitress buffered 256 MB bodies to temporary files before the secret was checked."""
    answer = _answer_to_headers(
        server, f"POST /api/submit HTTP/1.1\r\nHost: x\r\n{SECRET_HEADER}: wrong\r\n"
                f"Content-Type: application/json\r\nContent-Length: {256 << 20}\r\n")
    assert answer.startswith(b"HTTP/1.1 403"), answer
    assert answer.endswith(b'{"error": "Unknown secret."}')
    # A small one is read and dropped, and its client reads the application's 403.
    status, answer = call_api(server.url, "/api/submit", "wrong", data=b"x" * 100_000)
    assert (status, answer) == (403, {"error": "Unknown secret."})
    # Routes other than submit take no body; a body of unknown length is refused.
    answer = _answer_to_headers(server, f"GET /api/state HTTP/1.1\r\nHost: x\r\n"
                                        f"{SECRET_HEADER}: {secrets[1][7]}\r\n"
                                        f"Content-Length: {1 << 20}\r\n")
    assert answer.startswith(b"HTTP/1.1 413") and b"larger than 65536 bytes" in answer
    answer = _answer_to_headers(server, f"POST /api/submit HTTP/1.1\r\nHost: x\r\n"
                                        f"{SECRET_HEADER}: {secrets[1][7]}\r\n"
                                        "Transfer-Encoding: chunked\r\n")
    assert answer.startswith(b"HTTP/1.1 411"), answer


def test_without_data_roots_local_paths_are_refused(secrets, tmp_path):
    """A one-step linear model of zero init came back holding a row of any Parquet file
    the server's user could read."""
    running = Server(secrets[0], str(tmp_path / "work"), allow_any_data_path=False)
    try:
        secret = secrets[1][0]
        payload = _payload(secret)
        for path in ["/etc/secret.parquet", "file:///etc/secret.parquet", "relative/x"]:
            for body in ({**payload, "data_path": path},
                         {**payload, "data_path": "hdfs:///data/x",
                          "train_options": {"validation": path}}):
                status, answer = call_api(running.url, "/api/submit", secret, body)
                assert status == 400 and "reads no local path" in answer["error"], answer
                assert "--allowed-data-root" in answer["error"]
    finally:
        running.stop()


def test_errors_sent_to_a_client_name_no_outside_path_and_quote_no_data():
    from distkeras.punchcard.data_roots import redact

    java = ("Py4JJavaError: java.lang.RuntimeException: file:/srv/secret/x.parquet is not a "
            "Parquet file. Expected magic number at tail, but found [83, 69, 67, 82]")
    assert "83, 69" not in redact(java, ["/data"]) and "/srv" not in redact(java, ["/data"])
    assert redact(java, ["/data"]).startswith("Py4JJavaError: Spark failed")
    message = ("AnalysisException: [PATH_NOT_FOUND] Path does not exist: "
               "file:/data/mine/x.parquet. And /srv/other/y, /work/jobs/abc/model.keras")
    redacted = redact(message, ["/data"])
    assert "file:/data/mine/x.parquet" in redacted  # under the roots: the client's own
    assert "/srv" not in redacted and "/work" not in redacted
    assert redact("ValueError: /etc/passwd is odd", [], own_paths=["/etc/passwd"]) == \
        "ValueError: /etc/passwd is odd"
    assert redact(None, []) is None
    dated = "result: 26/11/30 ERROR Executor: lost executor 1 (see /srv/x)"
    assert redact(dated, []) == "result: 26/11/30 ERROR Executor: lost executor 1 " \
        "(see <a path outside the data roots>)"
    wrapped = ("CommandError: /data/x is not a Parquet file (file:/data/x/p is not a Parquet "
               "file. Expected magic number at tail, but found [88, 89, 90, 87]; length is "
               "too low: 20)")
    assert "88" not in redact(wrapped, ["/data"]) and "20" not in redact(wrapped, ["/data"])


def test_a_failed_jobs_error_quotes_no_bytes_of_its_data(secrets, tmp_path):
    """A job on a file that is not Parquet told its client the file's length and last
    bytes (the innermost Java error, verbatim)."""
    root = tmp_path / "data"
    (root / "bad.parquet").mkdir(parents=True)
    (root / "bad.parquet" / "part-00000.parquet").write_bytes(b"top secret row: XYZW")
    running = RunningServer(secrets[0], str(tmp_path / "work"),
                            allowed_data_roots=[str(root)], allow_any_data_path=False)
    try:
        job = Job(secrets[1][1], "bad", str(root / "bad.parquet"), 1, 1, adag_trainer())
        job.send(running.url)
        with pytest.raises(JobError) as failed:
            job.wait_completion(timeout=300, poll_interval=0.5)
        message = str(failed.value)
        assert "88, 89, 90, 87" not in message and "XYZW" not in message, message
        assert "length" not in message and str(tmp_path / "work") not in message, message
        job.destroy()
    finally:
        running.stop()


def test_a_link_planted_beside_the_secrets_file_does_not_receive_them(tmp_path):
    """The temporary file had a predictable name (secrets.json.tmp-PID), opened without
    O_EXCL: a link planted there took the secrets, and became the secrets file."""
    import os

    path = tmp_path / "secrets.json"
    append_entry(str(path), make_entry("first", generate_secret()))
    elsewhere = tmp_path / "attacker.json"
    elsewhere.write_text("[]")
    (tmp_path / f"secrets.json.tmp-{os.getpid()}").symlink_to(elsewhere)
    append_entry(str(path), make_entry("second", generate_secret()))
    assert not path.is_symlink() and elsewhere.read_text() == "[]"
    assert [entry["identity"] for entry in json.loads(path.read_text())] == ["first", "second"]
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["secrets.json", "attacker.json", f"secrets.json.tmp-{os.getpid()}"])


def test_a_job_past_the_operators_limits_is_refused_or_stopped(secrets, tmp_path, data_path):
    """A job of num_epoch=1e9 held the only running slot for good."""
    from punchcard_support import group_alive, wait_for

    running = RunningServer(secrets[0], str(tmp_path / "work"),
                            punchcard_options={"max_job_seconds": 2, "max_epochs": 100})
    try:
        secret = secrets[1][2]
        status, answer = call_api(running.url, "/api/submit", secret,
                              Job(secret, "long", data_path, 1, 1,
                                  adag_trainer(num_epoch=10**9)).payload())
        assert status == 400 and "'num_epoch' must be at most 100" in answer["error"]
        job = Job(secret, "slow", data_path, 1, 1, adag_trainer(num_epoch=100))
        job.send(running.url)
        assert wait_for(lambda: job.get_state()["state"] == "failed", timeout=120)
        assert "ran longer than this server allows (2 s" in job.get_state()["error"]
        pid = running.punchcard.job_of(secret_hash(secret))["pid"]
        assert pid and wait_for(lambda: not group_alive(pid), timeout=60)
    finally:
        running.stop()


def test_queued_jobs_start_fairly_across_identities(tmp_path):
    """One identity's many secrets queued first took every slot that came free."""
    from distkeras.job_deployment import Punchcard
    from distkeras.punchcard.scheduler import next_jobs

    path = str(tmp_path / "secrets.json")
    for identity in ["alice", "alice", "alice", "bob"]:
        append_entry(path, make_entry(identity, generate_secret()))
    punchcard = Punchcard(path, str(tmp_path / "work"), max_running=0)
    punchcard.close()  # no scheduler: only its choice is under test
    for index, identity in enumerate(["alice", "alice", "alice", "bob"]):
        punchcard.store.insert_if_free({
            "id": f"job{index}", "secret_hash": f"hash{index}", "identity": identity,
            "trainer_class": "ADAG", "job_dir": str(tmp_path / f"job{index}"),
            "state": "queued", "created": 1000.0 + index, "name": f"job{index}",
            "data_path": "hdfs:///x", "num_executors": 1, "num_processes": 1})
    store = punchcard.store

    def chosen(max_running):
        return [job["id"] for job in next_jobs(store.by_state("running"),
                                               store.by_state("queued"), max_running)]

    assert chosen(2) == ["job0", "job3"]
    store.update("job0", state="running")
    assert chosen(3) == ["job3", "job1"]


def _rewrite_secrets(path, entries):
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(entries, handle)


def test_secrets_are_reloaded_when_the_file_changes(tmp_path):
    """Secrets were read once: revoking one needed a restart."""
    from distkeras.punchcard.secrets_file import SecretsFile
    from punchcard_support import wait_for

    path = str(tmp_path / "secrets.json")
    old, new = generate_secret(), generate_secret()
    _rewrite_secrets(path, [make_entry("old", old)])
    running = Server(path, str(tmp_path / "work"))
    try:
        assert call_api(running.url, "/api/state", old)[0] == 404
        assert call_api(running.url, "/api/state", new)[0] == 403
        _rewrite_secrets(path, [make_entry("new", new)])  # one granted, one revoked
        assert wait_for(lambda: call_api(running.url, "/api/state", new)[0] == 404, timeout=10)
        assert call_api(running.url, "/api/state", old)[0] == 403
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("[not json")  # a bad save keeps the secrets in force
        time.sleep(1.5)
        assert call_api(running.url, "/api/state", new)[0] == 404
    finally:
        running.stop()
    # reload() (SIGHUP's) reads the file whatever the interval.
    _rewrite_secrets(path, [make_entry("old", old)])
    secrets_file = SecretsFile(path, check_interval=3600)
    _rewrite_secrets(path, [make_entry("new", new)])
    assert secrets_file.identify(new) is None
    assert secrets_file.reload() and secrets_file.identify(new)[1] == "new"


def test_distkeras_punchcard_logs_info_audits_and_reloads_on_sighup(secrets, tmp_path):
    """`distkeras punchcard` dropped its INFO lines; refusals were logged nowhere."""
    import signal
    import subprocess
    import sys

    from punchcard_support import free_port, reachable, wait_for

    port, audit = free_port(), tmp_path / "audit.jsonl"
    log = open(tmp_path / "server.log", "w+b")
    server = subprocess.Popen(
        [sys.executable, "-m", "distkeras.cli", "punchcard", "--secrets", secrets[0],
         "--host", "127.0.0.1", "--port", str(port), "--work-dir", str(tmp_path / "work"),
         "--audit-log", str(audit)], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: reachable(url), timeout=120)
        assert call_api(url, "/api/submit", "wrong", {"job_name": "x"})[0] == 403
        payload = {**_payload(secrets[1][3]), "data_path": "/etc/secret.parquet"}
        assert call_api(url, "/api/submit", secrets[1][3], payload)[0] == 400
        assert call_api(url, "/api/cancel", secrets[1][3])[0] == 404
        server.send_signal(signal.SIGHUP)
        assert wait_for(lambda: b"reloaded" in (tmp_path / "server.log").read_bytes(),
                         timeout=30)
        records = [json.loads(line) for line in audit.read_text().splitlines()]
        assert records[0]["action"] == "state"  # reachable's probe, with no secret
        records = records[1:]
        assert [(r["identity"], r["action"], r["outcome"], r["status"]) for r in records] == [
            (None, "submit", "refused", 403), ("user3", "submit", "refused", 400),
            ("user3", "cancel", "refused", 404)]
        assert "is not a path of the cluster's file system" in records[1]["reason"]
        assert all(set(r) == {"time", "identity", "action", "job", "outcome", "status",
                              "reason"} for r in records)
        assert b"INFO Punchcard listening on 127.0.0.1" in (tmp_path / "server.log").read_bytes()
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
