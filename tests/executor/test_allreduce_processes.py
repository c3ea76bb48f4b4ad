"""AllReduceTrainer's worker without Spark: two child processes on 127.0.0.1 join one JAX
distributed job; their replicas match each other and one process taking the global
batch."""

import os
import threading

import keras
import numpy as np
import pyarrow as pa
import pytest

from distkeras.executor.allreduce import (PARTITION_FILE, AllReduceWorker, ChildJob,
                                          epochs_of, free_port, write_partition)
from distkeras.executor.epochs import EPOCH_END
from distkeras.keras_io.archives import serialize_model
from distkeras.keras_io.model_state import seed_states, seed_worker_generators
from worker_support import arrays

BATCH = 8  # per worker
ROWS = 64  # per worker


def bn_model():
    """Dense -> BatchNormalization -> Dropout -> softmax, seeded."""
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(12, activation="relu"),
                             keras.layers.BatchNormalization(), keras.layers.Dropout(0.3),
                             keras.layers.Dense(3, activation="softmax")])


def batches_of(x, y):
    yield pa.RecordBatch.from_arrays(
        [pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), x.shape[1]),
         pa.FixedSizeListArray.from_arrays(pa.array(y.ravel()), y.shape[1])],
        names=["features", "label"])


def make_worker(model_bytes, states, timeout=60):
    worker = AllReduceWorker(model_bytes, collective_timeout=timeout, optimizer="adam",
                             loss="categorical_crossentropy", metrics=["accuracy"],
                             features_col="features", label_col="label",
                             batch_size=BATCH, num_epoch=1)
    worker.spec = worker.spec.replace(backend="jax", return_optimizer_state=True,
                                      seed_states=states)
    return worker


def run_two(tmp_path, model, parts, epochs=1, rows=None, timeout=60):
    """Runs one child per ``(x, y)`` of ``parts`` together; returns the replies (or the
    errors) by worker."""
    port = free_port("127.0.0.1")
    model_bytes, states = serialize_model(model), seed_states(model)
    replies = [None] * len(parts)

    def one(index):
        directory = tmp_path / f"w{index}"
        directory.mkdir()
        count = write_partition(batches_of(*parts[index]), str(directory / PARTITION_FILE))
        job = ChildJob(f"127.0.0.1:{port}", len(parts), index,
                       rows or min(len(x) for x, _ in parts), epochs, timeout=timeout)
        assert count == len(parts[index][0])
        try:
            replies[index] = make_worker(model_bytes, states, timeout).train_in_child(
                str(directory), job, [(3,)])
        except Exception as error:  # the test reads it
            replies[index] = error

    threads = [threading.Thread(target=one, args=(index,)) for index in range(len(parts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=240)
    return replies


def test_a_worker_takes_the_smallest_partitions_rows_each_epoch(tmp_path):
    x, y = arrays(300, seed=1)
    path = str(tmp_path / PARTITION_FILE)

    def record_batches():
        for start in range(0, 300, 128):  # 128, 128, 44 rows
            yield from batches_of(x[start:start + 128], y[start:start + 128])

    assert write_partition(record_batches(), path) == 300
    for shuffle in (False, True):
        job = ChildJob("127.0.0.1:1", 2, 1, rows=150, num_epoch=3, shuffle=shuffle, seed=4)
        epochs, current = [], []
        for batch in epochs_of(path, job):
            if batch is EPOCH_END:
                epochs.append(current)
                current = []
            else:
                current.append(batch)
        epochs.append(current)
        assert len(epochs) == 3
        rows = [np.concatenate([b.column("features").flatten().to_numpy().reshape(-1, 6)
                                for b in epoch]) for epoch in epochs]
        # The first 150 rows, every epoch (reordered from the second when shuffled).
        np.testing.assert_array_equal(rows[0], x[:150])
        for later in rows[1:]:
            assert len(later) == 150
            np.testing.assert_array_equal(np.sort(later, axis=0), np.sort(x[:150], axis=0))
            assert shuffle != np.array_equal(later, x[:150])


def test_replicas_match_each_other_and_one_process_on_the_global_batch(tmp_path):
    x, y = arrays(2 * ROWS, seed=5)
    model = bn_model()
    # Worker i's step s takes rows [s*BATCH, (s+1)*BATCH) of its own partition.
    parts = [(x[:ROWS], y[:ROWS]), (x[ROWS:], y[ROWS:])]
    replies = run_two(tmp_path, model, parts, epochs=2)
    for reply in replies:
        assert isinstance(reply, dict), reply
    first, second = ([np.asarray(w) for w in reply["weights"]] for reply in replies)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)  # identical, bit for bit

    # One process: the same steps, each on the two workers' minibatches together.
    keras.utils.set_random_seed(3)
    alone = keras.models.clone_model(model)
    alone.set_weights(model.get_weights())
    alone.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
    seed_worker_generators(alone, seed_states(model), 0, 0)  # as worker 0's
    for _ in range(2):
        for step in range(ROWS // BATCH):
            rows = slice(step * BATCH, (step + 1) * BATCH)
            alone.train_on_batch(np.concatenate([parts[0][0][rows], parts[1][0][rows]]),
                                 np.concatenate([parts[0][1][rows], parts[1][1][rows]]))
    for a, b in zip(first, alone.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert replies[0]["samples"] == 2 * ROWS  # both epochs of its rows


def _children_on(directory):
    """The pids of the all-reduce child processes started on ``directory``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                arguments = handle.read().split(b"\0")
        except OSError:
            continue
        if b"distkeras.executor.allreduce" in arguments and \
                str(directory).encode() in arguments:
            found.append(int(entry))
    return found


def test_a_lost_worker_fails_the_others_instead_of_hanging_them(tmp_path):
    import signal
    import time

    x, y = arrays(2 * ROWS, seed=5)
    parts = [(x[:ROWS], y[:ROWS]), (x[ROWS:], y[ROWS:])]
    replies = []

    def kill_worker_1():
        deadline = time.time() + 120
        while time.time() < deadline:
            pids = _children_on(tmp_path / "w1")
            if pids:
                time.sleep(2)  # starting, or training
                os.kill(pids[0], signal.SIGKILL)
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_worker_1)
    killer.start()
    started = time.time()
    # Many epochs: the training outlasts the kill.
    replies = run_two(tmp_path, bn_model(), parts, epochs=2000, timeout=10)
    killer.join()
    assert isinstance(replies[1], RuntimeError) and "status -9" in str(replies[1])
    assert isinstance(replies[0], Exception), replies[0]
    assert time.time() - started < 200
