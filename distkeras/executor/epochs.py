"""Later epochs of a worker's partition, replayed from the executor's local disk.

A worker reads its partition from Spark once. For ``num_epoch > 1`` it writes each Arrow
record batch to a file in the executor's local directory as it trains on it, and reads
the file back for the later epochs: every worker sees its own rows in every epoch, and
the JVM converts the data to Arrow once instead of once per epoch.

(Repeating the data in Spark instead, as a union of the epochs coalesced to one partition
per worker, let Spark group the union's partitions by locality: two workers could get two
copies of the same rows in the same order, and train on the same minibatches at once.)

Memory stays bounded by one record batch: the file is read batch by batch, not mapped.
"""

import dataclasses
import fcntl
import glob
import os
import shutil
import tempfile

import numpy as np


# Between two epochs in the stream of record batches: the feed ends the epoch's last,
# smaller minibatch there, as `fit` does, rather than filling it with the next epoch's rows.
EPOCH_END = None


@dataclasses.dataclass(frozen=True)
class Replay:
    """How a worker repeats its partition.

    Attributes:
        num_epoch: Passes over the partition.
        shuffle: Whether each later pass takes the record batches in a fresh random
            order and the rows within each in a fresh random order (the worker keeps its
            own rows: the first pass's layout decides which rows each worker has).
        seed: Seed of those orders (with the partition's index); None: drawn (where the
            Replay is made, on the driver) from numpy's global generator, so
            ``keras.utils.set_random_seed(n)`` gives the same orders at every run.
    """

    num_epoch: int = 1
    shuffle: bool = False
    seed: int | None = None

    def __post_init__(self):
        if self.shuffle and self.seed is None:
            object.__setattr__(self, "seed", int(np.random.randint(0, 2 ** 31 - 1)))

    def batches(self, record_batches, partition=0):
        """Yields ``record_batches`` and then, ``num_epoch - 1`` times, the same batches
        read back from a local file (reordered with ``shuffle``), each epoch after an
        `EPOCH_END`."""
        if self.num_epoch <= 1:
            yield from record_batches
            return
        import pyarrow as pa

        local = _local_directory()
        remove_abandoned(local)
        with tempfile.TemporaryDirectory(prefix=PREFIX, dir=local) as directory, \
                _held_lock(directory):
            path = os.path.join(directory, "partition.arrow")
            with pa.OSFile(path, "wb") as sink:
                writer = None
                for batch in record_batches:
                    if writer is None:
                        writer = pa.ipc.new_file(sink, batch.schema)
                    writer.write_batch(batch)
                    yield batch
                if writer is None:
                    return  # an empty partition: nothing to repeat
                writer.close()
            yield from self._read_back(path, partition)

    def _read_back(self, path, partition):
        import pyarrow as pa

        seed = None if self.seed is None else [self.seed, partition]
        generator = np.random.default_rng(seed)
        with pa.OSFile(path, "rb") as source:
            reader = pa.ipc.open_file(source)
            count = reader.num_record_batches
            for _ in range(1, self.num_epoch):
                yield EPOCH_END
                order = generator.permutation(count) if self.shuffle else range(count)
                for index in order:
                    batch = reader.get_batch(int(index))
                    if self.shuffle:
                        batch = batch.take(generator.permutation(batch.num_rows))
                    yield batch


PREFIX = "distkeras-epochs-"
LOCK_NAME = ".owner.lock"


class _held_lock:
    """Holds an exclusive lock on ``directory``'s lock file while a worker replays from it.

    The lock ends with the process: a worker that Spark killed (a cancelled job, with
    EarlyStopping, a callback's error or ``worker_timeout``) leaves an unlocked directory
    that `remove_abandoned` deletes.
    """

    def __init__(self, directory):
        self.path = os.path.join(directory, LOCK_NAME)
        self.handle = None

    def __enter__(self):
        self.handle = open(self.path, "w")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        # Written once locked: `remove_abandoned` leaves an empty lock file alone, so it
        # cannot take the lock in the instant between its creation and the flock.
        self.handle.write(str(os.getpid()))
        self.handle.flush()
        return self

    def __exit__(self, *exc_info):
        self.handle.close()  # releases the lock


def remove_abandoned(local=None):
    """Deletes the replay directories of workers that died before they could (their lock
    is free); ones being written or read, or whose lock is not taken yet, are left alone."""
    base = local or tempfile.gettempdir()
    for directory in glob.glob(os.path.join(base, PREFIX + "*")):
        try:
            with open(os.path.join(directory, LOCK_NAME), "r+") as handle:
                if not handle.read():  # its owner has not locked it yet
                    continue
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(directory, ignore_errors=True)
        except OSError:  # locked by a live worker, not locked yet, or gone meanwhile
            continue


def _local_directory():
    """The executor's scratch directory (Spark gives its Python workers
    ``SPARK_LOCAL_DIRS``; YARN's containers ``LOCAL_DIRS``); None: the system's."""
    for variable in ("SPARK_LOCAL_DIRS", "LOCAL_DIRS"):
        for directory in os.environ.get(variable, "").split(","):
            if directory and os.path.isdir(directory):
                return directory
    return None
