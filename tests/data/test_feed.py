"""The worker feed: multi-input multi-output models, and memory that does not grow."""

import numpy as np
import pytest

from distkeras.training import launch


def _two_tower_model():
    import keras

    pixels = keras.Input((784,), name="pixels")
    half = keras.Input((392,), name="half")
    hidden = keras.layers.Dense(64, activation="relu")(
        keras.layers.Concatenate()([pixels, half]))
    classes = keras.layers.Dense(10, activation="softmax", name="classes")(hidden)
    brightness = keras.layers.Dense(1, name="brightness")(hidden)
    return keras.Model([pixels, half], [classes, brightness])


def test_multi_input_multi_output_trains_end_to_end(fashion_train, fashion_test):
    from pyspark.sql import functions as F

    from distkeras.trainers import ADAG

    data = fashion_train.limit(3000).select(
        "features", "label",
        F.slice("features", 1, 392).alias("top_half"),
        F.aggregate("features", F.lit(0.0), lambda acc, x: acc + x).alias("brightness"))
    model = _two_tower_model()
    trainer = ADAG(keras_model=model, worker_optimizer="adam",
                   loss=["categorical_crossentropy", "mse"], loss_weights=[1.0, 0.001],
                   metrics=[], num_workers=2, communication_window=4,
                   features_col=["features", "top_half"], label_col=["label", "brightness"])
    trained = trainer.train(data, verbose=0)
    images, labels = fashion_test
    classes, brightness = trained.predict([images, images[:, :392]], verbose=0)
    # Chance is 0.10; ADAG's asynchronous runs of 47 steps a worker ended between 0.44
    # and 0.62 (one run of a CI suite failed a bar of 0.45).
    assert (classes.argmax(1) == labels).mean() > 0.3
    expected = images.sum(1)
    assert np.corrcoef(brightness[:, 0], expected)[0, 1] > 0.8
    assert sum(record["batch_size"] for record in trainer.get_history()) == 3000


def _rss_bytes():
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * 4096


def test_worker_memory_does_not_grow_with_steps():
    """An ADAG worker streams a partition far larger than its minibatch buffer: resident
    memory after 4x the steps stays within a small margin of what it was."""
    import keras
    import pyarrow as pa

    from distkeras.parameter_servers import ADAGParameterServer
    from distkeras.workers import ADAGWorker

    rows_per_batch = 2048
    rng = np.random.default_rng(0)
    features = rng.random((rows_per_batch, 784), dtype=np.float32)
    labels = np.eye(10, dtype=np.float32)[rng.integers(0, 10, rows_per_batch)]
    record_batch = pa.RecordBatch.from_pydict({
        "features": pa.FixedSizeListArray.from_arrays(pa.array(features.ravel()), 784),
        "label": pa.FixedSizeListArray.from_arrays(pa.array(labels.ravel()), 10)})

    def stream(count):  # a partition of count x 2,048 rows, built on the fly
        for _ in range(count):
            yield record_batch

    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                              keras.layers.Dense(10, activation="softmax")])
    measurements = []
    for batches in (8, 32):  # 512 then 2,048 steps
        server = ADAGParameterServer(model, 0)
        server.start()
        worker = ADAGWorker(model, "adam", "categorical_crossentropy", metrics=["accuracy"],
                            features_col="features", label_col="label", batch_size=32,
                            communication_window=12)
        worker.backend = "jax"
        worker.master_host, worker.master_port, worker.token = "127.0.0.1", server.port, \
            server.token
        worker.run(0, stream(batches), [(10,)])
        server.stop()
        assert len(server.history) == batches * rows_per_batch // 32
        measurements.append(_rss_bytes())
    grown = measurements[1] - measurements[0]
    assert grown < 64 * 2**20, f"resident memory grew by {grown / 2**20:.0f} MiB"


def test_training_jobs_feed_small_arrow_batches_unless_the_session_sets_its_own(spark):
    from distkeras.training.spark_jobs import (ARROW_BATCH_KEY, FEED_RECORDS_PER_BATCH,
                                               feed_batch_rows)

    def _batch_rows(record_batches):  # defined here: shipped to the executor by value
        import pyarrow as pa

        for batch in record_batches:
            yield pa.RecordBatch.from_pydict({"rows": [batch.num_rows]})

    frame = spark.range(0, 5000, numPartitions=1)
    with feed_batch_rows(spark):
        assert spark.conf.get(ARROW_BATCH_KEY) == str(FEED_RECORDS_PER_BATCH)
        sizes = [row.rows for row in frame.mapInArrow(_batch_rows, "rows long").collect()]
    assert sizes == [2048, 2048, 904]  # Spark's default would send one batch of 5000
    assert spark.conf.get(ARROW_BATCH_KEY, None) is None  # the session is left as it was

    spark.conf.set(ARROW_BATCH_KEY, "3000")
    try:
        with feed_batch_rows(spark):
            sizes = [row.rows for row in frame.mapInArrow(_batch_rows, "rows long").collect()]
        assert sizes == [3000, 2000]
        assert spark.conf.get(ARROW_BATCH_KEY) == "3000"
    finally:
        spark.conf.unset(ARROW_BATCH_KEY)


def test_overlapping_trainings_keep_the_small_arrow_batches_until_the_last_ends(spark):
    """Two trainings in threads on one session: the second to start used to read the first's
    setting as the session's own, and the first to end unset it under the second."""
    from distkeras.training.spark_jobs import ARROW_BATCH_KEY, FEED_RECORDS_PER_BATCH, \
        feed_batch_rows

    first, second = feed_batch_rows(spark), feed_batch_rows(spark)
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert spark.conf.get(ARROW_BATCH_KEY, None) == str(FEED_RECORDS_PER_BATCH)
    second.__exit__(None, None, None)
    assert spark.conf.get(ARROW_BATCH_KEY, None) is None


def test_class_indices_are_checked_against_the_number_of_classes():
    import pytest

    from distkeras.data.feed import check_class_indices

    check_class_indices(np.array([0, 2, 1, 2], np.int32), 3, "Column 'label'")
    check_class_indices(np.array([0.0, 2.0], np.float32), 3, "Column 'label'")
    check_class_indices(np.array([], np.int32), 3, "Column 'label'")
    for labels, bad, row in (([0, 3, 1], "3", 1), ([-1, 0], "-1", 0),
                             ([1.0, 1.0, 1.5], "1.5", 2)):
        dtype = np.float32 if isinstance(labels[0], float) else np.int32
        with pytest.raises(ValueError, match=f"Column 'y' holds the class index {bad}, but "
                                             "the model's output has 3 classes: .* 0 to 2.*"
                                             f"The first is in row {row} of {len(labels)}"):
            check_class_indices(np.array(labels, dtype), 3, "Column 'y'")
    # A tagger's labels: one class index per step, the row is the sequence's.
    with pytest.raises(ValueError, match="class index 5, .*The first is in row 1 of 2"):
        check_class_indices(np.array([[0, 1], [2, 5]], np.int32), 3, "Column 'tags'")


def test_class_indices_out_of_range_stop_training_with_the_column_named(spark):
    import keras
    import pytest

    from distkeras.trainers import SingleTrainer, TrainingError

    # 1-based labels for 3 classes: JAX alone would train on garbage without a word.
    rows = [([float(index % 5)] * 4, index % 3 + 1) for index in range(60)]
    frame = spark.createDataFrame(rows, "features array<float>, label int")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="softmax")])
    trainer = SingleTrainer(model, "adam", "sparse_categorical_crossentropy", metrics=[])
    with pytest.raises(TrainingError, match="Column 'label' holds the class index 3, but "
                                            "the model's output has 3 classes"):
        trainer.train(frame, verbose=0)
    named = spark.createDataFrame([([1.0] * 4, "cat")], "features array<float>, label string")
    with pytest.raises(TypeError, match="index them first: pyspark.ml.feature.StringIndexer"):
        trainer.train(named, verbose=0)


def test_every_row_must_hold_the_models_number_of_values():
    import pyarrow as pa
    import pytest

    from distkeras.data.feed import column_to_numpy

    # 4 + 6 values are 2 x 5 in total: checking the total alone let them through.
    with pytest.raises(ValueError, match=r"Column 'f' .* a row of 4 values \(row 0 of a "
                                         r"batch of 2\), but the model expects 5"):
        column_to_numpy(pa.array([[1.0] * 4, [1.0] * 6]), (5,), "f")
    # A slice (a minibatch of a larger Arrow batch) is read from its own rows.
    rows = pa.array([[0.0] * 3, [1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [9.0] * 4])
    assert column_to_numpy(rows.slice(1, 2), (3,), "f").tolist() == [[1, 2, 3], [4, 5, 6]]
    # Nested arrays: each level has the shape's length where the nesting matches it.
    nested = pa.array([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])
    assert column_to_numpy(nested.slice(1, 1), (2, 2), "n").tolist() == [[[5, 6], [7, 8]]]
    with pytest.raises(ValueError, match="level 2 has lengths other than 2"):
        column_to_numpy(pa.array([[[1.0, 2.0, 3.0], [4.0]]]), (2, 2), "n")
    with pytest.raises(ValueError, match="a row of 3 values"):
        column_to_numpy(pa.array([[[1.0], [2.0, 3.0]], [[1.0, 2.0], [3.0, 4.0, 5.0]]]),
                        (4,), "n")


def test_null_values_inside_arrays_are_refused_not_trained_as_nan():
    import pyarrow as pa
    import pytest

    from distkeras.data.feed import column_to_numpy

    with pytest.raises(ValueError, match="Column 'f' has 1 null values inside its arrays"):
        column_to_numpy(pa.array([[1.0, None, 3.0], [1.0, 2.0, 3.0]]), (3,), "f")
    with pytest.raises(ValueError, match="has 1 null values inside its arrays"):
        column_to_numpy(pa.array([[[1.0, 2.0], None]]), (4,), "f")


def test_ragged_rows_and_nulls_in_arrays_stop_training_and_prediction(spark):
    import keras
    import pytest

    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import SingleTrainer, TrainingError

    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(3, activation="softmax")])
    good = [([0.5] * 5, index % 3) for index in range(40)]
    ragged = spark.createDataFrame(good + [([1.0] * 4, 0), ([1.0] * 6, 1)],
                                   "features array<float>, label int").coalesce(1)
    trainer = SingleTrainer(model, "adam", "sparse_categorical_crossentropy", metrics=[])
    with pytest.raises(TrainingError, match="Column 'features' holds arrays of different "
                                            "lengths or of the wrong length: a row of 4"):
        trainer.train(ragged, verbose=0)
    with pytest.raises(Exception, match="a row of 4 values"):
        ModelPredictor(model).predict(ragged).collect()
    holed = spark.createDataFrame(good + [([1.0, None, 1.0, 1.0, 1.0], 2)],
                                  "features array<float>, label int").coalesce(1)
    with pytest.raises(TrainingError, match="null values inside its arrays"):
        trainer.train(holed, verbose=0)


def test_a_null_first_row_is_named_as_a_null_not_as_a_size_to_reshape(spark):
    import keras
    import pytest

    from distkeras.trainers import SingleTrainer

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, activation="softmax")])
    trainer = SingleTrainer(model, "adam", "sparse_categorical_crossentropy", metrics=[])
    for rows in ([(None, 1), ([1.0, 2.0, 3.0], 0)], [([1.0, 2.0, 3.0], None)]):
        frame = spark.createDataFrame(rows, "features array<float>, label long").coalesce(1)
        with pytest.raises(ValueError, match="holds null values .*dropna"):
            trainer.train(frame, verbose=0)
    assert trainer.get_history() == []


def test_inputs_typed_as_integers_are_fed_as_integers():
    """Token ids above 2**24 are not exact in float32: an int32 input gets them exact."""
    import pyarrow as pa

    from distkeras.data.feed import MinibatchFeed, column_to_numpy

    ids = pa.array([[2**24 + 1, 3], [7, 2**24 + 3]], pa.list_(pa.int64()))
    exact = column_to_numpy(ids, (2,), "tokens", np.dtype("int32"))
    assert exact.dtype == np.int32 and exact.tolist() == [[2**24 + 1, 3], [7, 2**24 + 3]]
    assert column_to_numpy(ids, (2,), "tokens").dtype == np.float32  # an untyped input
    batch = pa.RecordBatch.from_arrays([ids, pa.array([0, 1])], ["tokens", "label"])
    feed = MinibatchFeed(iter([batch]), ["tokens"], ["label"], 2, [(2,)], [()],
                         feature_dtypes=[np.dtype("int32")])
    x, y = next(feed)
    assert x.dtype == np.int32 and x[0, 0] == 2**24 + 1 and y.dtype == np.int32


def test_long_numbers_beyond_int32_are_not_wrapped_around(spark):
    """A ``long`` target or feature (cents, a timestamp in ms) reaches the model as its
    value, as Keras gets float32 targets, not wrapped around into int32."""
    import keras
    import pyarrow as pa

    from distkeras.data.feed import column_to_numpy
    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import SingleTrainer

    big = column_to_numpy(pa.array([5_000_000_000, 3], pa.int64()), (1,), "y")
    assert big.dtype == np.float32 and big[:, 0].tolist() == [5e9, 3.0]
    small = column_to_numpy(pa.array([2, 0, 1], pa.int64()), (), "label")
    assert small.dtype == np.int32 and small.tolist() == [2, 0, 1]  # class indices

    rows = [(float(index % 4), 4_000_000_000 + index) for index in range(32)]
    frame = spark.createDataFrame(rows, "features double, target long").coalesce(1)
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    trainer = SingleTrainer(model, "sgd", "mse", metrics=[], batch_size=32,
                            features_col="features", label_col="target")
    trainer.train(frame, verbose=0)
    x = np.array([[row[0]] for row in rows], np.float32)
    y = np.array([row[1] for row in rows], np.float32)
    initial = model.predict(x, verbose=0)[:, 0].astype(np.float64)
    expected = np.mean((initial - y) ** 2)  # the first step's loss: the initial weights'
    assert np.isclose(trainer.get_history()[0]["loss"], expected, rtol=1e-3)

    scale = keras.Sequential([keras.Input((1,)), keras.layers.Rescaling(1e-12)])
    stamps = spark.createDataFrame([(1_700_000_000_000,)], "ts long")
    (predicted,) = ModelPredictor(scale, features_col="ts").predict(stamps).collect()
    assert np.isclose(predicted["prediction"][0], 1.7, rtol=1e-4)


def _vector_structs(rows):
    """Spark ML vectors as Spark sends them through Arrow: ``(size, {index: value})`` for
    a sparse row, a list for a dense one."""
    import pyarrow as pa

    kind = pa.struct([("type", pa.int8()), ("size", pa.int32()),
                      ("indices", pa.list_(pa.int32())), ("values", pa.list_(pa.float64()))])
    return pa.array([{"type": 0, "size": row[0], "indices": list(row[1]),
                      "values": list(row[1].values())} if isinstance(row, tuple)
                     else {"type": 1, "size": None, "indices": None, "values": row}
                     for row in rows], kind)


def test_vector_structs_mix_sparse_and_dense_rows_and_slice_into_dense_minibatches():
    import pyarrow as pa
    import pytest

    from distkeras.data.feed import MinibatchFeed, column_to_numpy

    rows = [(6, {1: 1.0, 4: 2.0}), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], (6, {}), (6, {0: 7.0}),
            [0.0, 0.0, 0.0, 0.0, 0.0, 9.0]]
    expected = np.zeros((5, 6), np.float32)
    expected[0, [1, 4]] = [1.0, 2.0]
    expected[1] = np.arange(1, 7)
    expected[3, 0], expected[4, 5] = 7.0, 9.0
    vectors = _vector_structs(rows)
    assert np.array_equal(column_to_numpy(vectors, (2, 3), "v"), expected.reshape(5, 2, 3))
    assert np.array_equal(column_to_numpy(vectors.slice(2, 3), (6,), "v"), expected[2:])
    # Minibatches of 2 over two Arrow batches: one carries over into the next.
    batches = [pa.RecordBatch.from_arrays([vectors.slice(0, 3), pa.array([0, 1, 0])],
                                          ["v", "label"]),
               pa.RecordBatch.from_arrays([vectors.slice(3), pa.array([1, 1])],
                                          ["v", "label"])]
    feed = MinibatchFeed(iter(batches), ["v"], ["label"], 2, [(6,)], [()])
    x = [batch[0] for batch in feed]
    assert [len(part) for part in x] == [2, 2, 1] and x[0].dtype == np.float32
    assert np.array_equal(np.concatenate(x), expected)
    with pytest.raises(ValueError, match=r"Column 'v' holds vectors of different sizes .* "
                                         r"a vector of size 7 \(row 1 of a batch of 2\)"):
        column_to_numpy(_vector_structs([(6, {0: 1.0}), (7, {0: 1.0})]), (6,), "v")


def test_sparse_vectors_travel_sparse_and_train_as_the_same_dense_rows(spark):
    """A HashingTF column is not densified on the JVM (1 MiB a row at 2**18 features)."""
    import keras
    from pyspark.ml.feature import HashingTF, Tokenizer
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT

    from distkeras.data.frame_layout import training_frame
    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import SingleTrainer

    words = ["good", "bad", "movie", "plot", "great", "awful", "actor", "the"]
    text = [(" ".join(words[(i * j) % 8] for j in range(1, 2 + i % 5)), float(i % 2))
            for i in range(200)]
    frame = HashingTF(inputCol="words", outputCol="features", numFeatures=2 ** 10).transform(
        Tokenizer(inputCol="text", outputCol="words").transform(
            spark.createDataFrame(text, ["text", "label"]))).coalesce(1).cache()
    sent = training_frame(frame, "features", "label").schema["features"].dataType
    assert isinstance(sent, VectorUDT)  # its indices and values, densified per minibatch
    dense = frame.withColumn("features", vector_to_array("features", "float32"))
    weights = []
    for data in (frame, dense):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((2 ** 10,)),
                                  keras.layers.Dense(1, activation="sigmoid")])
        trainer = SingleTrainer(model, "adam", "binary_crossentropy", batch_size=16,
                                num_epoch=2)
        weights.append(trainer.train(data, verbose=0).get_weights())
    for sparse_trained, dense_trained in zip(*weights):
        np.testing.assert_allclose(sparse_trained, dense_trained, rtol=1e-5, atol=1e-6)
    predicted = ModelPredictor(model, batch_size=64).predict(frame).select("prediction")
    rows = np.array([row.features for row in dense.select("features").collect()])
    np.testing.assert_allclose(np.array([row.prediction for row in predicted.collect()]),
                               model.predict(rows, verbose=0), rtol=1e-5, atol=1e-6)


def test_ragged_token_ids_are_told_how_to_pad_and_the_padding_trains(spark):
    """Sentences have different numbers of tokens: the error for an Embedding's input says
    how to pad them, not to drop the rows (which would drop most of a text set)."""
    import keras
    import pyarrow as pa
    import pytest
    from pyspark.sql import functions as F  # noqa: F401  (the hint's code uses it)

    from distkeras.data.feed import column_to_numpy
    from distkeras.trainers import SingleTrainer

    with pytest.raises(ValueError, match=r"a row of 2 values .* pad or cut every row to 3"):
        column_to_numpy(pa.array([[1, 2, 3], [4, 5]]), (3,), "tokens", np.dtype("int32"))
    with pytest.raises(ValueError, match="Drop or fix those rows"):  # not token ids
        column_to_numpy(pa.array([[1.0, 2.0, 3.0], [4.0, 5.0]]), (3,), "f", np.float32)
    rows = [([1 + i % 7] * (2 + i % 5), i % 2) for i in range(60)]
    ragged = spark.createDataFrame(rows, "tokens array<int>, label int").coalesce(1)
    inputs = keras.Input((4,), dtype="int32")
    pooled = keras.layers.GlobalAveragePooling1D()(
        keras.layers.Embedding(8, 4, mask_zero=True)(inputs))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(pooled))
    trainer = SingleTrainer(model, "adam", "sparse_categorical_crossentropy", metrics=[],
                            features_col="tokens")
    with pytest.raises(ValueError, match="pad or cut every row to 4") as error:
        trainer.train(ragged, verbose=0)
    fix = str(error.value).split("`")[1]
    assert fix.startswith("df.withColumn('tokens', F.slice(")
    padded = eval(fix, {"df": ragged, "F": F})  # the code the error suggests, as written
    trainer.train(padded, verbose=0)
    assert sum(record["batch_size"] for record in trainer.get_history()) == 60


@pytest.mark.parametrize("kind, value", [("string", "red"), ("array<string>", ["a", "b"])])
def test_string_feature_columns_are_refused_with_what_to_do_for_features(spark, kind, value):
    import keras

    from distkeras.trainers import SingleTrainer

    # A StringLookup fed from a string column: the advice is about ids for an Embedding,
    # not the labels' StringIndexer-then-one-hot.
    frame = spark.createDataFrame([(value, 1)], f"words {kind}, label int")
    model = keras.Sequential([keras.Input((2,), dtype="int32"), keras.layers.Embedding(5, 2),
                              keras.layers.Flatten(), keras.layers.Dense(2)])
    trainer = SingleTrainer(model, "adam", "sparse_categorical_crossentropy", metrics=[],
                            features_col="words")
    with pytest.raises(TypeError, match="integer ids") as raised:
        trainer.train(frame, verbose=0)
    assert "class names" not in str(raised.value)


def test_nan_and_infinite_values_are_refused_for_training_not_trained_into_the_weights():
    import pyarrow as pa
    import pytest

    from distkeras.data.feed import column_rows, column_to_numpy

    nan, inf = float("nan"), float("inf")
    with pytest.raises(ValueError, match=r"Column 'f' holds 1 NaN or infinite values \(the "
                                         r"first, NaN, in row 1 of a batch of 3.*F.forall"):
        column_to_numpy(pa.array([[1.0, 2.0], [nan, 1.0], [3.0, 4.0]]), (2,), "f",
                        finite=True)
    with pytest.raises(ValueError, match=r"holds 2 NaN or infinite.*infinite, in row 0.*"
                                         r"na.drop\(subset=\['y'\]\)"):
        column_to_numpy(pa.array([inf, 1.0, nan]), (), "y", finite=True)
    # Before a cast to an integer input's dtype, which would make NaN an arbitrary id.
    with pytest.raises(ValueError, match="NaN or infinite"):
        column_to_numpy(pa.array([[1.0, nan]]), (2,), "ids", np.dtype("int32"), finite=True)
    vectors = pa.array([{"type": 1, "size": None, "indices": None, "values": [1.0, 2.0]},
                        {"type": 0, "size": 2, "indices": [1], "values": [nan]}])
    with pytest.raises(ValueError, match=r"in row 1 of a batch of 2.*vector_to_array"):
        column_rows(vectors, (2,), "v", finite=True)
    # Prediction (and integers, which hold no NaN) read them as before.
    assert np.isnan(column_to_numpy(pa.array([[1.0, nan]]), (2,), "f")).any()
    assert column_to_numpy(pa.array([1, 2]), (), "y", finite=True).tolist() == [1, 2]


def test_a_nan_label_in_the_middle_of_the_data_stops_training_with_the_column_named(spark):
    import keras
    import pytest

    from distkeras.trainers import SingleTrainer, TrainingError

    # Keras's fit trains on it, and every weight comes out NaN.
    rows = [([float(index % 5)] * 3, float("nan") if index == 70 else float(index % 4))
            for index in range(100)]
    frame = spark.createDataFrame(rows, "features array<double>, target double")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    trainer = SingleTrainer(model, "adam", "mse", metrics=[], label_col="target")
    with pytest.raises(TrainingError, match="Column 'target' holds 1 NaN or infinite values"):
        trainer.train(frame.coalesce(1), verbose=0)
    with pytest.raises(ValueError, match="In the validation data: Column 'target' holds 1 "
                                         "NaN"):
        trainer.train(frame.where("target = 0"), validation_data=frame, verbose=0)


def test_a_null_row_is_told_to_drop_the_rows_null_in_that_column_only():
    import pyarrow as pa
    import pytest

    from distkeras.data.feed import column_to_numpy

    # `df.dropna()` would drop every row with a null anywhere, as in an unrelated
    # optional column: most rows of many real tables.
    with pytest.raises(ValueError, match=r"Column 'label' has 1 null values .*"
                                         r"`df.dropna\(subset=\['label'\]\)`"):
        column_to_numpy(pa.array([1.0, None]), (), "label")


def _task_attempts(spark, job_tag):
    """(task attempts that failed, task attempts in all) of a job tag's Spark stages."""
    tracker = spark.sparkContext.statusTracker()
    failed = launched = 0
    for job_id in spark.sparkContext._jsc.sc().statusTracker().getJobIdsForTag(job_tag):
        for stage_id in tracker.getJobInfo(job_id).stageIds:
            stage = tracker.getStageInfo(stage_id)
            if stage is not None:
                failed += stage.numFailedTasks
                launched += stage.numCompletedTasks + stage.numFailedTasks
    return failed, launched


def test_rows_no_retry_can_train_on_fail_the_training_without_spark_retrying_it(spark,
                                                                               monkeypatch):
    """On `local[2,4]` (a cluster's 4 attempts) a task that failed on a NaN would run
    4 times, each training again up to the same row, before the same error."""
    import keras
    import pytest

    from distkeras.errors import InvalidDataError
    from distkeras.trainers import SingleTrainer, TrainingError

    rows = [([0.5] * 3, 1.0 if index != 150 else float("inf")) for index in range(200)]
    frame = spark.createDataFrame(rows, "features array<float>, target double").coalesce(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    trainer = SingleTrainer(model, "sgd", "mse", metrics=[], label_col="target")
    monkeypatch.setattr(launch, "new_job_tag", lambda run: "distkeras-test-invalid-rows-single")
    with pytest.raises(TrainingError, match=r"partition 0 failed: InvalidDataError: Column "
                                            r"'target' holds 1 NaN or infinite") as caught:
        trainer.train(frame, verbose=0)
    assert "attempt" not in str(caught.value)
    assert _task_attempts(spark, "distkeras-test-invalid-rows-single") == (0, 1)
    assert issubclass(InvalidDataError, ValueError)  # what code catching ValueError expects


@pytest.mark.parametrize("overlap", [False, True])
def test_a_worker_on_invalid_rows_stops_the_other_workers_at_once(spark, overlap,
                                                                  monkeypatch):
    """ADAG: the worker whose partition holds a null tells the driver, which stops the
    other worker (which would otherwise train its 3,000 epochs) and names the rows; with
    overlapped communication too, whose exchange in flight shares the socket."""
    import keras
    import pytest

    from distkeras.trainers import ADAG, TrainingError

    good = spark.createDataFrame([([0.5, 0.25], index % 2) for index in range(64)],
                                 "features array<float>, label int").coalesce(1)
    # The null in the partition's second Arrow batch (of 64 rows, set below), read after
    # 4 windows of good rows: exchanges have happened (or, overlapped, are in flight).
    holed = spark.createDataFrame([([0.5, 0.25], 0)] * 64 + [(None, 1)],
                                  "features array<float>, label int").coalesce(1)
    frame = good.union(holed)  # two partitions: one per worker
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    num_epoch = 3000  # 24,000 steps: far more than it takes before the others' error
    trainer = ADAG(model, "sgd", "sparse_categorical_crossentropy", metrics=[],
                   num_workers=2, batch_size=8, num_epoch=num_epoch, communication_window=2,
                   overlap_communication=overlap)
    monkeypatch.setattr(launch, "new_job_tag",
                        lambda run: f"distkeras-test-invalid-rows-adag-{overlap}")
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "64")
    try:
        with pytest.raises(TrainingError, match=r"partition \d failed: InvalidDataError: "
                                                r"Column 'features' has 1 null values"):
            trainer.train(frame, verbose=0)
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    # The good worker's 64 rows, 8 steps an epoch: it was stopped long before its end.
    assert len(trainer.get_history()) < num_epoch * 8 // 2
    failed, _ = _task_attempts(spark, f"distkeras-test-invalid-rows-adag-{overlap}")
    assert failed <= 1  # the good worker's, cancelled: never the invalid rows' retries



def test_an_ensemble_member_on_invalid_rows_stops_the_other_members_at_once(spark):
    """EnsembleTrainer: the member whose partition holds a null ended its task with the
    error, but the driver saw it only when the job ended, after the other member had
    trained all its 20,000 epochs. The member now tells the driver's progress server, which
    stops the job, as a parameter-server trainer's does."""
    import time

    import keras
    import pytest

    from distkeras.executor.sequential import EnsembleWorker
    from distkeras.trainers import EnsembleTrainer, TrainingError

    class SlowGoodMember(EnsembleWorker):
        def train_steps(self, batches):
            # The good member (partition 0) takes 0.1 s a call, 100 s for its 1,000 calls
            # if nothing stops it: however fast or busy the machine, the other member meets
            # its null long before (a new Python worker imports JAX first).
            if self.worker_id == 0:
                time.sleep(0.1)
            super().train_steps(batches)

    class Trainer(EnsembleTrainer):
        def allocate_worker(self):
            return SlowGoodMember(self.master_model, seed=self.seed)

    good = spark.createDataFrame([([0.5, 0.25], index % 2) for index in range(64)],
                                 "features array<float>, label int").coalesce(1)
    holed = spark.createDataFrame([([0.5, 0.25], 0)] * 8 + [(None, 1)],
                                  "features array<float>, label int").coalesce(1)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, activation="softmax")])
    num_epoch = 2000  # 16,000 steps of 8 rows, 16 a call
    trainer = Trainer(model, "sgd", "sparse_categorical_crossentropy", metrics=[],
                      batch_size=8, num_ensembles=2, num_epoch=num_epoch)
    started = time.monotonic()
    with pytest.raises(TrainingError, match=r"partition 1 failed: InvalidDataError: "
                                            r"Column 'features' has 1 null values"):
        trainer.train(good.union(holed), verbose=0)  # two partitions: one per member
    # Stopped at once, not after the good member's 100 s. (How its task then ends is
    # Spark's timing: killed, or done early once the driver's server is gone.)
    assert time.monotonic() - started < 60
    assert len(trainer.get_history()) < num_epoch * 8  # what was trained is kept

def test_a_bad_row_in_a_later_arrow_batch_is_placed_in_its_partition(spark):
    """The errors count rows within an Arrow batch: in a later batch of a large partition,
    "row 50 of a batch of 100" alone does not say which row of the partition it is."""
    import re

    import keras
    import pytest

    from distkeras.trainers import SingleTrainer, TrainingError
    from distkeras.training.spark_jobs import ARROW_BATCH_KEY

    rows = [([0.5] * 3, float("nan") if index == 750 else 1.0) for index in range(1000)]
    frame = spark.createDataFrame(rows, "features array<float>, target double").coalesce(1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    trainer = SingleTrainer(model, "sgd", "mse", metrics=[], label_col="target")
    spark.conf.set(ARROW_BATCH_KEY, "100")
    try:
        with pytest.raises(TrainingError, match="Column 'target' holds 1 NaN") as caught:
            trainer.train(frame, verbose=0)
    finally:
        spark.conf.unset(ARROW_BATCH_KEY)
    found = re.search(r"in row (\d+) of a batch of 100 in this partition.*That batch holds "
                      r"rows (\d+) to (\d+) of this partition", str(caught.value))
    assert found, str(caught.value)
    row, first, last = map(int, found.groups())
    assert (first + row, last - first) == (750, 99)


def test_a_worker_the_driver_stopped_does_not_warn_that_it_could_not_say_goodbye(caplog):
    """The other workers of a training stopped on invalid rows find the server gone: their
    "Broken pipe" warnings sat beside the error that matters. A worker that completed
    its partition still warns (its last steps' records are lost)."""
    import logging
    import socket

    from ps_support import make_model

    from distkeras.workers import NetworkWorker

    worker = NetworkWorker(make_model())
    worker.worker_id = 1
    for completed, level in ((False, logging.INFO), (True, logging.WARNING)):
        ours, theirs = socket.socketpair()
        theirs.close()  # the server stopped with the job
        worker.socket, worker.completed = ours, completed
        worker.flush_history = lambda: ours.sendall(b"history")  # some steps were left
        caplog.clear()
        with caplog.at_level(logging.INFO, "distkeras"):
            worker.teardown()
        assert [record.levelno for record in caplog.records
                if "could not say goodbye" in record.getMessage()] == [level]
        assert worker.socket is None
