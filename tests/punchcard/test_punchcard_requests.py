"""What Punchcard's server answers over real HTTP on 127.0.0.1: refused submissions and
bodies, data roots, model archives and weight counts, the scripts' start-up errors."""

import base64
import json
import os
import shutil
import socket
import subprocess
import sys
import urllib.request

import pytest
from conftest import build_mlp
from punchcard_support import (RunningServer, SCRIPTS, SlowCheckPunchcard, adag_trainer,
                               call_api, deflated_config, free_port, reachable, staggered,
                               upload_status, wait_for, widened, with_config)

from distkeras.job_deployment import Job
from distkeras.punchcard.protocol import SECRET_HEADER
from distkeras.punchcard.submissions import BadRequest
from distkeras.punchcard.secrets_file import secret_hash
from distkeras.punchcard.submissions import check_data_path


def test_refusals(secrets, tmp_path, data_path):
    import keras

    from distkeras.trainers import EnsembleTrainer
    from distkeras.utils import serialize_model

    running = RunningServer(secrets[0], str(tmp_path / "work"), max_request_bytes=4 << 20)
    try:
        url, secret = running.url, secrets[1][3]
        # An optimizer object travels as its Keras config: accepted below.
        good = Job(secret, "ok", data_path, 1, 1,
                   adag_trainer(worker_optimizer=keras.optimizers.SGD(0.05))).payload()
        config = good["trainer"]["config"]
        ensemble = Job(secret, "ens", data_path, 1, 1, EnsembleTrainer(
            build_mlp(), "adam", "categorical_crossentropy")).payload()["trainer"]
        assert call_api(url, "/api/submit", "not-a-secret", good)[0] == 403
        assert call_api(url, "/api/submit", None, good)[0] == 403
        assert call_api(url, "/api/state", "not-a-secret")[0] == 403
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
                status, answer = call_api(url, "/api/submit", secret, {**good, field: value})
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
            status, answer = call_api(url, "/api/submit", secret, {**good, "trainer": trainer})
            assert status == 400 and f"'{field}'" in answer["error"], (field, value, answer)
        # The model: missing, or not an archive; no server path in the answer.
        status, answer = call_api(url, "/api/submit", secret, {**good, "model": None})
        assert status == 400 and "'model' is required" in answer["error"]
        for model in (base64.b64encode(b"hello").decode(),
                      base64.b64encode(b"PK\x03\x04garbage").decode()):
            status, answer = call_api(url, "/api/submit", secret, {**good, "model": model})
            assert status == 400 and "/tmp" not in answer["error"], answer
        status, answer = call_api(url, "/api/submit", secret, {**good, "trainer": ensemble})
        assert status == 400 and "several models" in answer["error"]
        # Unknown endpoints and methods answer JSON as the others do.
        status, answer = call_api(url, "/api/nothing", secret)
        assert status == 404 and "/api/submit" in answer["error"]
        status, answer = call_api(url, "/api/submit", secret)  # GET
        assert status == 405 and "POST" in answer["error"]

        lambda_model = keras.Sequential([keras.Input((784,)), keras.layers.Lambda(lambda x: x),
                                         keras.layers.Dense(10, activation="softmax")])
        tampered = {**good, "model": base64.b64encode(serialize_model(lambda_model)).decode()}
        status, answer = call_api(url, "/api/submit", secret, tampered)
        assert status == 400 and "refused" in answer["error"]
        assert "never runs" in answer["error"] and "safe_mode=False" not in answer["error"]
        assert call_api(url, "/api/submit", secret, data=b"{not json")[0] == 400
        assert upload_status(url, secret, b"x" * (5 << 20)) == 413
        assert not os.path.exists("/tmp/pwned")
        assert running.punchcard.store.by_state(*("queued", "running", "finished")) == []

        # A job name that is merely unusual is fine, and the busy secret is refused.
        assert call_api(url, "/api/submit", secret, good)[0] == 200
        status, answer = call_api(url, "/api/submit", secret, good)
        assert status == 403 and "already has a job" in answer["error"]
        assert "job.destroy()" in answer["error"]
        # Another secret sees nothing of this job.
        assert call_api(url, "/api/state", secrets[1][4])[0] == 404
        assert call_api(url, "/api/destroy", secret)[0] == 409  # still running
        status, answer = call_api(url, "/api/result", secret)
        assert status == 409 and "only a finished job has a trained model" in answer["error"]
        assert call_api(url, "/api/cancel", secret)[0] == 200
        assert call_api(url, "/api/state", secret)[1]["state"] == "cancelled"
    finally:
        running.stop()
        for job in running.punchcard.store.by_state("queued", "running"):
            running.punchcard.cancel(job)


def test_allowed_data_roots_refuse_glob_patterns(secrets, tmp_path, data_path):
    root = os.path.dirname(data_path)
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0,
                            allowed_data_roots=[root])
    try:
        secret = secrets[1][7]
        good = Job(secret, "rooted", data_path, 1, 1, adag_trainer()).payload()
        # Each names a literal path under the root, but Spark's glob expansion (or its
        # comma-separated list) would read outside it.
        escapes = [f"{root}/{{../secrets.json,zz}}", f"{root}/[.][.]/x", f"{root}/*.parquet",
                   f"{root}/x?", f"{root}/x,/etc/passwd", f"{root}/\\.\\./x"]
        for path in escapes:
            status, answer = call_api(running.url, "/api/submit", secret, {**good, "data_path": path})
            assert status == 400 and "glob" in answer["error"], (path, answer)
            status, answer = call_api(running.url, "/api/submit", secret,
                                  {**good, "train_options": {"validation": path}})
            assert status == 400 and "train_options.validation" in answer["error"], answer
        assert running.punchcard.store.by_state("queued") == []
        assert call_api(running.url, "/api/submit", secret, good)[0] == 200
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
        good = Job(secret, "linked", str(root / "alias.parquet"), 1, 1, adag_trainer()).payload()
        for path in [root / "escape.parquet", mixed, nested]:
            status, answer = call_api(running.url, "/api/submit", secret,
                                  {**good, "data_path": str(path)})
            assert status == 400 and "outside the allowed data roots" in answer["error"], \
                (path, answer)
            assert str(outside) not in answer["error"]  # where the link leads is not said
            status, answer = call_api(running.url, "/api/submit", secret,
                                  {**good, "train_options": {"validation": str(path)}})
            assert status == 400 and "train_options.validation" in answer["error"], answer
        assert running.punchcard.store.by_state("queued") == []
        assert call_api(running.url, "/api/submit", secret, good)[0] == 200
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


def test_oversized_body_is_refused_before_it_is_read(secrets, tmp_path):
    # The server as users start it: scripts/punchcard.py, in its own process.
    port = free_port()
    script = os.path.join(SCRIPTS, "punchcard.py")
    server = subprocess.Popen([sys.executable, script, "--secrets", secrets[0], "--host",
                               "127.0.0.1", "--port", str(port), "--max-request-mb", "1",
                               "--work-dir", str(tmp_path / "work")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        assert wait_for(lambda: reachable(url), timeout=60)
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


def test_the_number_of_workers_is_bounded_as_a_whole():
    from distkeras.punchcard.submissions import BadRequest, MAX_WORKERS, validate_submission

    payload = Job("secret", "wide", "/data/fashion.parquet", 2, 2, adag_trainer()).payload()
    assert validate_submission(payload)[2]["num_workers"] == 4
    # Each count within bounds, their product (the job's partitions and tasks) far beyond.
    with pytest.raises(BadRequest, match=r"at most 1024. Received: 1024 x 1024 = 1048576"):
        validate_submission({**payload, "num_executors": MAX_WORKERS,
                             "num_processes": MAX_WORKERS})


def test_a_model_archive_that_unpacks_to_far_more_than_it_holds_is_refused(secrets, tmp_path):
    """A .keras archive whose config.json deflates 200 MiB (still valid JSON: trailing
    spaces) into 200 KiB: Keras would read all of it into the server's memory as it loads
    the model, and queued the job; it is refused from the archive's directory."""
    payload = Job(secrets[1][13], "bomb", "/data/fashion.parquet", 1, 1, adag_trainer()).payload()
    bomb = deflated_config(payload, 200 << 20)
    assert len(bomb) < 4 << 20
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_request_bytes=8 << 20,
                            max_running=0)  # nothing starts, should a job be queued
    try:
        status, answer = call_api(running.url, "/api/submit", secrets[1][13],
                              {**payload, "model": base64.b64encode(bomb).decode()})
        assert status == 400, answer
        assert "declare" in answer["error"] and "keras.saving.save_model" in answer["error"]
        assert running.punchcard.store.by_state("queued", "running") == []
    finally:
        running.stop()


def test_a_model_declaring_more_weights_than_its_archive_holds_is_refused_unbuilt(secrets,
                                                                                 tmp_path):
    """A valid secret's archive of a few kilobytes whose config declares Dense(200000)
    after Dense(200000): the server built it to validate it, allocating 160 GB of weights
    in its own process. It is refused, by count, before any weight exists."""
    payload = Job(secrets[1][14], "huge", "/data/fashion.parquet", 1, 1, adag_trainer()).payload()
    huge = with_config(base64.b64decode(payload["model"]), widened)
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0)
    try:
        status, answer = call_api(running.url, "/api/submit", secrets[1][14],
                              {**payload, "model": base64.b64encode(huge).decode()})
        assert status == 400, answer
        assert "declares 40157200000 weight values (160628800000 bytes)" in answer["error"]
        assert "67108864 bytes of weights at most" in answer["error"]  # the limit
        assert running.punchcard.store.by_state("queued", "running") == []
        assert not os.path.exists(os.path.join(running.punchcard.work_dir, "jobs"))
        assert call_api(running.url, "/api/submit", secrets[1][14], payload)[0] == 200
    finally:
        running.stop()


def test_counting_declared_weights_leaves_no_variable_to_initialize():
    """The count builds the model in a stateless scope, whose variables Keras initializes
    when a later scope of the same thread ends: the 40 billion must never be."""
    import keras
    from keras.src.backend.common import global_state

    from distkeras.punchcard.submissions import BadRequest, validate_submission

    payload = Job("secret", "huge", "/data/fashion.parquet", 1, 1, adag_trainer()).payload()
    huge = with_config(base64.b64decode(payload["model"]), widened)
    with pytest.raises(BadRequest, match="declares 40157200000 weight values"):
        validate_submission({**payload, "model": base64.b64encode(huge).decode()})
    assert not global_state.get_global_attribute("uninitialized_variables")
    with keras.StatelessScope():
        pass  # would initialize what the count left behind


def test_legitimate_models_pass_the_weight_count():
    import keras

    from distkeras.punchcard.submissions import validate_submission
    from distkeras.keras_io.archives import declared_weight_bytes
    from distkeras.utils import serialize_model

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
                                adag_trainer(keras_model=model)).payload())


def test_an_unknown_custom_layer_is_named_in_a_few_words():
    import keras

    from distkeras.punchcard.submissions import BadRequest, validate_submission

    class Doubling(keras.layers.Layer):  # not registered, and never installed on a server
        def call(self, inputs):
            return inputs * 2

    model = keras.Sequential([keras.Input((784,)), Doubling(),
                              keras.layers.Dense(10, activation="softmax")])
    payload = Job("secret", "custom", "/data/fashion.parquet", 1, 2,
                  adag_trainer(keras_model=model)).payload()
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


def test_json_nested_too_deeply_is_a_bad_request(server, secrets):
    # Python's decoder raises RecursionError, which Flask's silent get_json lets through.
    status, answer = call_api(server.url, "/api/submit", secrets[1][13], data=b"[" * 100000)
    assert status == 400 and answer["error"] == "The request body is JSON nested too deeply."


def test_one_secret_has_one_submission_checked_at_a_time(secrets, tmp_path, data_path):
    """Checking a submission builds its model in a request thread: one client sending the
    same slow model many times at once held that many of the server's threads; and a
    secret that already had a job had each submission checked before being refused."""
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0,
                            punchcard_class=SlowCheckPunchcard)
    try:
        secret, other = secrets[1][21], secrets[1][22]
        payload = Job(secret, "slow", data_path, 1, 1, adag_trainer()).payload()
        answers = staggered(3, lambda: call_api(running.url, "/api/submit", secret, payload))
        assert sorted(status for status, _ in answers) == [200, 403, 403], answers
        assert all("still being checked" in body["error"]
                   for status, body in answers if status == 403)
        assert running.punchcard.checks == 1
        # Another secret is not held up by the first one's checks.
        assert call_api(running.url, "/api/submit", other, payload)[0] == 200
        assert running.punchcard.checks == 2
        # A secret that has its job is refused before any check of the new submission.
        status, answer = call_api(running.url, "/api/submit", secret, payload)
        assert status == 403 and "already has a job" in answer["error"]
        assert running.punchcard.checks == 2
        # Once a check failed, the same secret may submit again.
        third = secrets[1][23]
        assert call_api(running.url, "/api/submit", third, {**payload, "model": None})[0] == 400
        assert call_api(running.url, "/api/submit", third, payload)[0] == 200
    finally:
        running.stop()


@pytest.mark.parametrize("field", ["loss", "metrics"])
def test_a_trainer_config_nested_too_deeply_is_a_bad_request(server, secrets, tmp_path, field):
    """Parsed, the body was fine; the checks of its loss and metrics recurse into them, and
    ran out of stack: a 500 saying the server failed, for the client's mistake."""
    secret = secrets[1][4]
    payload = Job(secret, "deep", str(tmp_path), 1, 1, adag_trainer()).payload()
    payload["trainer"]["config"][field] = json.loads("[" * 900 + "]" * 900)
    status, answer = call_api(server.url, "/api/submit", secret, payload)
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
