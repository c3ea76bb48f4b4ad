"""Punchcard behind a real HTTP server on 127.0.0.1 for the tests/punchcard/ files: the
secrets, a small Parquet data set, the server, and the requests a client sends."""

import base64
import json
import os
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import build_mlp

from distkeras.job_deployment import Job, Punchcard
from distkeras.punchcard.app import make_server
from distkeras.punchcard.protocol import SECRET_HEADER
from distkeras.punchcard.secrets_file import append_entry, generate_secret, make_entry, secret_hash

NUM_SECRETS = 24
SCRIPTS = os.path.join(os.path.dirname(__file__), os.pardir, "scripts")


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    """A secrets file of NUM_SECRETS users (every other one stored hashed): (path, secrets)."""
    folder = tmp_path_factory.mktemp("secrets")
    path = str(folder / "secrets.json")
    values = [generate_secret() for _ in range(NUM_SECRETS)]
    for index, secret in enumerate(values):
        append_entry(path, make_entry(f"user{index}", secret, hashed=index % 2 == 1))
    return path, values


@pytest.fixture(scope="module")
def data_path(fashion_train, tmp_path_factory):
    """2,000 Fashion-MNIST rows as a Parquet folder (written by the shared session)."""
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
    """A RunningServer of its own; its queued and running jobs cancelled afterwards."""
    running = RunningServer(secrets[0], str(tmp_path / "work"))
    yield running
    running.stop()  # the scheduler first, so no queued job starts while we clean up
    for job in running.punchcard.store.by_state("queued", "running"):
        running.punchcard.cancel(job)


def adag_trainer(**kwargs):
    """ADAG on `build_mlp()` with Adam, 2 workers, window 4; ``kwargs`` change any of it."""
    from distkeras.trainers import ADAG

    settings = dict(keras_model=build_mlp(), worker_optimizer="adam",
                    loss="categorical_crossentropy", metrics=["accuracy"], num_workers=2,
                    communication_window=4)
    settings.update(kwargs)
    return ADAG(**settings)


def call_api(url, path, secret=None, body=None, method=None, data=None, timeout=60):
    """One request to the server: (HTTP status, the JSON answer); POST when there is a body."""
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


def upload_status(url, secret, data):
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


def wait_for(predicate, timeout=120, interval=0.2):
    """Whether ``predicate()`` became true within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False


def group_alive(pid):
    """Whether the process group ``pid`` still has a process."""
    try:
        os.killpg(pid, 0)
        return True
    except ProcessLookupError:
        return False


def free_port():
    """A port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def reachable(url):
    """Whether a Punchcard answers at ``url``."""
    try:
        return call_api(url, "/api/state", "not-a-secret")[0] == 403
    except urllib.error.URLError:
        return False


def deflated_config(payload, padding):
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


def with_config(model_bytes, edit):
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


def widened(config, units=200_000):
    """The MLP's config with every Dense of ``units`` (and no build shapes to disagree)."""
    for layer in config["config"]["layers"]:
        if layer["class_name"] == "Dense":
            layer["config"]["units"] = units
            layer.pop("build_config", None)
    return config


def finished_job(running, secret, data_path):
    """A job submitted, then marked finished with its result files written (no Spark)."""
    Job(secret, "done", data_path, 1, 1, adag_trainer()).send(running.url)
    row = running.punchcard.store.by_secret(secret_hash(secret))
    running.punchcard.store.finish(row["id"], "finished", only_if_state="queued")
    with open(os.path.join(row["job_dir"], "trained.keras"), "wb") as handle:
        handle.write(b"model")
    with open(os.path.join(row["job_dir"], "history.json"), "w", encoding="utf-8") as handle:
        json.dump([{"loss": 1.0}], handle)
    return row


def staggered(count, call):
    """``call()`` from ``count`` threads, each started 0.1 s after the one before."""
    with ThreadPoolExecutor(count) as pool:
        futures = []
        for _ in range(count):
            futures.append(pool.submit(call))
            time.sleep(0.1)
        return [future.result() for future in futures]


class SlowCheckPunchcard(Punchcard):
    """Takes 1 s to check each submission, as a model of hundreds of layers takes longer;
    counts the checks."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.checks = 0

    def submit(self, secret_hash, identity, body):
        if self.store.by_secret(secret_hash) is None:  # checked, not refused as busy
            self.checks += 1
            time.sleep(1.0)
        return super().submit(secret_hash, identity, body)
