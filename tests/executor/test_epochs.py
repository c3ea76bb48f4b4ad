"""Several epochs: each worker replays its own partition (`distkeras.executor.epochs.Replay`)."""

import os

import numpy as np
import pyarrow as pa
import pytest

from distkeras.executor.epochs import Replay


def _batches(ids, rows_per_batch=4):
    for start in range(0, len(ids), rows_per_batch):
        yield pa.RecordBatch.from_pydict({"id": ids[start:start + rows_per_batch]})


def _ids(batches):
    return [value for batch in batches if batch is not None
            for value in batch.column("id").to_pylist()]


def test_one_epoch_passes_the_stream_through_untouched():
    stream = _batches(list(range(10)))
    assert _ids(Replay(1).batches(stream)) == list(range(10))


def test_later_epochs_repeat_the_partition_in_its_order():
    ids = list(range(10))
    assert _ids(Replay(3).batches(_batches(ids))) == ids * 3


def test_shuffled_epochs_hold_the_same_rows_in_fresh_orders_seeded_by_partition():
    ids = list(range(40))
    seen = _ids(Replay(3, shuffle=True, seed=5).batches(_batches(ids), partition=1))
    first, second, third = seen[:40], seen[40:80], seen[80:]
    assert first == ids  # the first pass is the layout Spark gave
    assert sorted(second) == ids and sorted(third) == ids
    assert second != ids and third != ids and second != third
    again = _ids(Replay(3, shuffle=True, seed=5).batches(_batches(ids), partition=1))
    other = _ids(Replay(3, shuffle=True, seed=5).batches(_batches(ids), partition=0))
    assert again == seen and other != seen


def test_epochs_are_marked_in_the_stream_and_end_their_last_minibatch():
    from distkeras.executor.epochs import EPOCH_END
    from distkeras.data.feed import MinibatchFeed

    stream = list(Replay(2).batches(_batches(list(range(10)))))
    assert stream.count(EPOCH_END) == 1 and stream[3] is EPOCH_END  # 3 batches an epoch
    labelled = (pa.RecordBatch.from_pydict({"id": batch["id"], "y": batch["id"]})
                if batch is not None else batch for batch in stream)
    feed = MinibatchFeed(labelled, ["id"], ["y"], 4, [()], [()])
    sizes = [len(x) for x, _ in feed]
    assert sizes == [4, 4, 2, 4, 4, 2]  # as fit's batches: no minibatch spans two epochs


def test_an_empty_partition_stays_empty():
    assert _ids(Replay(3).batches(iter([]))) == []


def test_the_replay_file_is_removed_even_when_training_stops_early(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    replayed = Replay(2).batches(_batches(list(range(12))))
    next(replayed)
    assert len(os.listdir(tmp_path)) == 1  # the epoch file, in Spark's local directory
    replayed.close()  # the worker failed: the generator is closed
    assert os.listdir(tmp_path) == []
    assert _ids(Replay(2).batches(_batches(list(range(12))))) == list(range(12)) * 2
    assert os.listdir(tmp_path) == []


def _row_recording_trainer():
    """An EnsembleTrainer whose members record the label (a row id) of every row they
    train on; ``trainer.messages`` holds each member's message."""
    from distkeras.trainers import EnsembleTrainer
    from distkeras.training.ensemble import EnsemblePlan
    from distkeras.executor.sequential import EnsembleWorker

    class RowRecordingWorker(EnsembleWorker):
        def optimize(self):
            self.seen = []
            while True:
                _, labels = self.get_next_minibatch()
                self.seen.append(np.asarray(labels, np.float32).ravel())

        def result(self):
            message = super().result()
            message["seen"] = [np.concatenate(self.seen)]
            return message

    class RowRecordingPlan(EnsemblePlan):
        def __init__(self, run, make_worker, messages):
            super().__init__(run, make_worker)
            self.messages = messages

        def run_workers(self, *args, **kwargs):
            self.messages[:] = super().run_workers(*args, **kwargs)
            return self.messages

    class RowRecordingEnsemble(EnsembleTrainer):
        plan = RowRecordingPlan

        def make_plan(self, run):
            self.messages = []
            return self.plan(run, self.allocate_worker, self.messages)

        def allocate_worker(self):
            return RowRecordingWorker(self.master_model, seed=self.seed)

    return RowRecordingEnsemble


@pytest.mark.parametrize("shuffle", [False, True])
def test_each_worker_trains_on_its_own_rows_in_every_epoch(spark, tmp_path, shuffle):
    """Regression: repeating the data in Spark (a union of the epochs, coalesced) let a
    Parquet-backed DataFrame's partitions be grouped by locality, and both workers trained
    on all the rows in the same order."""
    import keras

    path = str(tmp_path / "ids.parquet")
    spark.range(0, 2000, numPartitions=2).selectExpr(
        "array(cast(id as float)) as features", "cast(id as float) as label") \
        .write.parquet(path)
    frame = spark.read.parquet(path)
    assert frame.rdd.getNumPartitions() == 2
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    trainer = _row_recording_trainer()(model, "sgd", "mse", metrics=[], num_ensembles=2,
                                       num_epoch=3, batch_size=50, seed=1)
    trainer.train(frame, shuffle=shuffle, verbose=0)
    shares = {}
    for message in trainer.messages:
        seen = message["seen"][0].astype(int)
        assert len(seen) == 3 * 1000  # half of the rows, three epochs
        epochs = seen.reshape(3, 1000)
        for epoch in epochs[1:]:
            assert sorted(epoch) == sorted(epochs[0])  # the same rows every epoch
            assert (list(epoch) == list(epochs[0])) != shuffle  # reordered only if shuffled
        shares[message["worker_id"]] = set(epochs[0])
    assert shares[0].isdisjoint(shares[1])
    assert shares[0] | shares[1] == set(range(2000))


def test_replay_files_of_a_killed_worker_are_removed_by_the_next_replay(tmp_path, monkeypatch):
    import subprocess
    import sys

    monkeypatch.setenv("SPARK_LOCAL_DIRS", str(tmp_path))
    # A worker killed mid-replay (Spark cancelling a job): its generator never closes.
    killed = subprocess.run([sys.executable, "-c", (
        "import os, pyarrow as pa\n"
        "from distkeras.executor.epochs import Replay\n"
        "batch = pa.RecordBatch.from_pydict({'label': list(range(4))})\n"
        "replayed = Replay(2).batches(iter([batch]))\n"
        "next(replayed)\n"
        "os._exit(9)\n")], env=dict(os.environ))
    assert killed.returncode == 9
    assert len(os.listdir(tmp_path)) == 1
    live = Replay(2).batches(_batches(list(range(12))))
    next(live)  # a running worker's directory is kept; the dead one's is removed
    (kept,) = os.listdir(tmp_path)
    from distkeras.executor.epochs import remove_abandoned

    remove_abandoned(str(tmp_path))
    assert os.listdir(tmp_path) == [kept]
    live.close()
    assert os.listdir(tmp_path) == []


def test_set_random_seed_makes_shuffled_training_repeat_as_for_fit(spark):
    """`keras.utils.set_random_seed(n)` makes `fit(shuffle=True)` repeat its orders: the
    layout's shuffle and the later epochs' orders were drawn afresh at every run."""
    import keras

    from distkeras.data.frame_layout import lay_out
    from distkeras.trainers import SingleTrainer

    frame = spark.createDataFrame([([index / 96, 1.0], float(index % 3)) for index in
                                   range(96)], "features array<float>, target float")

    def layout_rows(seed):
        keras.utils.set_random_seed(seed)
        return [row["features"][0] for row in lay_out(frame, 2, shuffle=True).collect()]

    assert layout_rows(3) == layout_rows(3) != layout_rows(4)
    keras.utils.set_random_seed(3)
    seeds = Replay(3, shuffle=True).seed, Replay(3, shuffle=True).seed
    keras.utils.set_random_seed(3)
    assert (Replay(3, shuffle=True).seed, Replay(3, shuffle=True).seed) == seeds
    assert Replay(3).seed is None  # nothing to draw without a shuffle

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    trainer = SingleTrainer(model, "sgd", "mse", metrics=[], label_col="target",
                            batch_size=8, num_epoch=2)

    def losses(seed):
        keras.utils.set_random_seed(seed)
        trainer.train(frame, shuffle=True, verbose=0)
        return [record["loss"] for record in trainer.get_history()]

    assert losses(3) == losses(3) != losses(4)
