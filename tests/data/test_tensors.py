"""Packed tensor columns: packing and unpacking in Arrow, the feed, the transformer on Spark,
training and prediction on packed features."""

import numpy as np
import pyarrow as pa
import pytest

from distkeras.errors import InvalidDataError
from distkeras.data.feed import MinibatchFeed, column_to_numpy
from distkeras.data.tensors import pack_arrow_column, pack_rows, packed_size, unpack_column


def _matrix(rows=7, width=6, seed=0):
    return np.random.default_rng(seed).normal(size=(rows, width)).astype(np.float32)


def test_pack_rows_writes_each_row_as_its_float32_bytes():
    matrix = _matrix()
    packed = pack_rows(matrix)
    assert packed.type == pa.binary()
    assert [value.as_py() for value in packed] == [row.tobytes() for row in matrix]


def test_unpack_round_trips_any_shape_and_slice():
    matrix = _matrix(rows=9, width=12)
    packed = pack_rows(matrix)
    np.testing.assert_array_equal(unpack_column(packed, (3, 4), "x"), matrix.reshape(9, 3, 4))
    # A slice (as an Arrow record batch split into pieces gives) starts mid-buffer.
    np.testing.assert_array_equal(unpack_column(packed.slice(4, 3), (12,), "x"), matrix[4:7])
    assert unpack_column(packed.slice(2, 0), (12,), "x").shape == (0, 12)


def test_unpack_reads_large_and_fixed_size_binary():
    matrix = _matrix(rows=5, width=3)
    large = pa.array([row.tobytes() for row in matrix], pa.large_binary())
    fixed = pa.array([row.tobytes() for row in matrix], pa.binary(12))
    np.testing.assert_array_equal(unpack_column(large.slice(1), (3,), "x"), matrix[1:])
    np.testing.assert_array_equal(unpack_column(fixed.slice(2), (3,), "x"), matrix[2:])
    with pytest.raises(ValueError, match=r"'x'.*every row has 12 bytes.*16 bytes"):
        unpack_column(fixed, (4,), "x")


def test_unpack_names_the_column_and_a_wrong_row_length():
    rows = [np.zeros(4, np.float32).tobytes()] * 3 + [np.zeros(3, np.float32).tobytes()]
    with pytest.raises(ValueError, match=r"'pixels'.*a row has 12 bytes.*4 values per row "
                                         r"\(16 bytes"):
        unpack_column(pa.array(rows, pa.binary()), (4,), "pixels")


def test_pack_arrow_column_flattens_nested_and_sliced_lists():
    nested = pa.array([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]],
                       [[9.0, 10.0], [11.0, 12.0]]], pa.list_(pa.list_(pa.float64())))
    packed = pack_arrow_column(nested.slice(1, 2))
    np.testing.assert_array_equal(unpack_column(packed, (2, 2), "x"),
                                  np.arange(5, 13, dtype=np.float32).reshape(2, 2, 2))
    fixed = pa.array([[1, 2], [3, 4], [5, 6]], pa.list_(pa.int32(), 2))
    np.testing.assert_array_equal(unpack_column(pack_arrow_column(fixed.slice(1)), (2,), "x"),
                                  [[3, 4], [5, 6]])


def test_pack_arrow_column_keeps_rows_of_different_lengths_and_refuses_nulls():
    packed = pack_arrow_column(pa.array([[1.0], [2.0, 3.0], []], pa.list_(pa.float32())))
    assert [packed_size(value.as_py()) for value in packed] == [1, 2, 0]
    with pytest.raises(ValueError, match="null arrays"):
        pack_arrow_column(pa.array([[1.0], None], pa.list_(pa.float32())))
    with pytest.raises(ValueError, match="null values"):
        pack_arrow_column(pa.array([[1.0, None]], pa.list_(pa.float32())))
    # Named, as the feed names a null row's column (the pack used to name none).
    with pytest.raises(InvalidDataError, match=r"Column 'pixels' holds null arrays.*"
                                               r"dropna\(subset=\['pixels'\]\)"):
        pack_arrow_column(pa.array([[1.0], None], pa.list_(pa.float32())), "pixels")
    with pytest.raises(InvalidDataError, match="Column 'pixels' holds null values inside"):
        pack_arrow_column(pa.array([[[1.0, None]]], pa.list_(pa.list_(pa.float32()))),
                          "pixels")
    with pytest.raises(ValueError, match="not a whole number of float32"):
        packed_size(b"12345")


def test_feed_gives_the_same_minibatches_from_packed_and_array_columns():
    features = _matrix(rows=50, width=4, seed=3)
    labels = np.arange(50, dtype=np.float32)

    def batches(column):
        return [pa.record_batch({"x": column.slice(start, 16),
                                 "y": pa.array(labels[start:start + 16])})
                for start in range(0, 50, 16)]

    def minibatches(column):
        feed = MinibatchFeed(iter(batches(column)), ["x"], ["y"], 12, [(2, 2)], [()])
        return list(feed)

    from distkeras.datasets import float_lists

    packed, listed = minibatches(pack_rows(features)), minibatches(float_lists(features))
    assert [len(x) for x, _ in packed] == [12, 12, 12, 12, 2]
    for (x_packed, y_packed), (x_listed, y_listed) in zip(packed, listed, strict=True):
        np.testing.assert_array_equal(x_packed, x_listed)
        np.testing.assert_array_equal(y_packed, y_listed)
    assert column_to_numpy(pack_rows(features), (4,), "x").dtype == np.float32


# -- on Spark ---------------------------------------------------------------------------------


@pytest.mark.spark
def test_transformer_packs_arrays_vectors_and_nested_arrays_in_a_saved_pipeline(spark,
                                                                                tmp_path):
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.linalg import Vectors

    from distkeras.transformers import PackedTensorTransformer, ReshapeTransformer

    rows = [(0, [0.5, 1.0, -2.0, 3.0], Vectors.sparse(4, [2], [7.0])),
            (1, [4.0, 5.0, 6.0, 7.0], Vectors.dense([1.0, 2.0, 3.0, 4.0]))]
    frame = spark.createDataFrame(rows, ["id", "a", "v"]).coalesce(1)
    pipeline = Pipeline(stages=[
        ReshapeTransformer(input_col="a", output_col="a_2x2", shape=(2, 2)),
        PackedTensorTransformer(input_col="a", output_col="a_packed"),
        PackedTensorTransformer(input_col="v", output_col="v_packed"),
        PackedTensorTransformer(input_col="a_2x2", output_col="a_2x2_packed"),
    ])
    pipeline.fit(frame).save(str(tmp_path / "model"))
    out = PipelineModel.load(str(tmp_path / "model")).transform(frame).orderBy("id").collect()
    assert out[0].a_packed == np.float32([0.5, 1.0, -2.0, 3.0]).tobytes()
    assert out[1].a_2x2_packed == np.float32([4.0, 5.0, 6.0, 7.0]).tobytes()
    assert [row.v_packed for row in out] == [np.float32([0, 0, 7, 0]).tobytes(),
                                             np.float32([1, 2, 3, 4]).tobytes()]
    with pytest.raises(TypeError, match="single numbers"):
        PackedTensorTransformer(input_col="id", output_col="p").transform(frame)


@pytest.mark.spark
def test_adag_trains_on_packed_features(spark, fashion_test):
    from conftest import TRAIN_LIMIT, accuracy, build_mlp

    from distkeras.datasets import load_fashion_mnist
    from distkeras.trainers import ADAG

    packed = load_fashion_mnist(spark, "train", limit=TRAIN_LIMIT, packed=True,
                                num_partitions=2).cache()
    assert packed.schema["features"].dataType.simpleString() == "binary"
    trainer = ADAG(keras_model=build_mlp(), worker_optimizer="adam",
                   loss="categorical_crossentropy", num_workers=2, batch_size=32,
                   communication_window=4, features_col="features", label_col="label")
    model = trainer.train(packed, verbose=0)
    assert sum(len(trainer.get_executor_history(i)) for i in range(2)) >= TRAIN_LIMIT // 32
    assert accuracy(model, fashion_test) > 0.7
    packed.unpersist()


@pytest.mark.spark
def test_packed_features_of_the_wrong_size_fail_before_training(spark):
    from conftest import build_mlp

    from distkeras.trainers import ADAG

    frame = spark.createDataFrame([(bytearray(np.zeros(10, np.float32).tobytes()),
                                    [1.0] + [0.0] * 9)], "features binary, label array<float>")
    trainer = ADAG(keras_model=build_mlp(), worker_optimizer="adam",
                   loss="categorical_crossentropy", num_workers=1)
    with pytest.raises(ValueError, match=r"'features' holds 10 values per row.*\(784,\)"):
        trainer.train(frame, verbose=0)


@pytest.mark.spark
def test_raw_image_bytes_are_named_as_such_before_training(spark):
    """Raw uint8 pixels in a binary column were reported as "48 values per row" for an
    8x8x3 image, with nothing about bytes: the error now says how a binary column is read
    and to decode the pixels first."""
    import keras

    from distkeras.trainers import SingleTrainer

    pixels = np.arange(8 * 8 * 3, dtype=np.uint8).tobytes()
    frame = spark.createDataFrame([(bytearray(pixels), 1)], "image binary, label int")
    model = keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Flatten(),
                              keras.layers.Dense(2, activation="softmax")])
    trainer = SingleTrainer(keras_model=model, worker_optimizer="adam",
                            loss="sparse_categorical_crossentropy", features_col="image")
    with pytest.raises(ValueError, match=r"packed float32 values, 4 bytes each.* 192 bytes, "
                                         r"the model needs 768\..*raw pixels \(uint8\)"):
        trainer.train(frame, verbose=0)


@pytest.mark.spark
def test_predictor_reads_packed_features_like_arrays(spark):
    import keras

    from distkeras.predictors import ModelPredictor
    from distkeras.transformers import PackedTensorTransformer

    keras.utils.set_random_seed(4)
    model = keras.Sequential([keras.Input((3, 2)), keras.layers.Flatten(),
                              keras.layers.Dense(4, activation="softmax")])
    x = _matrix(rows=23, width=6, seed=5)
    frame = spark.createDataFrame([(i, x[i].tolist()) for i in range(23)],
                                  "id int, features array<float>").repartition(2)
    packed = PackedTensorTransformer(input_col="features", output_col="features").transform(
        frame)
    out = ModelPredictor(model, batch_size=8).predict(packed).orderBy("id").collect()
    np.testing.assert_allclose([row.prediction for row in out],
                               model.predict(x.reshape(23, 3, 2), verbose=0), atol=1e-6)
