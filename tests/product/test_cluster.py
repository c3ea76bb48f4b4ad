"""A real Spark standalone cluster on 127.0.0.1: a master, two workers, one executor JVM
each; ADAG trains through ``spark://`` and its executors reach the driver's parameter
server by address."""

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _spark_class():
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-class")


def _wait_for_port(port, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.3)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cluster")
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1",
               PYSPARK_PYTHON=sys.executable)
    master_port = _free_port()
    processes = [subprocess.Popen(
        [_spark_class(), "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
         "--port", str(master_port), "--webui-port", str(_free_port())],
        env=env, stdout=open(folder / "master.log", "wb"), stderr=subprocess.STDOUT,
        start_new_session=True)]
    try:
        _wait_for_port(master_port)
        url = f"spark://127.0.0.1:{master_port}"
        for index in range(2):
            work = folder / f"worker{index}"
            work.mkdir()
            processes.append(subprocess.Popen(
                [_spark_class(), "org.apache.spark.deploy.worker.Worker", url,
                 "--host", "127.0.0.1", "--cores", "1", "--memory", "2g",
                 "--webui-port", str(_free_port()), "--work-dir", str(work)],
                env=env, stdout=open(folder / f"worker{index}.log", "wb"),
                stderr=subprocess.STDOUT, start_new_session=True))
        # No wait for the workers here: they register while the driver starts, and the
        # driver waits for both executors (minRegisteredResourcesRatio) before it trains.
        yield url, folder
    finally:
        for process in processes:
            try:
                os.killpg(process.pid, 9)
            except ProcessLookupError:
                pass
            process.wait(timeout=30)


DRIVER = textwrap.dedent("""
    import json, sys
    from distkeras.session import local_spark_session
    spark = local_spark_session({master!r}, **{{
        "spark.executor.cores": "1", "spark.cores.max": "2",
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
        "spark.executor.extraJavaOptions": {jvm_options!r}}})
    sys.path.insert(0, {tests!r})
    from conftest import build_mlp, accuracy
    from distkeras.datasets import load_fashion_mnist_numpy
    from distkeras.trainers import ADAG
    data = spark.read.parquet({data!r})
    trainer = ADAG(keras_model=build_mlp(), worker_optimizer="adam",
                   loss="categorical_crossentropy", num_workers=2, communication_window=4)
    model = trainer.train(data, verbose=0)
    images, labels = load_fashion_mnist_numpy("test")
    images = images[:2000].reshape(2000, -1).astype("float32") / 255.0
    executors = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size() - 1
    print("RESULT " + json.dumps({{"accuracy": accuracy(model, (images, labels[:2000])),
                                  "workers": sorted({{r["worker_id"] for r in trainer.get_history()}}),
                                  "executors": executors,
                                  "updates": trainer.parameter_server.num_updates}}))
    spark.stop()
""")


def test_adag_on_a_standalone_cluster(cluster, fashion_train, tmp_path):
    url, folder = cluster
    data = str(tmp_path / "data.parquet")
    fashion_train.limit(3000).write.parquet(data)
    tests = os.path.dirname(os.path.dirname(__file__))
    script = DRIVER.format(master=url, tests=tests, data=data,
                           jvm_options=os.environ.get("SPARK_SUBMIT_OPTS", ""))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=400, env=dict(os.environ, PYSPARK_PYTHON=sys.executable))
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, result.stderr[-3000:]
    outcome = json.loads(lines[0][len("RESULT "):])
    assert outcome["executors"] == 2  # two executor JVMs, one per worker
    assert outcome["workers"] == [0, 1] and outcome["updates"] > 0
    assert outcome["accuracy"] > 0.6  # as on local[2] (about 0.7 on this subset)
