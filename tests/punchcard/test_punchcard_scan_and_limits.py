"""Punchcard under attack, round 2 (issue #47, findings 1, 3, 4, 6 and the lower ones): the
config scan's respellings, local paths in any spelling, model checks shared fairly, and
jobs bounded in memory and settings; each against a real server on 127.0.0.1."""

import base64
import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from punchcard_support import (RunningServer, adag_trainer, call_api, wait_for,
                               with_config)

from distkeras.job_deployment import Job
from distkeras.punchcard.protocol import SECRET_HEADER
from distkeras.punchcard import job_files, processes
from distkeras.punchcard.model_check import ModelChecker
from distkeras.punchcard.secrets_file import (append_entry, generate_secret, make_entry,
                                              secret_hash)


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    """Three secrets of "mallory", one of "alice": (path, {name: secret})."""
    path = str(tmp_path_factory.mktemp("round2-secrets") / "secrets.json")
    values = {}
    for name, identity in [("m1", "mallory"), ("m2", "mallory"), ("m3", "mallory"),
                           ("alice", "alice")]:
        values[name] = generate_secret()
        append_entry(path, make_entry(identity, values[name]))
    return path, values


@pytest.fixture
def server(secrets, tmp_path):
    """A server whose jobs never start, that takes local paths (the tests' data are)."""
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0, threads=4)
    yield running
    running.stop()


def _payload(secret, model=None, **trainer):
    payload = Job(secret, "r2", "/data/x.parquet", 1, 1, adag_trainer(**trainer)).payload()
    return payload if model is None else {**payload, "model": model}


def _edited(payload, edit):
    return base64.b64encode(with_config(base64.b64decode(payload["model"]), edit)).decode()


def _object(module, class_name, config=None, registered_name=None):
    return {"module": module, "class_name": class_name, "config": config or {},
            "registered_name": registered_name}


def _activation(obj):
    def edit(config):
        config["config"]["layers"][1]["config"]["activation"] = obj
        return config
    return edit


def _layer(obj):
    def edit(config):
        config["config"]["layers"].insert(2, {**obj, "config": {"name": "x", **obj["config"]}})
        return config
    return edit


def _respellings(png):
    """(what, config edit): each reaches, as Keras resolves it, a function or class
    outside the allow-list; some only once Keras has resolved it (the check child's and
    the job's resolution check), the others already by name."""
    gallery = {"images": {"class_name": "__numpy__",
                          "config": {"value": [[[[0.0]]]], "dtype": "float32"}},
               "path": png}
    return [
        ("layers.Lambda after module keras", _layer(_object("keras", "layers.Lambda"))),
        ("src.layers.Lambda", _layer(_object("keras.src", "layers.Lambda"))),
        ("Lambda in upper case", _layer(_object("Keras.layers", "LAMBDA"))),
        ("Lambda as a registered name", _layer(_object("keras.layers", "Dense", {"units": 2},
                                                       "evil>Lambda"))),
        ("visualization.plot_image_gallery",
         _layer(_object("keras", "visualization.plot_image_gallery", gallery))),
        ("config.set_epsilon activation", _activation(_object("keras", "config.set_epsilon"))),
        ("set_epsilon as a dotted function", _activation(
            _object("keras", "function", "config.set_epsilon"))),
        ("set_epsilon under a registered name", _activation(
            _object("keras.config", "function", "set_epsilon", "relu"))),
        ("set_epsilon from keras.src", _activation(
            _object("keras.src.backend.config", "set_epsilon"))),
        ("keras.layers.Input, a function", _layer(_object("keras.layers", "Input",
                                                          {"shape": [3]}))),
        ("keras.activations.deserialize", _layer(_object("keras.activations", "deserialize"))),
        ("keras.losses.get", _layer(_object("keras.losses", "get"))),
        ("keras.src.losses.get", _layer(_object("keras.src.losses", "get"))),
        ("ops.while_loop as a class", _layer(_object("keras.ops", "while_loop"))),
        ("WhileLoop operation", _layer(_object("keras.src.ops.core", "WhileLoop"))),
        ("a vocabulary read from a server's file", _layer(_object(
            "keras.layers", "StringLookup", {"vocabulary": "/etc/passwd"}))),
        ("builtins.eval as a layer", _layer(_object("builtins", "eval"))),
        ("os.system as a layer", _layer(_object("os", "system"))),
        ("an installed package's class, unregistered", _layer(_object("numpy", "ndarray"))),
        ("a layer without its module (Keras 2's loader)",
         _layer({"class_name": "Dense", "config": {"units": 2}})),
    ]


def test_respelled_code_references_are_refused(server, secrets, tmp_path):
    """A dotted class_name after module "keras" reached any exported Keras symbol: a PNG
    was written where the client said, set_epsilon was accepted."""
    secret = secrets[1]["alice"]
    payload = _payload(secret)
    png = str(tmp_path / "written-by-the-check.png")
    for what, edit in _respellings(png):
        status, answer = call_api(server.url, "/api/submit", secret,
                                  _payload(secret, _edited(payload, edit)))
        assert status == 400, (what, answer)
        assert "refused" in answer["error"], (what, answer)
    assert not os.path.exists(png)
    status, answer = call_api(server.url, "/api/submit", secret, payload)
    assert status == 200, answer  # the same model, unedited: accepted


def _functional_payload(secret, edit_node):
    import keras

    from distkeras.keras_io.archives import serialize_model

    inputs = keras.Input((784,))
    outputs = keras.layers.Dense(10, activation="softmax")(keras.ops.add(inputs, 1.0))
    model = keras.Model(inputs, outputs)
    payload = _payload(secret, base64.b64encode(serialize_model(model)).decode())

    def edit(config):
        edit_node(config["config"]["layers"][1])
        return config
    return payload, {**payload, "model": _edited(payload, edit)}


def _constants(layer):
    layer["inbound_nodes"][0]["args"] = [1.0, 2.0]


def _while_loop(layer):
    layer.update(module="keras.src.ops.core", class_name="WhileLoop",
                 registered_name="WhileLoop")


def _function_argument(layer):
    layer["inbound_nodes"][0]["args"][1] = _object("keras.ops", "function", "relu")


@pytest.mark.parametrize("edit, says", [
    (_constants, "on constants only"),
    (_while_loop, "WhileLoop"),
    (_function_argument, "on a function object"),
])
def test_a_functional_graphs_nodes_take_its_tensors_and_no_calling_operation(server, secrets,
                                                                              edit, says):
    """Keras calls a node whose inputs are all constants while it loads the model: an
    endless ops.while_loop cost --check-seconds of CPU per submission."""
    secret = secrets[1]["alice"]
    legitimate, hostile = _functional_payload(secret, edit)
    started = time.monotonic()
    status, answer = call_api(server.url, "/api/submit", secret, hostile)
    assert status == 400 and says in answer["error"], answer
    assert time.monotonic() - started < 30
    status, answer = call_api(server.url, "/api/submit", secret, legitimate)
    assert status == 200, answer  # an operation's node on the model's tensor is fine


def _job_row(tmp_path, model_bytes, config, data_path):
    folder = tmp_path / "job"
    folder.mkdir()
    job = {"id": "f" * 32, "job_dir": str(folder), "data_path": data_path,
           "trainer_class": "ADAG", "num_executors": 1, "num_processes": 1}
    (folder / job_files.MODEL).write_bytes(model_bytes)
    (folder / job_files.TRAINER).write_text(json.dumps(config))
    return job


@pytest.mark.parametrize("edit, says", [
    (_activation(_object("keras", "config.set_epsilon")), "without dots"),
    (_layer(_object("keras.layers", "Input", {"shape": [3]})), "which this server does not"),
])
def test_the_job_process_checks_its_model_itself(tmp_path, data_path, edit, says):
    """The job's own process refuses what the server's check would, by name and as
    Keras resolves it, whatever wrote the job's files."""
    payload = _payload("s")
    config = dict(payload["trainer"]["config"])
    job = _job_row(tmp_path, with_config(base64.b64decode(payload["model"]), edit), config,
                   data_path)
    result = subprocess.run(processes.job_command(job, "local[1]", 4 << 30),
                            cwd=job["job_dir"], capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert says in result.stderr, result.stderr[-2000:]
    status = job_files.read_status(job)
    assert status["state"] == "failed" and says in status["error"], status


@pytest.mark.parametrize("path", [
    "File:/etc/passwd", "FILE:///etc/passwd", "fIlE:/etc/x.parquet", "local:/etc/x.parquet",
    "LOCAL:/etc/x", "jar:file:/tmp/x.jar!/y", "/etc/x.parquet", "relative/x.parquet",
    "hdfs://attacker.example:9000/x", "HDFS://attacker/x", "webhdfs://host/x",
    "ftp://host/x", "http://169.254.169.254/latest", "hdfs:///data/x,/etc/passwd",
    "s3a://bucket/x,file:///etc/passwd", "hdfs:///data/{a,../../etc}",
])
def test_without_data_roots_only_cluster_paths_are_read(secrets, tmp_path, path):
    """With no --allowed-data-root, File:/ and FILE:/ read local files, local: and
    jar:file: were accepted, and Spark connected out to any hdfs://, webhdfs://, ftp://
    host a client named."""
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0, threads=2,
                            allow_any_data_path=False)
    try:
        secret = secrets[1]["alice"]
        for body in ({**_payload(secret), "data_path": path},
                     {**_payload(secret), "data_path": "hdfs:///data/x",
                      "train_options": {"validation": path}}):
            status, answer = call_api(running.url, "/api/submit", secret, body)
            assert status == 400, (path, answer)
            assert "data_path" in answer["error"] or "validation" in answer["error"]
    finally:
        running.stop()


def test_without_data_roots_the_clusters_own_paths_are_read(secrets, tmp_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0, threads=2,
                            allow_any_data_path=False)
    try:
        secrets_by_path = zip(["HDFS:///data/x.parquet", "s3a://bucket/x.parquet"],
                              [secrets[1]["m1"], secrets[1]["alice"]])
        for path, secret in secrets_by_path:
            status, answer = call_api(running.url, "/api/submit", secret,
                                      {**_payload(secret), "data_path": path})
            assert status == 200, (path, answer)
    finally:
        running.stop()


class _SilentChecker(ModelChecker):
    """A checker whose children never answer (a model that takes the check's whole
    time): real processes, real slots."""

    def _spawn(self):
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                start_new_session=True)


def _submit_status(url, secret, payload, timeout=60):
    request = urllib.request.Request(url + "/api/submit", data=json.dumps(payload).encode(),
                                     headers={SECRET_HEADER: secret,
                                              "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers)


def test_model_checks_are_shared_fairly_between_identities(secrets, tmp_path):
    """Request threads waited on the global check semaphore with no timeout: four secrets
    submitting an endless model made another user's poll wait 13.5 s, her submission
    19.6 s."""
    checker = _SilentChecker(cpu_seconds=60, timeout=20, max_concurrent=2)
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0, threads=4,
                            model_checker=checker)
    try:
        values = secrets[1]
        holder = threading.Thread(target=_submit_status,
                                  args=(running.url, values["m1"], _payload(values["m1"])))
        holder.start()
        assert wait_for(lambda: checker._owners, timeout=30)  # mallory's check holds a slot
        started = time.monotonic()
        for name in ("m2", "m3"):  # mallory's other secrets: no second check, no wait
            status, headers = _submit_status(running.url, values[name], _payload(values[name]))
            assert status == 503 and int(headers["Retry-After"]) > 0, (status, headers)
        assert time.monotonic() - started < 5
        # Alice gets the other slot (her check is as silent), then nobody waits either:
        alice = threading.Thread(target=_submit_status,
                                 args=(running.url, values["alice"], _payload(values["alice"])))
        alice.start()
        assert wait_for(lambda: len(checker._owners) == 2, timeout=30)
        started = time.monotonic()
        status, headers = _submit_status(running.url, values["m2"], _payload(values["m2"]))
        assert status == 503 and "Retry-After" in headers
        status, _ = call_api(running.url, "/api/state", values["m3"])
        assert status == 404 and time.monotonic() - started < 5  # threads are free
        holder.join(timeout=60)
        alice.join(timeout=60)
        assert not checker._owners  # both slots given back once the checks timed out
    finally:
        running.stop()


def _wide_model_payload(secret, batch_size):
    """The issue's archive: 5,002 weights whose activations take ~256 GB a batch of 64."""
    import keras

    from distkeras.keras_io.archives import serialize_model

    model = keras.Sequential([keras.Input((4,)), keras.layers.Flatten(),
                              keras.layers.RepeatVector(1_000_000),
                              keras.layers.Dense(1000)])
    payload = Job(secret, "wide", "/data/x.parquet", 1, 1,
                  adag_trainer(keras_model=model, loss="mse", metrics=[],
                               batch_size=batch_size)).payload()
    return payload


@pytest.mark.parametrize("change, says", [
    ({"batch_size": 10**30}, "'batch_size' must be at most 1,000,000"),
    ({"worker_timeout": 1e300}, "'worker_timeout' must be at most 604,800"),
    ({"communication_window": 10**12}, "'communication_window' must be at most"),
    ({"learning_rate": 1e300}, "'learning_rate' must be at most"),
    ({"label_col": [f"c{index}" for index in range(5000)]}, "'label_col' names 5000 columns"),
    ({"features_col": "f" * 5000}, "'features_col' names a column of 5000 characters"),
])
def test_settings_out_of_range_are_refused_naming_the_range(server, secrets, change, says):
    secret = secrets[1]["alice"]
    payload = _payload(secret)
    payload["trainer"]["config"].update(change)
    status, answer = call_api(server.url, "/api/submit", secret, payload)
    assert status == 400 and says in answer["error"], answer


def test_a_model_whose_activations_exceed_a_jobs_memory_is_refused(secrets, tmp_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0, threads=2,
                            model_checker=ModelChecker(activation_bytes=8 << 30))
    try:
        secret = secrets[1]["alice"]
        status, answer = call_api(running.url, "/api/submit", secret,
                                  _wide_model_payload(secret, 64))
        assert status == 400, answer
        assert "activations for one batch of 64 rows take about 240.3 GiB" in \
            answer["error"] and "8.0 GiB" in answer["error"], answer
    finally:
        running.stop()


def _limits(pid):
    with open(f"/proc/{pid}/limits", encoding="utf-8") as handle:
        return next(line for line in handle if line.startswith("Max data size"))


def _descendants(pid):
    found, pending = [], [pid]
    while pending:
        parent = pending.pop()
        for task in os.listdir(f"/proc/{parent}/task"):
            try:
                with open(f"/proc/{parent}/task/{task}/children", encoding="utf-8") as handle:
                    children = [int(child) for child in handle.read().split()]
            except OSError:
                continue
            found += children
            pending += children
    return found


def test_a_job_trains_under_its_memory_limit(secrets, tmp_path, data_path):
    """Job processes ran with no memory limit. Under one (RLIMIT_DATA, which JAX's and
    the JVM's reservations do not count against), a small job trains on JAX, and Spark's
    JVM and Python workers inherit it."""
    limit = 4 << 30
    running = RunningServer(secrets[0], str(tmp_path / "work"),
                            punchcard_options={"job_memory_bytes": limit})
    try:
        secret = secrets[1]["alice"]
        job = Job(secret, "limited", data_path, 1, 1, adag_trainer())
        job.send(running.url)
        seen = {}

        def running_with_children():
            row = running.punchcard.job_of(secret_hash(secret))
            if row and row["pid"] and row["state"] == "running":
                try:
                    for pid in [row["pid"]] + _descendants(row["pid"]):
                        seen[pid] = _limits(pid)
                except OSError:
                    return False
            return len(seen) >= 2
        assert wait_for(running_with_children, timeout=180)
        assert all(str(limit) in line for line in seen.values()), seen
        job.wait_completion(timeout=600)  # raises unless it finished
        assert job.model_bytes and len(job.history) > 0
    finally:
        running.stop()


def test_a_secrets_file_others_can_read_is_warned_of(tmp_path, caplog):
    path = tmp_path / "secrets.json"
    append_entry(str(path), make_entry("a", generate_secret()))
    os.chmod(path, 0o644)
    with caplog.at_level(logging.WARNING):
        running = RunningServer(str(path), str(tmp_path / "work"), max_running=0, threads=1)
        running.stop()
    assert any("may be read or changed by other users" in record.getMessage() and
               "644" in record.getMessage() for record in caplog.records)
    caplog.clear()
    os.chmod(path, 0o600)
    with caplog.at_level(logging.WARNING):
        running = RunningServer(str(path), str(tmp_path / "work2"), max_running=0, threads=1)
        running.stop()
    assert not any("secrets file" in record.getMessage() for record in caplog.records)
