"""Punchcard's client (`Job`) against a real server on 127.0.0.1: the README's example as
printed, what a job sends and gets back, and answers that are not a Punchcard's."""

import os
import threading

import pytest
from conftest import accuracy, build_mlp
from punchcard_support import (RunningServer, SlowCheckPunchcard, adag_trainer, call_api,
                               finished_job, wait_for)

from distkeras.job_deployment import Job
from distkeras.punchcard.client import JobError, ServerUnreachable
from distkeras.punchcard.secrets_file import secret_hash


def test_readme_client_example_runs_as_printed(server, secrets, data_path, fashion_test,
                                               monkeypatch):
    """The client block of docs/guide/punchcard-clients.md, as printed. Its first job is
    also the seed's session (one job, 1 executor x 2 processes, whose model comes back
    trained), and its second shows that train() options reach the job (rows held out,
    validated each epoch): both checked here rather than in jobs of their own (each job is
    a Spark application)."""
    from readme_support import readme_block, run_as_main

    from distkeras import job_deployment

    made = []

    class RecordedJob(job_deployment.Job):
        """The block's `Job`, each one kept for the checks below."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(job_deployment, "Job", RecordedJob)
    code = readme_block("Punchcard: remote jobs")
    # The changes: the block's cluster is this server and its data, and its jobs are of
    # 1 executor x 2 processes (the same 2 workers at a time as 4 x 2 on local[2]).
    for printed, here in (('"hdfs:///data/fashion.parquet"', "path"),
                          ('"http://yourcluster:8000"', "url"), (", 4, 2, ", ", 1, 2, ")):
        assert printed in code
        code = code.replace(printed, here)
    secret = secrets[1][4]
    namespace = run_as_main(code, secret=secret, trainer=adag_trainer(), path=data_path,
                            url=server.url)

    # The first job's: trained_model and history are not assigned again after it.
    trained_model, history = namespace["trained_model"], namespace["history"]
    assert trained_model.compiled
    assert accuracy(trained_model, fashion_test) > 0.6
    assert sum(record["batch_size"] for record in history) == 2000
    assert {record["worker_id"] for record in history} == {0, 1}  # 1 executor x 2 processes
    # The second job's train_options (validation, shuffle, class_weight) reached it.
    (weighted,) = [job for job in made if job.job_name == "weighted"]
    assert weighted.train_options == {"validation": 0.1, "shuffle": True,
                                      "class_weight": {1: 5.0}}
    trained = sum(record["batch_size"] for record in weighted.get_history())
    assert 1700 < trained < 1900  # about a tenth of the 2,000 rows held out
    (last,) = weighted.get_validation_history()[-1:]
    assert last["epoch"] == 1 and last["samples"] == trained and 0 < last["val_loss"] < 5
    assert namespace["job"].state == "cancelled"
    assert call_api(server.url, "/api/state", secret)[0] == 404  # destroyed: the secret is free
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
                            punchcard_class=SlowCheckPunchcard)
    try:
        job = Job(secrets[1][9], "slow", data_path, 1, 1, adag_trainer())
        with pytest.raises(JobError, match="did not answer the submission.*within 0.3 s.*attach"):
            job.send(running.url, timeout=0.3)
        # The server queued it all the same, and the job follows it.
        assert wait_for(lambda: running.punchcard.store.by_state("queued"), timeout=30)
        assert job.attach(running.url)["state"] == "queued"
    finally:
        running.stop()


def test_failed_or_cancelled_job_is_cleared_with_destroy(secrets, tmp_path, data_path):
    # max_running=0: jobs stay queued, so no Spark is needed here.
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0)
    try:
        secret = secrets[1][9]
        job = Job(secret, "first", data_path, 1, 1, adag_trainer())
        job.send(running.url)
        with pytest.raises(JobError, match=r"already has a job \('first', queued\).*"
                                           r"job\.destroy\(\)"):
            Job(secret, "second", data_path, 1, 1, adag_trainer()).send(running.url)
        job.cancel()
        with pytest.raises(JobError, match=r"cancelled.*call job\.destroy\(\)"):
            job.wait_completion(timeout=10, poll_interval=0.1)
        assert job.get_state()["state"] == "cancelled"  # still there, until destroyed
        assert job.destroy() == {"state": "cancelled", "error": "cancelled by the client"}
        with pytest.raises(JobError, match="404"):
            job.get_state()
        Job(secret, "second", data_path, 1, 1, adag_trainer()).send(running.url)
    finally:
        running.stop()


def test_a_failed_jobs_error_reads_as_one_sentence(secrets, tmp_path, data_path):
    # The job's own error ends with a period (ValueError's messages do): not "..".
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0)
    try:
        secret = secrets[1][14]
        job = Job(secret, "fails", data_path, 1, 1, adag_trainer())
        job.send(running.url)
        row = running.punchcard.store.by_secret(secret_hash(secret))
        running.punchcard.store.finish(row["id"], "failed", "ValueError: Column 5 is wrong.")
        with pytest.raises(JobError) as raised:
            job.wait_completion(timeout=10, poll_interval=0.1)
        assert "Column 5 is wrong. It keeps this secret busy" in str(raised.value)
    finally:
        running.stop()


def test_a_compiled_model_lends_its_settings_to_a_job():
    # README: `ADAG(keras_model=compiled_model, num_workers=4)` trains with what its fit
    # would use; a job of that trainer must be accepted, and its model come back compiled.
    import keras

    from distkeras.punchcard.submissions import validate_submission
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

    from distkeras.punchcard.submissions import BadRequest, validate_submission
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


def test_a_job_larger_than_the_server_accepts_says_so(secrets, tmp_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_request_bytes=1 << 20)
    try:
        job = Job(secrets[1][12], "large", "/data/fashion.parquet", 1, 2,
                  adag_trainer(keras_model=build_mlp(hidden=1000)))  # a 4 MB submission
        # waitress closes the connection while the body is sent: not "cannot reach".
        with pytest.raises(JobError, match="larger than") as raised:
            job.send(running.url)
        assert not isinstance(raised.value, ServerUnreachable)
        assert running.punchcard.store.by_state("queued", "running") == []
    finally:
        running.stop()


def test_the_client_fetches_the_results_before_it_destroys_the_job(secrets, tmp_path,
                                                                    data_path):
    running = RunningServer(secrets[0], str(tmp_path / "work"), max_running=0)
    try:
        secret = secrets[1][23]
        finished_job(running, secret, data_path)
        job = Job(secret, "done", data_path, 1, 1, None)
        assert job.attach(running.url)["state"] == "finished"
        assert job.destroy() == {"state": "finished", "error": None}
        assert job.model_bytes == b"model" and job.get_history() == [{"loss": 1.0}]
        assert running.punchcard.store.by_secret(secret_hash(secret)) is None
        # A job that did not finish has no results to fetch: destroyed all the same.
        Job(secret, "queued", data_path, 1, 1, adag_trainer()).send(running.url)
        cancelled = Job(secret, "queued", data_path, 1, 1, None)
        cancelled.attach(running.url)
        cancelled.cancel()
        assert cancelled.destroy()["state"] == "cancelled"
        assert cancelled.model_bytes is None
        status, answer = call_api(running.url, "/api/result", secret)
        assert status == 404 and answer["error"] == "This secret has no job."
    finally:
        running.stop()
