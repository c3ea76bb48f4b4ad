"""Shared fixtures: one local[2] SparkSession for the whole run, Fashion-MNIST subsets."""

import os

import pytest

os.environ.setdefault("KERAS_BACKEND", "jax")
# Every JVM of the run (this session's, and those of the CLI, Punchcard, backend, notebook and
# cluster tests, which inherit the environment) compiles with C1 alone: the tests' jobs are
# small and their JVMs short-lived, and on 2 cores C2's compiler threads took the CPU that
# start-up needed (a JVM's start and first jobs took about half the wall time with C1 alone
# on this machine). What the JVM computes does not change.
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
os.environ.setdefault("SPARK_SUBMIT_OPTS", TEST_JVM_OPTIONS)  # drivers (spark-submit)
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", TEST_JVM_OPTIONS)  # standalone master, workers

TRAIN_LIMIT = 6000


@pytest.fixture(scope="session")
def spark():
    # Spark starts before Keras/JAX are imported by the tests that use it.
    from distkeras.session import local_spark_session

    # local[2,4]: two tasks at once, and a failed task is retried (up to 4 attempts), as on
    # a cluster.
    session = local_spark_session("local[2,4]", app_name="distkeras-tests")
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
