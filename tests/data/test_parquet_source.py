"""Reading a plain Parquet scan's files in the workers (`distkeras.data.parquet_source`), on
real Parquet files written by Spark."""

import os

import numpy as np
import pyarrow as pa
import pytest

from distkeras.data import frame_columns, frame_layout, parquet_source
from distkeras.errors import DataSourceError


@pytest.fixture
def parquet(spark, tmp_path):
    """A folder of 2 Parquet files written by Spark (3,000 rows: ``id``, ``features``
    array<float> of 2, ``label`` int), read with small row groups and file splits: the
    scan has several partitions, some reading a part of a file (Spark plans the splits
    of each new DataFrame: the setting stays for the test)."""
    path = str(tmp_path / "rows.parquet")
    (spark.range(0, 3000)
     .selectExpr("id", "array(cast(id as float), cast(id * 2 as float)) as features",
                 "cast(id % 10 as int) as label")
     .repartition(2).write.option("parquet.block.size", 4096).parquet(path))
    spark.conf.set("spark.sql.files.maxPartitionBytes", "8k")
    try:
        yield spark.read.parquet(path)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")


def _ids_by_partition(layout):
    """The ``id`` of each row, per partition, as the tasks over ``layout`` see them."""
    def ids(record_batches):
        from pyspark import TaskContext

        values = [value for batch in record_batches
                  for value in batch.column("id").to_pylist()]
        yield pa.RecordBatch.from_pydict({"partition": [TaskContext.get().partitionId()],
                                          "ids": [values]})

    rows = layout.mapInArrow(ids, "partition long, ids array<long>").collect()
    return [row["ids"] for row in sorted(rows, key=lambda row: row["partition"])]


def test_recognises_a_plain_parquet_scan_and_nothing_else(parquet, spark):
    plain = [parquet, parquet.select("features", "label"),
             parquet.select(frame_columns.column("features").alias("a.b"), "label")]
    assert all(parquet_source.plain_scan(frame) for frame in plain)
    assert all(parquet_source.direct_source(frame) is not None for frame in plain)
    others = [parquet.where("label > 1"), parquet.selectExpr("features", "label + 1 as label"),
              parquet.join(parquet, "id"), parquet.union(parquet), parquet.limit(10),
              parquet.sample(0.5, seed=1), spark.range(10)]
    assert not any(parquet_source.plain_scan(frame) for frame in others)
    assert all(parquet_source.direct_source(frame) is None for frame in others)
    cached = parquet.select("features", "label").cache()
    try:
        assert not parquet_source.plain_scan(cached)
        assert parquet_source.direct_source(cached) is None
    finally:
        cached.unpersist()


@pytest.mark.parametrize("partitions", [1, 3, 7])
def test_splits_read_every_row_once_in_the_partitions_asked_for(parquet, partitions):
    source = parquet_source.direct_source(parquet.select("id", "label"), partitions)
    assert source.num_partitions() == partitions
    by_partition = _ids_by_partition(source)
    assert sorted(i for ids in by_partition for i in ids) == list(range(3000))
    sizes = [len(ids) for ids in by_partition]
    assert max(sizes) - min(sizes) <= 1  # equal rows, a row group cut where it must be
    # Consecutive runs of Spark's order: together, the rows of the scan as Spark reads them.
    spark_order = [row["id"] for row in parquet.select("id").collect()]
    assert [i for ids in by_partition for i in ids] == spark_order


def test_where_the_scan_has_the_partitions_asked_for_each_is_sparks_own(parquet):
    count = parquet.rdd.getNumPartitions()
    assert count > 2  # file splits within each file
    source = parquet_source.direct_source(parquet.select("id"), count)
    assert _ids_by_partition(source) == \
        parquet.select("id").rdd.glom().map(lambda rows: [r["id"] for r in rows]).collect()


def _minibatches_by_partition(spark, frame, partitions, direct):
    """The minibatches (their ids, then their features) each worker task builds over
    `frame_layout.lay_out` of the training columns, with the direct read on or off."""
    from distkeras.training.spark_jobs import feed_batch_rows

    def minibatches(record_batches):
        from pyspark import TaskContext

        from distkeras.data.feed import MinibatchFeed

        batches = [(x[:, 0].tolist(), y.tolist()) for x, y in MinibatchFeed(
            record_batches, ["features"], ["label"], 32, [(2,)], [()])]
        yield pa.RecordBatch.from_pydict({"partition": [TaskContext.get().partitionId()],
                                          "batches": [repr(batches)]})

    spark.conf.set(parquet_source.SETTING, str(direct).lower())
    try:
        layout = frame_layout.lay_out(frame_layout.training_frame(frame, "features", "label"),
                                      partitions)
        assert isinstance(layout, parquet_source.ParquetSource) == direct
        with feed_batch_rows(spark):
            rows = layout.mapInArrow(minibatches, "partition long, batches string").collect()
    finally:
        spark.conf.unset(parquet_source.SETTING)
    return [row["batches"] for row in sorted(rows, key=lambda row: row["partition"])]


@pytest.mark.parametrize("partitions", ["scan's", 1])
def test_workers_build_the_same_minibatches_as_from_sparks_rows(parquet, spark, partitions):
    # The scan's own partitions, or all of them in one (Spark's coalesce(1)).
    count = parquet.rdd.getNumPartitions() if partitions == "scan's" else partitions
    direct = _minibatches_by_partition(spark, parquet, count, True)
    assert direct == _minibatches_by_partition(spark, parquet, count, False)
    assert len(direct) == count


def test_single_trainer_trains_on_the_files_as_on_sparks_rows(spark, tmp_path, caplog):
    import keras

    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], "float32")).reshape(-1, 1)
    path = str(tmp_path / "regression.parquet")
    spark.createDataFrame([(row.tolist(), float(target)) for row, target in zip(x, y[:, 0])],
                          "features array<float>, label float").repartition(2) \
        .write.parquet(path)
    frame = spark.read.parquet(path)

    def train(direct):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        spark.conf.set(parquet_source.SETTING, str(direct).lower())
        try:
            with caplog.at_level("INFO", logger="distkeras"):
                caplog.clear()
                trained = SingleTrainer(model, worker_optimizer="sgd", loss="mse", metrics=[],
                                        batch_size=16, num_epoch=2).train(frame, verbose=0)
            assert ("in the workers (pyarrow)" in caplog.text) == direct
            return trained.get_weights()
        finally:
            spark.conf.unset(parquet_source.SETTING)

    for got, expected in zip(train(True), train(False)):
        np.testing.assert_array_equal(got, expected)


def test_adag_workers_read_the_files_and_train_on_every_row(parquet, spark, caplog):
    import keras

    from distkeras.trainers import ADAG

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(10)])
    with caplog.at_level("INFO", logger="distkeras"):
        trainer = ADAG(model, worker_optimizer="sgd", loss="sparse_categorical_crossentropy",
                       metrics=[], num_workers=2, batch_size=100)
        trainer.train(parquet.select("features", "label"), verbose=0)
    assert "Reading 2 partitions of Parquet files in the workers" in caplog.text
    assert sum(record["batch_size"] for record in trainer.get_history()) == 3000


@pytest.mark.parametrize("workers", [2, 1])
def test_averaging_workers_read_the_files_in_one_barrier_job(parquet, spark, caplog, workers):
    import keras

    from distkeras.trainers import AveragingTrainer

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(10)])
    with caplog.at_level("INFO", logger="distkeras"):
        trainer = AveragingTrainer(model, worker_optimizer="sgd",
                                   loss="sparse_categorical_crossentropy", metrics=[],
                                   num_workers=workers, batch_size=100, num_epoch=2)
        trainer.train(parquet.select("features", "label"), verbose=0)
    assert f"Reading {workers} partitions of Parquet files in the workers" in caplog.text
    assert trainer.parameter_server is not None  # every epoch in one (barrier) job
    assert [sum(record["batch_size"] for record in trainer.get_history()
                if record["epoch"] == epoch) for epoch in range(2)] == [3000, 3000]


def test_a_plain_scan_is_not_copied_to_disk_for_epochs(parquet):
    frame = frame_layout.training_frame(parquet, "features", "label")
    with frame_layout.kept_for_epochs(frame, 3):
        assert not frame.is_cached  # its files give the same rows at each read
    filtered = frame.where("label > 1")
    with frame_layout.kept_for_epochs(filtered, 3):
        assert filtered.is_cached
    assert not filtered.is_cached


def test_a_file_deleted_after_the_dataframe_was_made_is_named(parquet):
    frame = frame_layout.training_frame(parquet, "features", "label")
    files = sorted(parquet.inputFiles())
    os.remove(files[-1].removeprefix("file://"))
    # Laying out the training rows reads the files' footers, on the driver.
    with pytest.raises(DataSourceError, match="is gone") as raised:
        frame_layout.lay_out(frame, 2)
    assert os.path.basename(files[-1]) in str(raised.value)


def test_a_worker_names_a_file_deleted_after_the_splits_were_made(parquet):
    source = parquet_source.direct_source(parquet.select("id"), 1)
    piece = source.partitions[0][-1]
    os.remove(piece.path)
    with pytest.raises(DataSourceError, match=f"{piece.path} that the DataFrame reads is gone"):
        list(parquet_source.read_pieces([piece], source.columns, source.schema))


def test_the_setting_turns_the_direct_read_off(parquet, spark):
    frame = parquet.select("features", "label")
    spark.conf.set(parquet_source.SETTING, "false")
    try:
        assert parquet_source.direct_source(frame) is None
        assert frame_layout.lay_out(frame, frame.rdd.getNumPartitions()) is frame
    finally:
        spark.conf.unset(parquet_source.SETTING)
    assert isinstance(frame_layout.lay_out(frame, frame.rdd.getNumPartitions()),
                      parquet_source.ParquetSource)


def _predicted(spark, predictor, frame, direct):
    """The partitions of ``predictor.predict(frame)`` (rows as dicts), and its schema,
    with the direct read on or off."""
    spark.conf.set(parquet_source.SETTING, str(direct).lower())
    try:
        predicted = predictor.predict(frame)
        return (predicted.rdd.glom().map(lambda rows: [row.asDict() for row in rows])
                .collect(), predicted.schema)
    finally:
        spark.conf.unset(parquet_source.SETTING)


@pytest.mark.parametrize("outputs", [1, 2])
def test_model_predictor_gives_what_it_gives_from_sparks_rows(parquet, spark, outputs,
                                                              caplog):
    import keras

    from distkeras.predictors import ModelPredictor

    keras.utils.set_random_seed(0)
    inputs = keras.Input((2,))
    model = keras.Model(inputs, [keras.layers.Dense(3, name=f"out{index}")(inputs)
                                 for index in range(outputs)] if outputs > 1
                        else keras.layers.Dense(3)(inputs))
    predictor = ModelPredictor(model, "features", batch_size=64)
    with caplog.at_level("INFO", logger="distkeras"):
        direct, direct_schema = _predicted(spark, predictor, parquet, True)
    assert "read in the workers (pyarrow)" in caplog.text
    old, old_schema = _predicted(spark, predictor, parquet, False)
    assert direct_schema == old_schema
    assert len(direct) == len(old) == parquet.rdd.getNumPartitions()
    assert direct == old
    assert sum(map(len, direct)) == 3000
    vectors = ModelPredictor(model, "features", batch_size=64, output_type="vector")
    direct, direct_schema = _predicted(spark, vectors, parquet, True)
    old, old_schema = _predicted(spark, vectors, parquet, False)
    assert direct_schema == old_schema and direct == old
    assert "vector" in {field.dataType.simpleString() for field in direct_schema.fields}


def test_model_predictor_keeps_sparks_path_for_other_frames(parquet, spark, caplog):
    import keras

    from distkeras.predictors import ModelPredictor

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with caplog.at_level("INFO", logger="distkeras"):
        rows = ModelPredictor(model, "features").predict(parquet.where("id < 10")).collect()
    assert len(rows) == 10 and "read in the workers" not in caplog.text


def test_model_predictor_checks_a_plain_scans_first_row_from_its_files_without_a_job(
        parquet, spark, tmp_path):
    """``predict`` refuses a first row the model cannot take before any task runs; on a
    plain Parquet scan it reads that row from the files, so defining the prediction starts
    no Spark job (a job's fixed cost was a large part of a small prediction's)."""
    import keras

    from distkeras.predictors import ModelPredictor

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    ModelPredictor(model, "features").predict(parquet)  # the once-per-application checks
    tracker = spark.sparkContext.statusTracker()
    for group, frame in [("plain-scan", parquet), ("filtered", parquet.where("id >= 0"))]:
        spark.sparkContext.setJobGroup(group, "ModelPredictor.predict, no action")
        try:
            ModelPredictor(model, "features").predict(frame)
        finally:
            spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
        assert len(tracker.getJobIdsForGroup(group)) == (0 if group == "plain-scan" else 1)

    path = str(tmp_path / "three.parquet")
    spark.range(0, 10).selectExpr("id", "array(1.0f, 2.0f, 3.0f) as features") \
        .coalesce(1).write.parquet(path)
    with pytest.raises(ValueError, match="holds 3 values per row but the model's input "
                                         r"expects shape \(2,\)"):
        ModelPredictor(model, "features").predict(spark.read.parquet(path))
    path = str(tmp_path / "nulls.parquet")
    spark.range(0, 10).selectExpr("id", "cast(null as array<float>) as features") \
        .coalesce(1).write.parquet(path)
    with pytest.raises(ValueError, match="its first row is null"):
        ModelPredictor(model, "features").predict(spark.read.parquet(path))
