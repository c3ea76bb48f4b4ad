"""A tiny model, its data as Arrow record batches, and workers built for it, without Spark."""

import distkeras  # noqa: F401  (selects the JAX backend before Keras is imported)

import keras
import numpy as np
import pyarrow as pa

from distkeras import trainers, workers


def small_model():
    """Dense 6 -> 8 -> 3, seeded."""
    keras.utils.set_random_seed(7)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3, activation="softmax")])


def arrays(rows=500, seed=0):
    """A learnable 3-class problem: features (rows, 6) and one-hot labels (rows, 3)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 6)).astype("float32")
    y = np.eye(3, dtype="float32")[(x[:, 0] > 0).astype(int) + (x[:, 1] > 1).astype(int)]
    return x, y


def record_batches(rows=500, seed=0):
    """`arrays` as record batches of 128 rows (a ragged last one)."""
    x, y = arrays(rows, seed)
    for start in range(0, rows, 128):
        yield pa.RecordBatch.from_arrays(
            [pa.FixedSizeListArray.from_arrays(pa.array(x[start:start + 128].ravel()), 6),
             pa.FixedSizeListArray.from_arrays(pa.array(y[start:start + 128].ravel()), 3)],
            names=["features", "label"])


def make_worker(cls, server, model_bytes, overlap=False, worker_id=0, window=4,
                optimizer="adam", **kwargs):
    """A worker of class ``cls`` set up to train against ``server`` (batch 16, Adam unless
    ``optimizer`` is given; ``kwargs``: the class's own arguments, such as ``rho``)."""
    worker = cls(model_bytes, optimizer=optimizer, loss="categorical_crossentropy",
                 metrics=["accuracy"], features_col="features", label_col="label",
                 batch_size=16, num_epoch=1, master_host="127.0.0.1",
                 master_port=server.port, communication_window=window, **kwargs)
    worker.token = server.token
    worker.overlap_communication = overlap
    worker.worker_id = worker_id
    return worker


def train_together(server, model_bytes, count=2, overlap=False, cls=None):
    """Trains ``count`` workers at once (threads) against a started ``server``, then stops it.

    Returns:
        The workers, in worker-id order.

    Raises:
        AssertionError: If a worker failed or a connection did not end in time.
    """
    import threading

    trained = [make_worker(cls or workers.ADAGWorker, server, model_bytes, overlap, index)
               for index in range(count)]
    errors = []

    def run(worker):
        try:
            worker.run(worker.worker_id, record_batches(seed=worker.worker_id), [(3,)])
        except Exception as error:  # noqa: BLE001 - reported to the test thread below
            errors.append(error)

    threads = [threading.Thread(target=run, args=(worker,)) for worker in trained]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert server.transport.wait_for_goodbyes(timeout=10)
    finally:
        server.stop()
    assert not errors, errors
    return trained


class FailingOnceWorker(workers.ADAGWorker):
    """Partition 1's first attempt raises mid-training (a flaky executor); Spark retries it."""

    def communicate(self):
        from pyspark import TaskContext

        if self.worker_id == 1 and TaskContext.get().attemptNumber() == 0 and \
                self.iteration >= 24:
            raise RuntimeError("flaky executor")
        super().communicate()


class FailingOnceADAG(trainers.ADAG):
    """ADAG whose partition 1 fails once, after 24 steps (`FailingOnceWorker`)."""

    def allocate_worker(self):
        return FailingOnceWorker(self.master_model)
