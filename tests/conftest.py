"""Shared fixtures: one local[2] SparkSession for the whole run, Fashion-MNIST subsets."""

import os

import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
# The short-lived JVMs of the run (those of the CLI, Punchcard, backend, notebook and cluster
# tests, which inherit the environment) compile with C1 alone: their jobs are small, and on
# 2 cores C2's compiler threads took the CPU that start-up needed (those tests took 0.66-0.9
# of their time). The shared session's JVM, which runs for the whole suite, keeps C2: with
# C1 alone its tests took 1.1-1.7 times as long. What a JVM computes does not change.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTIONS)  # drivers (spark-submit)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", TEST_JVM_OPTIONS)  # standalone master, workers

# The Punchcard files' fixtures (`secrets`, `data_path`, `server`), shared by tests/punchcard/.
pytest_plugins = ["punchcard_support"]

TRAIN_LIMIT = 6000

# The longest test files, longest first (by their time in a full run; files of 25 s or more).
# The suite runs in two processes, each taking the next whole file as it finishes one
# (pytest-xdist, --dist loadfile, in collection order: `pytest_configure` keeps xdist from
# reordering the files by their number of tests): started last, a long file kept one process
# busy for minutes after the other had finished. A file far longer than the others is split.
LONGEST_FILES_FIRST = [
    "test_validation.py", "test_trainer_contract.py", "test_punchcard_jobs.py",
    "test_training.py", "test_cli.py", "test_punchcard_client.py", "test_predictors.py",
    "test_connect.py",
    "test_transformers.py", "test_reliability.py", "test_punchcard_requests.py",
    "test_backends.py", "test_server_placement.py", "test_punchcard_restarts.py",
    "test_feed.py", "test_estimator.py",
    "test_workflow_notebook.py", "test_dist_keras_examples.py", "test_dist_keras_compat.py",
    "test_checkpoints.py", "test_extension_api.py", "test_experiments.py",
    "test_punchcard_attacks.py", "test_datasets.py", "test_parquet_source.py",
    "test_single_epochs.py", "test_networking.py", "test_sample_weights.py",
    "test_custom_objects.py", "test_parameter_server.py", "test_tensors.py", "test_cluster.py",
    "test_averaging.py", "test_evaluator_losses.py", "test_model_logic.py",
]


# Tests that start Spark without the `spark` fixture: a JVM in a subprocess (a driver
# script, a notebook, another Keras backend, a standalone cluster's daemons). They get the
# `spark` marker here, so that `pytest -m "not spark"` runs only what needs no JVM. A file
# named alone: all its tests; a (file, name) pair: that test (every parametrised case).
# Files are named by base name (unique across tests/'s folders: tests/product/test_markers.py).
SPARK_WITHOUT_FIXTURE = {
    "test_cluster.py",
    "test_gpu_tasks.py",
    ("test_backends.py", "test_training_and_prediction_run_on_the_backend"),
    ("test_workflow_notebook.py", "test_workflow_notebook_runs"),
    ("test_reliability.py", "test_ctrl_c_stops_everything_and_the_next_training_works"),
    ("test_dist_keras_compat.py",
     "test_an_executor_python_without_distkeras_is_named_with_the_setting_to_change"),
    ("test_punchcard_attacks.py", "test_a_failed_jobs_error_quotes_no_bytes_of_its_data"),
}

# Tests that start no JVM but run whole scripts or several Python processes that each import
# Keras (a benchmark script, a second worker process, a strict docs build, Punchcard's model
# checks in children): 10-80 s each on 2 cores. They get the `slow` marker, so that the
# day-to-day subset, `pytest -m "not spark and not slow"`, runs in under two minutes.
SLOW = {
    "test_scaling_scripts.py",
    "test_gpu_check.py",
    "test_compilation_cache.py",
    ("test_model_transport.py", "test_moving_models_does_not_import_an_installed_tensorflow"),
    ("test_parameter_server.py", "test_stop_while_clients_keep_connecting"),  # 10 stops, 1 s each
    ("test_docs_site.py", "test_site_builds_strictly"),
    ("test_punchcard_attacks.py", "test_threads_stay_healthy_after_hostile_submissions"),
    ("test_punchcard_jobs.py",
     "test_a_stale_destroy_after_the_secrets_next_job_was_sent_deletes_nothing"),
    ("test_punchcard_jobs.py", "test_a_cluster_job_asks_spark_for_the_executors_it_was_given"),
    ("test_punchcard_jobs.py",
     "test_a_job_cancelled_then_destroyed_while_it_starts_leaves_no_process"),
    ("test_punchcard_requests.py",
     "test_a_model_declaring_more_weights_than_its_archive_holds_is_refused_unbuilt"),
    ("test_punchcard_requests.py", "test_legitimate_models_pass_the_weight_count"),
    ("test_punchcard_restarts.py",
     "test_a_restart_stops_the_process_of_a_job_cancelled_just_before"),
}


def pytest_configure(config):
    """Keeps the order of `pytest_collection_modifyitems` (LONGEST_FILES_FIRST) for
    ``--dist loadfile``: pytest-xdist (3.6 on) otherwise hands the files out by their number
    of tests, most first, which put the long files of few tests (a notebook, the backends, a
    standalone cluster, dist-keras's example) at the end of the run."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def _listed(item, names):
    """Whether ``item``'s file, or its (file, test name) pair, is in ``names``."""
    name = item.path.name
    return name in names or (name, getattr(item, "originalname", item.name)) in names


def needs_spark(item):
    """Whether ``item`` starts Spark: through the `spark` fixture (directly or through
    another fixture, such as `fashion_train`), or as listed in `SPARK_WITHOUT_FIXTURE`."""
    return "spark" in getattr(item, "fixturenames", ()) or _listed(item, SPARK_WITHOUT_FIXTURE)


def pytest_collection_modifyitems(items):
    """Marks the tests that start Spark (`needs_spark`) and the slow ones (`SLOW`), then runs
    the longest files first (see LONGEST_FILES_FIRST); the rest keep their order."""
    for item in items:
        if needs_spark(item):
            item.add_marker(pytest.mark.spark)
        if _listed(item, SLOW):
            item.add_marker(pytest.mark.slow)

    def rank(item):
        name = item.path.name
        return LONGEST_FILES_FIRST.index(name) if name in LONGEST_FILES_FIRST else len(
            LONGEST_FILES_FIRST)

    items.sort(key=rank)  # stable: tests within a file keep their order


@pytest.fixture(scope="session")
def spark():
    # Spark starts before Keras/JAX are imported by the tests that use it.
    from distkeras.session import local_spark_session

    # local[2,4]: two tasks at once, and a failed task is retried (up to 4 attempts), as on
    # a cluster.
    ours = os.environ.get("SPARK_SUBMIT_OPTS") == TEST_JVM_OPTIONS
    if ours:
        del os.environ["SPARK_SUBMIT_OPTS"]
    try:
        # The shared session also serves Spark Connect (the `connect` fixture), on a port
        # of its own: `remote("local[...]")` would need a process without this session and
        # always listens on 15002, which two test processes at once would share.
        session = local_spark_session(
            "local[2,4]", app_name="distkeras-tests",
            **{"spark.plugins": "org.apache.spark.sql.connect.SparkConnectPlugin",
               "spark.connect.grpc.binding.address": "127.0.0.1",
               "spark.connect.grpc.binding.port": str(_free_port())})
    finally:
        if ours:
            os.environ["SPARK_SUBMIT_OPTS"] = TEST_JVM_OPTIONS
    yield session
    session.stop()


def _free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def connect(spark):
    """A Spark Connect session (a real gRPC client) on the Connect server of the shared
    session's JVM: the same executors, reached only as a Connect client reaches them."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    port = spark.conf.get("spark.connect.grpc.binding.port")
    session = ConnectSession.builder.remote(f"sc://127.0.0.1:{port}").create()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def fashion_train(spark):
    from distkeras.datasets import load_fashion_mnist

    return load_fashion_mnist(spark, "train", limit=TRAIN_LIMIT).cache()


@pytest.fixture(scope="session")
def fashion_test():
    from distkeras.datasets import load_fashion_mnist_numpy

    images, labels = load_fashion_mnist_numpy("test")
    return images[:2000].reshape(2000, -1).astype("float32") / 255.0, labels[:2000]


def build_mlp(hidden=128):
    import keras

    return keras.Sequential([
        keras.Input((784,)),
        keras.layers.Dense(hidden, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])


def accuracy(model, data):
    images, labels = data
    return float((model.predict(images, batch_size=1000, verbose=0).argmax(1) == labels).mean())


@pytest.fixture
def servers():
    """Starts parameter servers on 127.0.0.1, port 0, on demand; stops every one afterwards.

    ``servers(cls, model=None, **kwargs)``: the model defaults to `ps_support.make_model()`.
    """
    from distkeras.parameter_servers import DeltaParameterServer
    from ps_support import make_model

    started = []

    def start(cls=DeltaParameterServer, model=None, **kwargs):
        server = cls(model if model is not None else make_model(), 0, **kwargs)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _jvm_started():
    """Whether this process has started Spark's JVM (it stays after the session stops)."""
    import sys

    pyspark = sys.modules.get("pyspark")
    return pyspark is not None and pyspark.SparkContext._gateway is not None


@pytest.fixture(autouse=True)
def _no_unmarked_spark(request):
    """Fails a test without the `spark` marker that starts Spark's JVM in this process:
    `pytest -m "not spark"` must run without one (mark it, or list it in
    `SPARK_WITHOUT_FIXTURE`)."""
    before = _jvm_started()
    yield
    if not before and _jvm_started() and request.node.get_closest_marker("spark") is None:
        pytest.fail(f"{request.node.nodeid} started Spark without the spark marker: give it "
                    "the spark fixture or list it in SPARK_WITHOUT_FIXTURE (tests/conftest.py).")
