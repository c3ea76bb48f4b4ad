"""Failures the driver must survive: stalled workers, poisoned updates, back-to-back runs."""

import logging
import threading
import time

import numpy as np
import pytest
from conftest import build_mlp

from distkeras.transport import networking
from distkeras.transport.networking import weights_array
from distkeras.parameter_servers import DeltaParameterServer
from distkeras.trainers import ADAG, SingleTrainer, TrainingError
from distkeras.workers import ADAGWorker, SequentialWorker
from worker_support import FailingOnceADAG


class SleepyWorker(ADAGWorker):
    """Commits once, then hangs (as a worker stuck on I/O or a deadlock would)."""

    def communicate(self):
        super().communicate()
        if self.worker_id == 0:
            time.sleep(600)


class SleepyADAG(ADAG):
    def allocate_worker(self):
        return SleepyWorker(self.master_model)


def _distkeras_threads():
    return [thread for thread in threading.enumerate()
            if thread.name.startswith("distkeras") and thread.is_alive()]


def test_stalled_worker_fails_the_training_with_its_name(fashion_train):
    trainer = SleepyADAG(keras_model=build_mlp(), worker_optimizer="adam",
                         loss="categorical_crossentropy", num_workers=2,
                         communication_window=2, worker_timeout=3)
    started = time.monotonic()
    with pytest.raises(TrainingError, match=r"worker 0 sent nothing for \d+ s"):
        trainer.train(fashion_train.limit(2000), verbose=0)
    assert time.monotonic() - started < 120
    assert _distkeras_threads() == []
    # The steps trained before the failure stay in the history: worker 0's first window
    # reached the server with its commit, before the worker stalled.
    assert [record["iteration"] for record in trainer.get_executor_history(0)][:2] == [1, 2]


class SlowCompileWorker(ADAGWorker):
    """Each step that compiles (the first window, the short last batch) takes
    ``compile_seconds``, as JAX's compiles do on a busy executor."""

    compile_seconds = 3.5

    def prepare_model(self):
        super().prepare_model()
        for name in ("train_on_window", "train_on_batch"):
            setattr(self.model, name, self._slow_first(getattr(self.model, name)))

    def _slow_first(self, method):
        sizes = set()

        def run(*args, **kwargs):
            batches = args[0] if method.__name__ == "train_on_window" else [args]
            key = (len(batches), len(batches[0][0]))
            if key not in sizes:
                sizes.add(key)
                time.sleep(self.compile_seconds)
            return method(*args, **kwargs)
        return run


class SlowCompileADAG(ADAG):
    def allocate_worker(self):
        return SlowCompileWorker(self.master_model)


def test_worker_timeout_allows_for_compiles(fashion_train):
    # Compiling the first window and the short last batch (500 rows, batch 32) is silence
    # longer than worker_timeout; it stopped healthy workers as "sent nothing for 3 s".
    trainer = SlowCompileADAG(keras_model=build_mlp(), worker_optimizer="adam",
                              loss="categorical_crossentropy", num_workers=2,
                              communication_window=4, worker_timeout=2)
    trainer.train(fashion_train.limit(1000), verbose=0)
    assert sum(len(trainer.get_executor_history(worker)) for worker in (0, 1)) == 32


def test_worker_hung_while_compiling_is_named(fashion_train, monkeypatch):
    from distkeras.training.monitor import TrainingMonitor

    monkeypatch.setattr(TrainingMonitor, "STARTUP_TIMEOUT", 3.0)
    monkeypatch.setattr(SlowCompileWorker, "compile_seconds", 600)
    trainer = SlowCompileADAG(keras_model=build_mlp(), worker_optimizer="adam",
                              loss="categorical_crossentropy", num_workers=2,
                              communication_window=4, worker_timeout=1)
    with pytest.raises(TrainingError, match=r"sent nothing for \d+ s while starting or "
                                            r"compiling a step \(allowed: 3 s"):
        trainer.train(fashion_train.limit(400), verbose=0)


def test_back_to_back_trainings_leak_nothing(fashion_train):
    data = fashion_train.limit(400)
    ports = []
    for _ in range(2):
        trainer = ADAG(keras_model=build_mlp(), worker_optimizer="adam",
                       loss="categorical_crossentropy", num_workers=2, master_port=0)
        trainer.train(data, verbose=0)
        ports.append(trainer.parameter_server.port)
        assert _distkeras_threads() == []
    assert all(port > 0 for port in ports)


def test_non_finite_commit_is_refused_and_the_worker_goes_on():
    import keras

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    server = DeltaParameterServer(model, 0)
    server.start()
    try:
        sock = networking.connect("127.0.0.1", server.port, timeout=5)
        networking.authenticate(sock, server.token, 7)
        before = [layer.copy() for layer in server.center_variable]
        poisoned = weights_array(np.full(w.shape, np.nan, w.dtype) for w in before)
        poisoned[1][0] = np.inf
        networking.send_action(sock, networking.ACTION_COMMIT)
        networking.send_data(sock, {"delta": poisoned})
        networking.send_action(sock, networking.ACTION_PULL)
        center = networking.recv_data(sock)["center"]  # the connection is still open
        assert all(np.array_equal(a, b) for a, b in zip(center, before))
        assert server.center.refused == 1 and server.num_updates == 0
        assert server.center.refused_by_worker == {7: 1}
        honest = weights_array(np.ones(w.shape, w.dtype) for w in before)
        networking.send_action(sock, networking.ACTION_COMMIT)
        networking.send_data(sock, {"delta": honest})
        networking.send_action(sock, networking.ACTION_PULL)
        center = networking.recv_data(sock)["center"]
        assert all(np.array_equal(a, b + 1) for a, b in zip(center, before))
        networking.send_action(sock, networking.ACTION_QUIT)
        sock.close()
    finally:
        server.stop()


def test_progress_bar_shows_samples(fashion_train, capsys):
    trainer = ADAG(keras_model=build_mlp(), worker_optimizer="adam",
                   loss="categorical_crossentropy", num_workers=2, communication_window=2)
    trainer.train(fashion_train.limit(3000), verbose=1)
    err = capsys.readouterr().err
    assert "sample" in err and "loss=" in err and "commits/s=" in err
    trainer.train(fashion_train.limit(3000), verbose=0)
    assert "sample" not in capsys.readouterr().err
    # The default in a log (pytest's captured stderr is no terminal): plain lines, no
    # carriage returns, the last one at the end with every sample counted.
    trainer.train(fashion_train.limit(3000))
    lines = capsys.readouterr().err.splitlines()
    progress = [line for line in lines if line.startswith("ADAG: ")]
    assert progress and progress[-1].startswith("ADAG: 3000/3000 samples, ")
    assert "commits/s=" in progress[-1] and "loss=" in progress[-1]
    assert not any("\r" in line for line in lines)


def test_single_trainer_shows_its_progress_too(fashion_train, capsys):
    from distkeras.trainers import SingleTrainer

    trainer = SingleTrainer(build_mlp(), "adam", "categorical_crossentropy", num_epoch=2)
    trainer.train(fashion_train.limit(1000), verbose=2)
    lines = capsys.readouterr().err.splitlines()
    progress = [line for line in lines if line.startswith("SingleTrainer: ")]
    assert progress and progress[-1].startswith("SingleTrainer: 2000/2000 samples, ")
    assert "loss=" in progress[-1] and "commits/s" not in progress[-1]
    # Every step reached the history, through the progress reports.
    history = trainer.get_history()
    assert sum(record["batch_size"] for record in history) == 2000
    # 32 steps an epoch (31 of 32 rows, one of 8), as fit: no step spans two epochs.
    assert sorted(record["iteration"] for record in history) == list(range(1, 65))
    # Validating: both epochs in one task, waiting at the first's end; the second epoch's
    # progress (its last line at least) shows the first's validation loss.
    trainer.train(fashion_train.limit(1000), verbose=2, validation_data=0.2)
    lines = capsys.readouterr().err.splitlines()
    progress = [line for line in lines if line.startswith("SingleTrainer: ")]
    assert progress and "val_loss=" in progress[-1]
    assert trainer.parameter_server is not None


@pytest.mark.parametrize("verbose", [1, 2])
def test_the_progress_ends_with_the_returned_models_validation(fashion_train, capsys,
                                                               verbose):
    from distkeras.trainers import SingleTrainer

    # The last epoch is validated on the returned model after the progress ended: its
    # bar or line shows the epoch before's val_loss, so a line says the last one's.
    trainer = SingleTrainer(build_mlp(), "adam", "categorical_crossentropy", num_epoch=2)
    trainer.train(fashion_train.limit(1000), verbose=verbose, validation_data=0.2)
    err = capsys.readouterr().err
    first, last = trainer.get_validation_history()
    assert last["epoch"] == 2 and f"{last['val_loss']:.4f}" != f"{first['val_loss']:.4f}"
    assert err.splitlines()[-1] == (
        f"SingleTrainer, returned model (epoch 2): val_accuracy={last['val_accuracy']:.4f}"
        f", val_loss={last['val_loss']:.4f}")
    trainer.train(fashion_train.limit(1000), verbose=0, validation_data=0.2)
    assert "returned model" not in capsys.readouterr().err


@pytest.mark.parametrize("num_workers", [2, 3])
def test_averaging_trainer_shows_its_progress(fashion_train, capsys, num_workers):
    from distkeras.trainers import AveragingTrainer

    trainer = AveragingTrainer(build_mlp(), "adam", "categorical_crossentropy",
                               num_workers=num_workers, num_epoch=2)
    trainer.train(fashion_train.limit(1000), verbose=2)
    lines = capsys.readouterr().err.splitlines()
    if num_workers == 2:  # a slot for each worker: every epoch in one job, one line
        progress = [line for line in lines if line.startswith("AveragingTrainer: ")]
        assert progress and progress[-1].startswith("AveragingTrainer: 2000/2000 samples, ")
        # Its server's commits are epoch ends, not exchanges: no commit rate.
        assert not any("commits/s" in line for line in progress)
    else:  # more workers than local[2]'s slots: a Spark job, and a line, per epoch
        for epoch in (1, 2):
            progress = [line for line in lines
                        if line.startswith(f"AveragingTrainer epoch {epoch}/2: ")]
            assert progress and progress[-1].startswith(
                f"AveragingTrainer epoch {epoch}/2: 1000/1000 samples, ")
    history = trainer.get_history()
    assert sum(record["batch_size"] for record in history) == 2000
    assert {record["epoch"] for record in history} == {0, 1}
    assert {record["worker_id"] for record in history} == set(range(num_workers))
    for worker in range(num_workers):  # steps count on across epochs, as for the others
        iterations = [record["iteration"] for record in trainer.get_executor_history(worker)]
        assert iterations == list(range(1, len(iterations) + 1))
    averaged = trainer.get_averaged_history()
    assert len(averaged["loss"]) == max(record["iteration"] for record in history)


def test_ensemble_trainer_shows_its_members_progress_in_one_bar(fashion_train, capsys):
    from distkeras.trainers import EnsembleTrainer

    trainer = EnsembleTrainer(build_mlp(), "adam", "categorical_crossentropy",
                              num_ensembles=2, num_epoch=2, seed=3)
    models = trainer.train(fashion_train.limit(1000), verbose=2)
    assert len(models) == 2
    lines = capsys.readouterr().err.splitlines()
    progress = [line for line in lines if line.startswith("EnsembleTrainer (2 models): ")]
    assert progress and progress[-1].startswith("EnsembleTrainer (2 models): 2000/2000 samples, ")
    history = trainer.get_history()
    assert sum(record["batch_size"] for record in history) == 2000
    assert {record["worker_id"] for record in history} == {0, 1}
    trainer.train(fashion_train.limit(1000), verbose=0)
    assert "EnsembleTrainer (2 models): " not in capsys.readouterr().err


def test_verbose_auto_follows_the_terminal_and_refuses_other_values(monkeypatch):
    import io

    from distkeras.training.monitor import resolve_verbose

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stderr", io.StringIO())
    assert [resolve_verbose(v) for v in ("auto", 0, 1, 2)] == [2, 0, 1, 2]
    monkeypatch.setattr("sys.stderr", Terminal())
    assert resolve_verbose("auto") == 1
    for bad in (3, "yes", True, None):
        with pytest.raises(ValueError, match="`verbose` must be 0"):
            resolve_verbose(bad)


def test_line_progress_writes_at_most_every_interval_and_at_the_end(monkeypatch):
    import io

    from distkeras.training import monitor  # its `time` is patched

    now = [100.0]
    monkeypatch.setattr(monitor.time, "monotonic", lambda: now[0])
    stream = io.StringIO()
    progress = monitor.LineProgress("ADAG", 600, stream=stream)
    progress.update(100, {"loss": "0.9000"})
    now[0] += 31
    progress.update(300, {"loss": "0.5000"})
    now[0] += 5
    progress.update(500, {"loss": "0.4000"})
    assert stream.getvalue() == "ADAG: 300/600 samples, 31 s, loss=0.5000\n"
    now[0] += 1
    progress.update(600, {"loss": "0.3000"})
    progress.close()
    assert stream.getvalue().splitlines()[-1] == "ADAG: 600/600 samples, 37 s, loss=0.3000"
    progress.close()  # nothing new: nothing written
    assert len(stream.getvalue().splitlines()) == 2


class DyingWorker(ADAGWorker):
    """Its process dies mid-training on the first attempt of partition 1 (a lost executor)."""

    def communicate(self):
        import os

        from pyspark import TaskContext

        context = TaskContext.get()
        if self.worker_id == 1 and context.attemptNumber() == 0 and self.iteration >= 24:
            os._exit(17)  # no cleanup, no goodbye: like a killed Python worker
        super().communicate()


class DyingADAG(ADAG):
    def allocate_worker(self):
        return DyingWorker(self.master_model)


class AlwaysFailingWorker(ADAGWorker):
    def communicate(self):
        if self.worker_id == 1:
            raise ValueError("disk full on this executor")
        super().communicate()


class AlwaysFailingADAG(ADAG):
    def allocate_worker(self):
        return AlwaysFailingWorker(self.master_model)


def test_lost_worker_is_retried_and_training_completes(fashion_train, fashion_test):
    from conftest import accuracy

    trainer = DyingADAG(keras_model=build_mlp(), worker_optimizer="adam",
                        loss="categorical_crossentropy", num_workers=2,
                        communication_window=4)
    model = trainer.train(fashion_train.limit(3000), verbose=0)
    assert accuracy(model, fashion_test) > 0.6
    retried = trainer.get_executor_history(1)
    # The retried attempt trained its whole partition again from the current center; the
    # worker's history is that attempt's (the lost one's steps are marked superseded).
    assert sum(record["batch_size"] for record in retried) == 1500
    assert any(record.get("superseded") for record in trainer.get_history())
    assert _distkeras_threads() == []


def test_a_retried_worker_counts_its_steps_once(fashion_train, capsys):
    """The failed attempt's steps stayed in the progress ("4768/4000 samples"), the epochs'
    accounting and the worker's history next to the retry's (iterations twice)."""
    trainer = FailingOnceADAG(keras_model=build_mlp(32), worker_optimizer="adam",
                              loss="categorical_crossentropy", num_workers=2,
                              communication_window=4, num_epoch=2)
    trainer.train(fashion_train.limit(2000), verbose=2)

    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "FailingOnceADAG: 4000/4000 samples")
    for worker_id in (0, 1):
        steps = trainer.get_executor_history(worker_id)
        iterations = [record["iteration"] for record in steps]
        assert sorted(iterations) == list(range(1, len(steps) + 1))
        assert sum(record["batch_size"] for record in steps) == 2000  # 1000 rows, twice
    retried = trainer.get_executor_history(1)
    assert {record.get("attempt") for record in retried} == {1}
    # The failed attempt's steps stay visible (their commits are in the center), marked.
    lost = [record for record in trainer.get_history() if record.get("superseded")]
    assert lost and {(record["worker_id"], record["attempt"]) for record in lost} == {(1, 0)}
    averaged = trainer.get_averaged_history()
    assert "attempt" not in averaged
    assert len(averaged["iteration"]) == max(len(trainer.get_executor_history(w))
                                             for w in (0, 1))


def test_retries_exhausted_names_the_partition_and_cause(fashion_train):
    trainer = AlwaysFailingADAG(keras_model=build_mlp(), worker_optimizer="adam",
                                loss="categorical_crossentropy", num_workers=2,
                                communication_window=4)
    with pytest.raises(TrainingError,
                       match=r"WorkerFailure: partition 1 \(attempt 4\) failed: ValueError: "
                             r"disk full on this executor"):
        trainer.train(fashion_train.limit(1000), verbose=0)
    import socket
    probe = socket.socket()
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    probe.bind(("127.0.0.1", trainer.parameter_server.port))  # the server's port is free
    probe.close()


class CrashingWorker(SequentialWorker):
    """Its Python process dies at once on every attempt (killed, out of memory)."""

    def optimize(self):
        import os

        os._exit(17)  # no exception to report: Spark sees a broken pipe


class CrashingSingleTrainer(SingleTrainer):
    def allocate_worker(self):
        return CrashingWorker(self.master_model)


def test_a_crashed_worker_process_is_named_in_the_training_error(fashion_train):
    """Spark's last "Caused by" for a dead process is a "Connection reset": the user was
    told only that, not that a worker had died."""
    trainer = CrashingSingleTrainer(keras_model=build_mlp(), worker_optimizer="adam",
                                    loss="categorical_crossentropy")
    with pytest.raises(TrainingError) as raised:
        trainer.train(fashion_train.limit(200), verbose=0)
    message = str(raised.value)
    assert "Python worker process exited unexpectedly (task 0." in message
    assert "Connection reset" not in message


def test_a_thousand_silent_connections_do_not_stop_an_honest_worker():
    import socket

    import keras

    import resource

    # Client and server ends live in this one process: 2,000 descriptors and some room.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2400 if hard == resource.RLIM_INFINITY else min(hard, 2400)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    count = min(1000, (wanted - 300) // 2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    server = DeltaParameterServer(model, 0, handshake_timeout=2.0)
    server.start()
    flood = []
    try:
        for _ in range(count):
            flood.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        honest = networking.connect("127.0.0.1", server.port, timeout=10)
        networking.authenticate(honest, server.token, 1)
        before = [layer.copy() for layer in server.center_variable]
        networking.send_action(honest, networking.ACTION_COMMIT)
        networking.send_data(honest, {"delta": weights_array(np.ones_like(w) for w in before)})
        networking.send_action(honest, networking.ACTION_PULL)
        center = networking.recv_data(honest)["center"]
        assert all(np.array_equal(c, b + 1) for c, b in zip(center, before))
        # The silent ones are dropped after the handshake timeout; the honest one stays.
        deadline = time.monotonic() + 30
        for sock in flood:
            sock.settimeout(max(0.1, deadline - time.monotonic()))
            assert sock.recv(1) == b""
        networking.send_action(honest, networking.ACTION_PULL)
        assert networking.recv_data(honest)["num_updates"] == 1
        networking.send_action(honest, networking.ACTION_QUIT)
        honest.close()
    finally:
        for sock in flood:
            sock.close()
        server.stop()
    assert _distkeras_threads() == []


CTRL_C_DRIVER = """
import os, signal, sys, threading, time
from distkeras.session import local_spark_session
spark = local_spark_session("local[2]")
sys.path.insert(0, {tests!r})
from conftest import build_mlp
from distkeras.datasets import load_fashion_mnist
from distkeras.trainers import ADAG
data = load_fashion_mnist(spark, "train", limit=2000).cache()  # 30 epochs: 960 steps a worker
data.count()
def trainer(epochs):
    return ADAG(keras_model=build_mlp(), worker_optimizer="adam",
                loss="categorical_crossentropy", num_workers=2, num_epoch=epochs,
                communication_window=1)
first = trainer(30)
def press_ctrl_c():
    while not first.parameter_server or first.parameter_server.num_updates < 5:
        time.sleep(0.1)
    os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=press_ctrl_c, daemon=True).start()
try:
    first.train(data, verbose=0)
    print("NOT INTERRUPTED")
except KeyboardInterrupt:
    port = first.parameter_server.port
    deadline = time.monotonic() + 30  # the threads end at once; a busy machine is slow
    while True:
        left = [t.name for t in threading.enumerate() if t.name.startswith("distkeras")]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    print("INTERRUPTED threads=%d running=%s" % (len(left), first.parameter_server.transport.running))
second = trainer(1)
second.master_port = port  # the same port again: no "address already in use"
second.train(data.limit(1000), verbose=0)
print("SECOND OK updates=%d" % second.parameter_server.num_updates)
"""


def test_ctrl_c_stops_everything_and_the_next_training_works(tmp_path):
    import os
    import subprocess
    import sys

    script = CTRL_C_DRIVER.format(tests=os.path.dirname(os.path.dirname(__file__)))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=400)
    assert "INTERRUPTED threads=0 running=False" in result.stdout, result.stderr[-3000:]
    assert "SECOND OK" in result.stdout, result.stderr[-3000:]


def test_a_keras_layer_error_names_its_cause_in_the_training_error(fashion_train):
    import os

    import keras

    class Refusing(keras.layers.Layer):
        def call(self, inputs):
            if os.environ.get("SPARK_LOCAL_DIRS"):  # on the executor only
                raise ValueError("the cause: pixel 42 out of range")
            return inputs

    model = keras.Sequential([keras.Input((784,)), Refusing(),
                              keras.layers.Dense(10, activation="softmax")])
    trainer = ADAG(keras_model=model, worker_optimizer="adam",
                   loss="categorical_crossentropy", num_workers=2)
    with pytest.raises(TrainingError, match=r"ValueError: Exception encountered when calling "
                                            r"Refusing.call\(\)\..* the cause: pixel 42 out"):
        trainer.train(fashion_train.limit(200), verbose=0)


def test_a_worker_whose_commits_are_refused_is_named_at_the_end(spark, caplog):
    """A step that diverges in one partition (a feature of 1e30: its gradient overflows
    float32; a NaN in the data is refused as it is fed): the server refuses that worker's
    non-finite commits and the model keeps the other worker's training; it used to return
    it with only a log line per commit, as if all had trained."""
    import keras

    from distkeras.trainers import DOWNPOUR

    rng = np.random.default_rng(2)
    x = rng.normal(size=(400, 3)).astype("float32")
    y = x.sum(axis=1)
    # 1e30, not less: the gradient is about 2 * sum(w) * 1e30 * 1e30 / 32, which overflows
    # float32 whatever the random initial weights. With 1e20 it overflowed only for some
    # (|sum(w)| above about 0.5): otherwise the step stayed finite and nothing was refused.
    x[300] = 1e30  # in the second partition
    # Two slices in order: rows 0-199, then 200-399.
    frame = spark.createDataFrame([(row.tolist(), float(t)) for row, t in zip(x, y)],
                                  "features array<float>, label double")
    assert frame.rdd.getNumPartitions() == 2
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    # The root logger's level too: run alone (no earlier test had set it), the trainer's
    # warning did not reach caplog.
    caplog.set_level(logging.WARNING)
    with caplog.at_level(logging.WARNING, logger="distkeras"):
        trained = DOWNPOUR(model, "sgd", "mse", num_workers=2, communication_window=2,
                           metrics=[]).train(frame, verbose=0)
    assert all(np.isfinite(w).all() for w in trained.get_weights())
    warnings = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(warnings) == 1 and "from workers {1: " in warnings[0], warnings
