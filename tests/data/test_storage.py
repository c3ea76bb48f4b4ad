"""Model and history I/O through the SparkSession's Hadoop filesystem, atomically."""

import os

import numpy as np
import pytest


def _model(seed):
    import keras

    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="adam", loss="mse")
    return model


@pytest.mark.parametrize("scheme", ["file://", ""])
def test_save_load_overwrite(spark, tmp_path, scheme):
    from distkeras import utils

    path = f"{scheme}{tmp_path}/models/model.keras"
    first, second = _model(1), _model(2)
    utils.save_model(first, path)
    loaded = utils.load_model(path)
    np.testing.assert_array_equal(loaded.get_weights()[0], first.get_weights()[0])
    assert loaded.compiled
    utils.save_model(second, path)  # overwrite
    np.testing.assert_array_equal(utils.load_model(path).get_weights()[0],
                                  second.get_weights()[0])
    leftovers = [name for name in os.listdir(tmp_path / "models")
                 if ".tmp-" in name or name.endswith(".crc")]  # no Hadoop checksum files
    assert leftovers == []


def test_failed_write_keeps_the_old_model(spark, tmp_path):
    from distkeras import utils
    from distkeras.data import storage

    path = f"file://{tmp_path}/model.keras"
    original = _model(3)
    utils.save_model(original, path)
    with pytest.raises(RuntimeError, match="disk on fire"):
        with storage.atomic_writer(path) as out:
            out.write(b"PK half an archive")
            raise RuntimeError("disk on fire")
    np.testing.assert_array_equal(utils.load_model(path).get_weights()[0],
                                  original.get_weights()[0])
    assert not [name for name in os.listdir(tmp_path) if ".tmp-" in name]


def test_history_round_trip_and_missing_file(spark, tmp_path):
    from distkeras import utils

    history = [{"worker_id": 0, "iteration": 1, "loss": 0.5}]
    utils.save_history(history, str(tmp_path / "history.json"))
    assert utils.load_history(f"file://{tmp_path}/history.json") == history
    with pytest.raises(FileNotFoundError, match="No such file"):
        utils.load_model(str(tmp_path / "absent.keras"))


def test_a_relative_path_writes_its_temporary_file_beside_it(spark):
    from distkeras.data import storage

    # A bare file name, relative to the working directory (the JVM's, for Spark): its
    # temporary file goes beside it, not to the filesystem's root, where a user may not
    # write (and from where a rename may cross filesystems).
    hadoop = storage.HadoopFS(spark, "trained.keras")
    working = hadoop.fs.getWorkingDirectory().toString()
    assert hadoop.path.getParent().toString() == working
    assert hadoop.path.toString() == f"{working}/trained.keras"


def test_a_folder_is_no_file(spark, tmp_path):
    from distkeras.data import storage

    folder = tmp_path / "folder"
    (folder / "inside").mkdir(parents=True)
    for path in (str(folder), f"file://{folder}"):
        assert storage.is_directory(path)
        with pytest.raises(IsADirectoryError, match="is a folder"):
            storage.read_bytes(path)
        with pytest.raises(IsADirectoryError, match="is a folder"):
            storage.write_bytes(path, b"bytes")
    assert not storage.is_directory(str(tmp_path / "absent"))
    assert os.listdir(folder) == ["inside"] and os.listdir(tmp_path) == ["folder"]


def test_a_path_under_a_file_is_refused_before_writing(spark, tmp_path):
    from distkeras.data import storage

    (tmp_path / "notes.txt").write_text("kept")
    for path in (tmp_path / "notes.txt" / "model.keras",
                 tmp_path / "notes.txt" / "deeper" / "model.keras"):
        # It failed in os.makedirs with "[Errno 17] File exists: '.../notes.txt'".
        with pytest.raises(NotADirectoryError, match=rf"{tmp_path / 'notes.txt'} is a file"):
            storage.check_writable(str(path))
        with pytest.raises(NotADirectoryError, match=rf"cannot write {path}"):
            storage.write_bytes(str(path), b"bytes")
    storage.check_writable(str(tmp_path / "absent" / "deeper" / "model.keras"))  # made
    assert os.listdir(tmp_path) == ["notes.txt"]
    assert (tmp_path / "notes.txt").read_text() == "kept"


def test_lambda_layer_is_refused(spark, tmp_path):
    import keras

    from distkeras import utils

    model = keras.Sequential([keras.Input((2,)), keras.layers.Lambda(lambda x: x * 2)])
    path = str(tmp_path / "lambda.keras")
    utils.save_model(model, path)
    with pytest.raises(ValueError, match="(?i)unsafe|safe_mode"):
        utils.load_model(path)
