"""Datasets written to Parquet through Spark: read back, trained on, and refused when they
should be."""

import os

import numpy as np
import pytest

pytestmark = pytest.mark.spark


def _parts(path):
    return sorted(name for name in os.listdir(path) if name.endswith(".parquet"))


def test_numpy_round_trip_in_the_trainers_layout(spark, tmp_path):
    from distkeras.data.datasets import save_numpy_parquet

    x = np.random.default_rng(0).normal(size=(37, 4, 2)).astype("float32")
    y = np.arange(37)  # each row is known by its label
    path = str(tmp_path / "data")
    save_numpy_parquet(spark, x, y, path, num_partitions=3)

    assert len(_parts(path)) == 3
    frame = spark.read.parquet(path)
    assert [(f.name, f.dataType.simpleString()) for f in frame.schema.fields] == [
        ("features", "array<float>"), ("label", "bigint")]
    rows = sorted(frame.collect(), key=lambda row: row.label)
    assert [row.label for row in rows] == list(range(37))
    np.testing.assert_array_equal(np.array([row.features for row in rows], "float32"),
                                  x.reshape(37, -1))
    sizes = [spark.read.parquet(os.path.join(path, name)).count() for name in _parts(path)]
    assert max(sizes) - min(sizes) <= 1  # round-robin: balanced files


def test_numpy_packed_features_round_trip(spark, tmp_path):
    from distkeras.data.datasets import save_numpy_parquet

    x = np.random.default_rng(1).normal(size=(11, 3, 2)).astype("float32")
    path = str(tmp_path / "packed")
    save_numpy_parquet(spark, x, np.arange(11), path, num_partitions=2, packed=True)
    frame = spark.read.parquet(path)
    assert frame.schema.simpleString() == "struct<features:binary,label:bigint>"
    rows = sorted(frame.collect(), key=lambda row: row.label)
    np.testing.assert_array_equal(
        np.stack([np.frombuffer(row.features, "<f4") for row in rows]), x.reshape(11, -1))


def test_numpy_label_kinds_and_column_names(spark, tmp_path):
    from distkeras.data.datasets import save_numpy_parquet

    x = np.arange(12, dtype="uint8").reshape(6, 2)  # converted to float
    one_hot = np.eye(3, dtype="float32")[[0, 1, 2, 0, 1, 2]]
    save_numpy_parquet(spark, x, one_hot, str(tmp_path / "a"), features_col="pixels",
                       label_col="target")
    frame = spark.read.parquet(str(tmp_path / "a"))
    assert frame.schema.simpleString() == "struct<pixels:array<float>,target:array<float>>"
    rows = sorted(frame.collect(), key=lambda row: row.pixels[0])
    assert rows[1].pixels == [2.0, 3.0] and rows[1].target == [0.0, 1.0, 0.0]

    save_numpy_parquet(spark, x, np.linspace(0, 1, 6), str(tmp_path / "b"))
    assert spark.read.parquet(str(tmp_path / "b")).schema["label"].dataType.simpleString() \
        == "float"


def test_numpy_errors(spark, tmp_path):
    from distkeras.data.datasets import save_numpy_parquet

    x, y = np.zeros((4, 3)), np.zeros(4)
    with pytest.raises(ValueError, match="x has 4 rows but y has 3"):
        save_numpy_parquet(spark, x, y[:3], str(tmp_path / "a"))
    with pytest.raises(ValueError, match="no samples"):
        save_numpy_parquet(spark, x[:0], y[:0], str(tmp_path / "a"))
    with pytest.raises(TypeError, match="`x` must hold real numbers"):
        save_numpy_parquet(spark, np.array([["a"]] * 4), y, str(tmp_path / "a"))
    with pytest.raises(ValueError, match="`mode` must be one of"):
        save_numpy_parquet(spark, x, y, str(tmp_path / "a"), mode="replace")
    with pytest.raises(ValueError, match="num_partitions"):
        save_numpy_parquet(spark, x, y, str(tmp_path / "a"), num_partitions=0)
    with pytest.raises(ValueError, match="must differ"):
        save_numpy_parquet(spark, x, y, str(tmp_path / "a"), label_col="features")
    assert not (tmp_path / "a").exists()  # refused before writing anything

    save_numpy_parquet(spark, x, y, str(tmp_path / "a"))
    with pytest.raises(FileExistsError, match="already exists. Pass mode='overwrite'"):
        save_numpy_parquet(spark, x, y, str(tmp_path / "a"))
    save_numpy_parquet(spark, x[:2], y[:2], str(tmp_path / "a"), mode="overwrite")
    assert spark.read.parquet(str(tmp_path / "a")).count() == 2


def test_save_parquet_files_and_modes(spark, tmp_path):
    from distkeras.data.datasets import save_parquet

    frame = spark.range(0, 100, 1, 7).selectExpr("id", "array(cast(id as float)) as features")
    path = str(tmp_path / "frame")
    save_parquet(frame, path)  # the session's default parallelism: local[2,4] gives 2
    assert len(_parts(path)) == spark.sparkContext.defaultParallelism
    assert sorted(row.id for row in spark.read.parquet(path).collect()) == list(range(100))

    with pytest.raises(FileExistsError, match="already exists"):
        save_parquet(frame, path)
    save_parquet(frame.limit(10), path, num_partitions=1, mode="append")
    assert spark.read.parquet(path).count() == 110
    save_parquet(frame, path, num_partitions=4, mode="overwrite", compression="none")
    assert len(_parts(path)) == 4 and all(".snappy." not in name for name in _parts(path))
    assert spark.read.parquet(path).count() == 100
    save_parquet(frame.limit(1), path, mode="ignore")  # the path exists: nothing written
    assert spark.read.parquet(path).count() == 100


def test_single_trainer_reads_what_save_numpy_parquet_wrote(spark, tmp_path, fashion_test):
    import keras

    from distkeras.data.datasets import save_numpy_parquet
    from distkeras.trainers import SingleTrainer

    images, labels = fashion_test
    path = str(tmp_path / "fashion")
    save_numpy_parquet(spark, images[:1000].reshape(1000, 28, 28), labels[:1000], path)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10, activation="softmax")])
    trainer = SingleTrainer(model, "adam", "sparse_categorical_crossentropy", batch_size=50)
    trained = trainer.train(spark.read.parquet(path), verbose=0)
    assert sum(record["batch_size"] for record in trainer.get_history()) == 1000
    accuracy = (trained.predict(images[1000:], verbose=0).argmax(1) == labels[1000:]).mean()
    assert accuracy > 0.5  # one pass of 1,000 images; chance is 0.10


def test_shuffle_reorders_the_rows_as_dist_keras_did(spark):
    # dist-keras's examples call `dataset = shuffle(dataset)` from distkeras.utils.
    from distkeras.utils import shuffle

    frame = spark.range(200).withColumnRenamed("id", "row")
    shuffled = shuffle(frame, seed=3)
    rows = [row.row for row in shuffled.collect()]
    assert shuffled.columns == ["row"]
    assert sorted(rows) == list(range(200)) and rows != list(range(200))
    assert [row.row for row in shuffle(frame, seed=3).collect()] == rows


def test_fashion_mnist_reads_unpacked_idx_files_and_names_a_folder_without_them(tmp_path):
    import gzip
    import shutil

    from distkeras.data.datasets import FASHION_MNIST_DIR, load_fashion_mnist_numpy

    # The IDX files as gunzip leaves them: read as they are, not replaced by a download.
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        with gzip.open(f"{FASHION_MNIST_DIR}/{name}.gz") as packed, \
                open(tmp_path / name, "wb") as unpacked:
            shutil.copyfileobj(packed, unpacked)
    images, labels = load_fashion_mnist_numpy("test", data_dir=str(tmp_path))
    expected_images, expected_labels = load_fashion_mnist_numpy("test")
    np.testing.assert_array_equal(images, expected_images)
    np.testing.assert_array_equal(labels, expected_labels)
    # A folder named by the user that lacks a split's files is an error naming them.
    with pytest.raises(FileNotFoundError, match=r"train-images-idx3-ubyte.gz and "
                                                r"train-labels-idx1-ubyte.gz"):
        load_fashion_mnist_numpy("train", data_dir=str(tmp_path))


def _copy_test_split(folder):
    import shutil

    from distkeras.data.datasets import FASHION_MNIST_DIR

    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(f"{FASHION_MNIST_DIR}/{name}", folder / name)


@pytest.mark.parametrize("damage", ["truncated", "not gzip", "header only"])
def test_a_damaged_idx_file_is_named_with_how_to_restore_it(tmp_path, damage):
    import gzip

    from distkeras.data.datasets import load_fashion_mnist_numpy

    _copy_test_split(tmp_path)
    images = tmp_path / "t10k-images-idx3-ubyte.gz"
    packed = images.read_bytes()
    if damage == "truncated":  # an interrupted copy: gzip's EOFError named no file
        images.write_bytes(packed[:len(packed) // 2])
    elif damage == "not gzip":
        images.write_bytes(b"<html>not found</html>")
    else:  # a header cut inside its dimensions: numpy's offset error named no file
        images.write_bytes(gzip.compress(gzip.decompress(packed)[:6]))
    with pytest.raises(ValueError, match=rf"{images}.*apt-get install --reinstall "
                                         r"dataset-fashion-mnist"):
        load_fashion_mnist_numpy("test", data_dir=str(tmp_path))


def test_images_and_labels_that_do_not_pair_up_are_refused(tmp_path):
    import shutil

    from distkeras.data.datasets import FASHION_MNIST_DIR, load_fashion_mnist_numpy

    _copy_test_split(tmp_path)
    # The training labels beside the test images: 60,000 labels for 10,000 images were
    # returned as they were, to fail (or train on the wrong pairs) far from the cause.
    shutil.copy(f"{FASHION_MNIST_DIR}/train-labels-idx1-ubyte.gz",
                tmp_path / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(ValueError, match=r"10000 images of 28x28.*60000 labels"):
        load_fashion_mnist_numpy("test", data_dir=str(tmp_path))
    # A labels file where the images go: 1-D "images".
    shutil.copy(f"{FASHION_MNIST_DIR}/t10k-labels-idx1-ubyte.gz",
                tmp_path / "t10k-images-idx3-ubyte.gz")
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte.gz holds an array of "
                                         r"shape \(10000,\)"):
        load_fashion_mnist_numpy("test", data_dir=str(tmp_path))


def test_a_failed_download_says_which_package_to_install(tmp_path, monkeypatch):
    import keras

    from distkeras.data.datasets import load_fashion_mnist_numpy

    def offline():  # what keras.utils.get_file raises without a network: a bare Exception
        raise Exception("URL fetch failure on https://example/train-labels-idx1-ubyte.gz: "
                        "None -- [Errno -3] Temporary failure in name resolution")

    monkeypatch.setattr(keras.datasets.fashion_mnist, "load_data", offline)
    monkeypatch.setenv("DISTKERAS_FASHION_MNIST_DIR", str(tmp_path / "empty"))
    with pytest.raises(FileNotFoundError, match=rf"{tmp_path / 'empty'}.*URL fetch failure"
                                                r".*apt-get install dataset-fashion-mnist"):
        load_fashion_mnist_numpy("test")


def _write_idx(path, array):
    """An IDX file (gzipped) of a uint8 array, as the MNIST files are."""
    import gzip

    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(size).to_bytes(4, "big") for size in array.shape)
    with gzip.open(path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def test_the_parquet_cache_keeps_each_folders_images_apart(spark, tmp_path):
    from distkeras.data.datasets import load_fashion_mnist

    for name, count, label in (("a", 3, 1), ("b", 4, 2)):
        folder = tmp_path / name
        folder.mkdir()
        _write_idx(folder / "t10k-images-idx3-ubyte.gz", np.zeros((count, 28, 28)))
        _write_idx(folder / "t10k-labels-idx1-ubyte.gz", np.full(count, label))
    cache = str(tmp_path / "cache")
    first = load_fashion_mnist(spark, "test", data_dir=str(tmp_path / "a"), cache_dir=cache)
    assert [row.label_index for row in first.collect()] == [1, 1, 1]
    # The cache's name said split, limit and packing only: folder b got folder a's rows.
    second = load_fashion_mnist(spark, "test", data_dir=str(tmp_path / "b"), cache_dir=cache)
    assert [row.label_index for row in second.collect()] == [2, 2, 2, 2]


@pytest.mark.parametrize("limit", [-5, 0, 2.5, True])
def test_a_limit_that_is_no_count_of_images_is_refused(spark, tmp_path, limit):
    from distkeras.data.datasets import load_fashion_mnist

    # images[:-5] kept all but the last 5 images, and images[:0] none, silently.
    with pytest.raises(ValueError, match=rf"`limit` must be None or an integer >= 1. "
                                         rf"Received: limit={limit!r}"):
        load_fashion_mnist(spark, "test", limit=limit, cache_dir=str(tmp_path))
    assert not os.listdir(tmp_path)


def test_a_parquet_write_that_fails_leaves_the_last_file_and_nothing_else(tmp_path,
                                                                           monkeypatch):
    """A write that failed midway (a full disk) left its temporary file beside the cache."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from distkeras.data.datasets import write_parquet

    path = str(tmp_path / "images.parquet")
    write_parquet(pa.table({"x": [1, 2, 3]}), path)

    def disk_full(table, where, **kwargs):
        with open(where, "wb") as handle:
            handle.write(b"PAR1 cut short")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pq, "write_table", disk_full)
    with pytest.raises(OSError, match="No space left"):
        write_parquet(pa.table({"x": [4]}), path)
    monkeypatch.undo()
    assert pq.read_table(path).column("x").to_pylist() == [1, 2, 3]
    assert os.listdir(tmp_path) == ["images.parquet"]
