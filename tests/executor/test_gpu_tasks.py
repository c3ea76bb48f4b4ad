"""Spark tasks given GPUs, on a machine without one: a local Spark whose discovery script
reports two fake GPUs (as Spark's own tests do), each task given one. Each task sees its
own GPU, two tasks at once see different ones, addresses index into an executor's
CUDA_VISIBLE_DEVICES, and a training on JAX's CPU backend still runs and learns, also in
the child process a reused Python worker needs.

The Spark session runs in a child process (`DRIVER`): its GPU settings are fixed when
Spark starts, and the test run's shared session has none.
"""

import json
import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DRIVER = textwrap.dedent('''
    import json, os, sys, time
    from distkeras.session import local_spark_session

    spark = local_spark_session(
        "local-cluster[1,2,1024]", "distkeras-gpu-tests",
        **{"spark.worker.resource.gpu.amount": "2",
           "spark.worker.resource.gpu.discoveryScript": sys.argv[1],
           "spark.executor.resource.gpu.amount": "2",
           "spark.executor.resource.gpu.discoveryScript": sys.argv[1],
           "spark.task.resource.gpu.amount": "1"})

    def seen(record_batches):
        import pyarrow as pa
        from pyspark import TaskContext
        from distkeras.executor.devices import task_devices

        for _ in record_batches:
            pass
        with task_devices():
            start = time.time()
            time.sleep(1.5)  # both tasks of the job at once
            yield pa.RecordBatch.from_pydict({
                "assigned": [",".join(TaskContext.get().resources()["gpu"].addresses)],
                "visible": [os.environ.get("CUDA_VISIBLE_DEVICES")],
                "start": [start], "end": [time.time()]})

    rows = spark.range(0, 2, 1, 2).mapInArrow(
        seen, "assigned string, visible string, start double, end double").collect()
    out = {"tasks": [row.asDict() for row in rows]}

    import keras
    import numpy as np
    from distkeras import trainers, workers
    from distkeras.executor import devices

    def loaded_elsewhere(record_batches):
        # Keras in these Python workers "runs" on a GPU no task is given: the training
        # tasks that Spark runs in them next must train in a child process.
        import pyarrow as pa
        import keras  # noqa: F401
        from distkeras.executor import devices as task_side

        for _ in record_batches:
            pass
        task_side._LOADED["devices"] = "9"
        time.sleep(1.5)
        yield pa.RecordBatch.from_pydict({"pid": [os.getpid()]})

    pids = {row.pid for row in spark.range(0, 2, 1, 2).mapInArrow(
        loaded_elsewhere, "pid long").collect()}

    WHERE = sys.argv[2]  # a global of this script: shipped with the class, by value

    class Where(workers.ADAGWorker):
        def result(self):  # where this worker trained, in a line of its own
            with open(os.path.join(WHERE, f"{os.getpid()}.json"), "w") as file:
                json.dump([os.getpid(), os.environ.get("CUDA_VISIBLE_DEVICES")], file)
            return super().result()

    class WhereADAG(trainers.ADAG):
        def allocate_worker(self):
            return Where(self.master_model)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(800, 6)).astype("float32")
    y = (x[:, 0] > 0).astype("float32") + (x[:, 1] > 1).astype("float32")
    frame = spark.createDataFrame(
        [(row.tolist(), np.eye(3)[int(label)].tolist()) for row, label in zip(x, y)],
        "features array<float>, label array<float>")
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(3, activation="softmax")])
    trainer = WhereADAG(keras_model=model, worker_optimizer=keras.optimizers.Adam(0.02),
                        loss="categorical_crossentropy", num_workers=2,
                        batch_size=32, num_epoch=3, features_col="features",
                        label_col="label", communication_window=4)
    trained = trainer.train(frame)
    accuracy = float((trained.predict(x, verbose=0).argmax(1) == y).mean())
    out.update(accuracy=accuracy, prepared=sorted(pids),
               where=[json.load(open(os.path.join(sys.argv[2], name)))
                      for name in os.listdir(sys.argv[2])])
    print("RESULT " + json.dumps(out))
    spark.stop()
''')


def _run_driver(tmp_path, environment):
    discovery = tmp_path / "gpus.sh"
    discovery.write_text('#!/bin/sh\necho \'{"name": "gpu", "addresses": ["0", "1"]}\'\n')
    discovery.chmod(0o755)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]),
               PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", **environment)
    where = tmp_path / "where"
    where.mkdir()
    done = subprocess.run([sys.executable, str(script), str(discovery), str(where)], env=env,
                          capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    errors = done.stderr[done.stderr.find("Traceback"):][:6000]  # Python's, not the JVM's
    assert done.returncode == 0 and lines, errors
    return json.loads(lines[0][len("RESULT "):])


def test_tasks_see_their_own_gpus_and_training_learns(tmp_path):
    # The executor (here the local driver) was given GPUs 5 and 7 of its machine: the
    # addresses 0 and 1 index into them, as TorchDistributor reads them.
    result = _run_driver(tmp_path, {"CUDA_VISIBLE_DEVICES": "5,7"})
    tasks = result["tasks"]
    assert sorted(task["assigned"] for task in tasks) == ["0", "1"]
    assert {task["assigned"]: task["visible"] for task in tasks} == {"0": "5", "1": "7"}
    first, second = tasks
    assert first["start"] < second["end"] and second["start"] < first["end"]  # at once
    # Each worker trained in a child process of its own (not the Python worker whose
    # Keras "ran" on GPU 9), which saw only its task's GPU, and the model learned.
    assert sorted(visible for _, visible in result["where"]) == ["5", "7"]
    assert not {pid for pid, _ in result["where"]} & set(result["prepared"])
    assert result["accuracy"] > 0.8, result
