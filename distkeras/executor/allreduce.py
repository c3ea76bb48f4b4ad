"""AllReduceTrainer's worker: a Spark barrier task whose training runs in a child process
that joins the other tasks' children in one JAX distributed job.

Each step's minibatches of all workers form one global batch (Keras's ``DataParallel``
distribution): the gradients are averaged over the workers inside the compiled step,
before the optimizer applies them, so every replica holds the same weights after every
step, as one process taking the global batch would.

The task (`AllReduceWorker.run`) writes its partition to an Arrow file on the
executor's local disk, meets the other tasks at Spark's barrier (task 0's host and a
free port become the coordinator's address; the row counts set the common number of
steps), then starts the child (``python -m distkeras.executor.allreduce DIR``) and
waits. The child (`child_main`) initializes ``jax.distributed`` before any JAX
computation, trains with the `SequentialWorker` it was handed and writes its reply.
The worker and the reply travel through files in ``DIR``, on one host, never over the
network.

A fresh process per task, because Spark reuses its Python workers between tasks (JAX
may already run in them) and ``jax.distributed.initialize`` runs once per process.
"""

import dataclasses
import json
import logging
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from distkeras.errors import InvalidDataError
from distkeras.executor.epochs import EPOCH_END
from distkeras.executor.failures import one_line
from distkeras.executor.sequential import SequentialWorker
from distkeras.keras_io.archives import tensorflow_only_once_imported
from distkeras.transport import networking

logger = logging.getLogger(__name__)

JOB_FILE = "job.json"
WORKER_FILE = "worker.pickle"
PARTITION_FILE = "partition.arrow"
REPLY_FILE = "reply.bin"
ERROR_FILE = "error.pickle"
STDERR_FILE = "stderr.txt"


@dataclasses.dataclass(frozen=True)
class ChildJob:
    """What a child process needs to join the distributed job.

    Attributes:
        coordinator: ``"host:port"`` of task 0's JAX coordinator.
        num_processes: The workers (barrier tasks).
        process_id: This worker's index.
        rows: Rows each worker trains on per epoch (the smallest partition's).
        num_epoch: Passes over those rows.
        shuffle: Whether each later pass reorders them.
        seed: Seed of those orders (with the worker's index).
        timeout: Seconds the JAX coordination service waits for a missing process (at
            start, and between heartbeats) before the others fail.
        backend: The Keras backend.
    """

    coordinator: str
    num_processes: int
    process_id: int
    rows: int
    num_epoch: int = 1
    shuffle: bool = False
    seed: int | None = None
    timeout: int = 120
    backend: str = "jax"


def free_port(host):
    """A TCP port free on ``host`` now (the coordinator binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def scratch_directory():
    """The executor's scratch directory (``SPARK_LOCAL_DIRS``, YARN's ``LOCAL_DIRS``);
    None: the system's temporary directory."""
    for variable in ("SPARK_LOCAL_DIRS", "LOCAL_DIRS"):
        for directory in os.environ.get(variable, "").split(","):
            if directory and os.path.isdir(directory):
                return directory
    return None


def write_partition(record_batches, path):
    """Writes ``record_batches`` (Arrow) to an Arrow file at ``path``; returns its rows."""
    import pyarrow as pa  # on the executor: the driver's modules load without Arrow

    rows, writer = 0, None
    with pa.OSFile(path, "wb") as sink:
        for batch in record_batches:
            if batch is EPOCH_END:
                continue
            if writer is None:
                writer = pa.ipc.new_file(sink, batch.schema)
            writer.write_batch(batch)
            rows += batch.num_rows
        if writer is not None:
            writer.close()
    return rows


def epochs_of(path, job):
    """The record batches of ``job.num_epoch`` passes over the first ``job.rows`` rows of
    the Arrow file at ``path`` (each later pass reordered with ``job.shuffle``), with an
    `EPOCH_END` between two passes."""
    import pyarrow as pa  # in the child, as the feed: the driver's modules load without it

    generator = np.random.default_rng(
        None if job.seed is None else [job.seed, job.process_id])
    with pa.memory_map(path, "r") as source:
        reader = pa.ipc.open_file(source)
        count = reader.num_record_batches
        for epoch in range(job.num_epoch):
            reorder = job.shuffle and epoch > 0
            if epoch:
                yield EPOCH_END
            # Which rows a worker trains on stays fixed (a later pass reorders them only).
            batches, left = [], job.rows
            for index in range(count):
                if left <= 0:
                    break
                batch = reader.get_batch(index).slice(0, left)
                left -= batch.num_rows
                batches.append(batch)
            order = generator.permutation(len(batches)) if reorder else range(len(batches))
            for index in order:
                batch = batches[index]
                if reorder:
                    batch = batch.take(generator.permutation(batch.num_rows))
                yield batch


class AllReduceWorker(SequentialWorker):
    """Trains one replica of a synchronous data-parallel job (AllReduceTrainer's).

    In the Spark task, `run` prepares and starts a child process and returns its reply;
    in the child, `run_child` trains as a `SequentialWorker` whose steps all-reduce.

    Args:
        model: A `keras.Model` or the bytes of a `.keras` archive.
        collective_timeout: Seconds the workers wait for a missing one (at the start, and
            between two heartbeats of a running one) before they fail.
    """

    def __init__(self, model, collective_timeout=120, **kwargs):
        super().__init__(model, **kwargs)
        self.collective_timeout = int(collective_timeout)
        self.num_epoch_in_job = 1
        self.shuffle = False
        self.shuffle_seed = None

    # -- in the Spark task -------------------------------------------------------------

    def run(self, worker_id, record_batches, label_shapes):
        """Trains partition ``worker_id`` in a child process; returns its reply.

        Raises:
            InvalidDataError: A worker's partition has no rows (every worker raises it).
            RuntimeError: The child failed (its error, or its exit status and stderr).
        """
        from pyspark import BarrierTaskContext  # on the executor, inside a barrier task

        self.worker_id = worker_id
        context = BarrierTaskContext.get()
        with tempfile.TemporaryDirectory(prefix="distkeras-allreduce-",
                                         dir=scratch_directory()) as directory:
            rows = write_partition(record_batches, os.path.join(directory, PARTITION_FILE))
            host = context.getTaskInfos()[0].address.rsplit(":", 1)[0]
            port = free_port("0.0.0.0") if context.partitionId() == 0 else None
            met = [json.loads(text) for text in
                   context.allGather(json.dumps({"rows": rows, "port": port}))]
            counts = [each["rows"] for each in met]
            port = next(each["port"] for each in met if each["port"] is not None)
            job = ChildJob(f"{host}:{port}", len(met), context.partitionId(), min(counts),
                           self.num_epoch_in_job, self.shuffle, self.shuffle_seed,
                           self.collective_timeout, self.spec.backend or "jax")
            if job.rows == 0:
                raise InvalidDataError(
                    f"AllReduceTrainer: a worker's partition has no rows (rows per "
                    f"partition: {counts}); every worker takes as many steps as the "
                    "smallest. Repartition the DataFrame evenly, or use fewer workers.")
            message = self.train_in_child(directory, job, label_shapes)
            message["partition_rows"] = counts  # the driver warns of uneven ones
            return message

    def train_in_child(self, directory, job, label_shapes):
        """Starts the child on ``directory`` (which holds the partition's Arrow file) as
        ``job``'s process, waits for it and returns its reply.

        Raises:
            RuntimeError: The child failed (its error, or its exit status and stderr).
        """
        with open(os.path.join(directory, JOB_FILE), "w") as handle:
            json.dump(dataclasses.asdict(job), handle)
        with open(os.path.join(directory, WORKER_FILE), "wb") as handle:
            pickle.dump((self, label_shapes), handle)  # a local file, read by our child
        started = time.time()
        with open(os.path.join(directory, STDERR_FILE), "wb") as stderr:
            # stdin stays open while this task lives: the child ends when it closes (a
            # task Spark killed, whose child would otherwise wait in a collective).
            child = subprocess.Popen(
                [sys.executable, "-m", "distkeras.executor.allreduce", directory],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=stderr)
            try:
                status = child.wait()
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
                child.stdin.close()
        error_path = os.path.join(directory, ERROR_FILE)
        if os.path.exists(error_path):
            with open(error_path, "rb") as handle:
                raise pickle.load(handle)  # our child's error, from a local file
        if status != 0:
            with open(os.path.join(directory, STDERR_FILE), "rb") as handle:
                text = handle.read().decode("utf-8", "replace")
            # JAX's fatal errors end with a native stack trace that says nothing more.
            tail = text.split("*** Check failure stack trace", 1)[0][-2000:].strip()
            raise RuntimeError(f"The all-reduce process of worker {job.process_id} exited "
                               f"with status {status} (a worker lost, or killed): {tail}")
        with open(os.path.join(directory, REPLY_FILE), "rb") as handle:
            message = networking.decode_message(handle.read())
        message["child_seconds"] = time.time() - started
        return message

    # -- in the child ------------------------------------------------------------------

    def run_child(self, path, job, label_shapes, started=None):
        """Trains on the Arrow file at ``path`` as ``job`` says (``jax.distributed`` is
        up); returns the reply, with the seconds the child took to start (``started``:
        when it did) and to train."""
        # In the child, once `child_main` initialized jax.distributed (before any JAX
        # computation, as it must be).
        import jax
        import keras

        # The variables a layer builds are placed as one array of all processes, which
        # JAX checks are alike: their initial draws (replaced by the model's weights
        # right after) come from one seed everywhere.
        tensorflow_only_once_imported("keras.src.utils.rng_utils")  # not TF for a seed
        keras.utils.set_random_seed(job.num_processes)
        keras.distribution.set_distribution(
            keras.distribution.DataParallel(devices=jax.devices()))
        self._started = time.time() if started is None else started
        message = SequentialWorker.run(self, job.process_id, epochs_of(path, job),
                                       label_shapes)
        message["start_seconds"] = self._ready - self._started
        message["train_seconds"] = time.time() - self._ready
        return message

    def setup(self):
        self._ready = time.time()  # the model built, its first step (and compile) next
        super().setup()

    def prepare_model(self):
        # Every replica draws the same random numbers (dropout's masks, of the global
        # batch): the seed generators are not told the worker's index.
        worker_id, self.worker_id = self.worker_id, 0
        try:
            super().prepare_model()
        finally:
            self.worker_id = worker_id


def _exit_when_parent_leaves():
    """Ends this process once its stdin (the task's pipe) closes."""
    def watch():
        sys.stdin.buffer.read()
        os._exit(3)

    threading.Thread(target=watch, daemon=True, name="distkeras-parent-watch").start()


def child_main(directory):
    """The child process: joins the distributed job, trains, writes its reply (or its
    error) to ``directory``; returns the exit status."""
    started = time.time()
    _exit_when_parent_leaves()
    with open(os.path.join(directory, JOB_FILE)) as handle:
        job = ChildJob(**json.load(handle))
    try:
        os.environ["KERAS_BACKEND"] = job.backend
        import jax  # here: after the backend is chosen, before any JAX computation

        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(job.coordinator, job.num_processes, job.process_id,
                                   initialization_timeout=job.timeout,
                                   heartbeat_timeout_seconds=job.timeout,
                                   shutdown_timeout_seconds=job.timeout)
        with open(os.path.join(directory, WORKER_FILE), "rb") as handle:
            worker, label_shapes = pickle.load(handle)  # our parent's, from a local file
        message = worker.run_child(os.path.join(directory, PARTITION_FILE), job,
                                   label_shapes, started)
        with open(os.path.join(directory, REPLY_FILE), "wb") as handle:
            handle.write(networking.encode_message(message))
        jax.distributed.shutdown()  # waits for the others: the coordinator is task 0's
    except Exception as error:  # the task raises it: Spark's error names it
        try:
            payload = pickle.dumps(error)
        except Exception:  # an error that does not pickle: its one line
            payload = pickle.dumps(RuntimeError(one_line(error)))
        with open(os.path.join(directory, ERROR_FILE), "wb") as handle:
            handle.write(payload)
        return 1
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.stdout.flush()
    os._exit(child_main(sys.argv[1]))
