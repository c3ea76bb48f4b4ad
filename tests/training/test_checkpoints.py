"""Checkpoints of the center variable, and resuming after the driver was killed."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from conftest import accuracy, build_mlp

from distkeras.training.checkpoints import checkpoint_path, load_checkpoint
from distkeras.trainers import ADAG, SingleTrainer, TrainingError
from distkeras.workers import ADAGWorker
from worker_support import FailingOnceADAG


def _adag(**kwargs):
    settings = dict(keras_model=build_mlp(), worker_optimizer="adam",
                    loss="categorical_crossentropy", num_workers=2, communication_window=2)
    settings.update(kwargs)
    return ADAG(**settings)


def _spec(model):
    return [(w.shape, w.dtype) for w in model.get_weights()]


def test_checkpoints_hold_the_final_center(fashion_train, tmp_path):
    folder = f"file://{tmp_path}/ckpt"
    trainer = _adag()
    model = trainer.train(fashion_train.limit(2000), verbose=0, checkpoint_dir=folder,
                          checkpoint_every=0.2)
    checkpoint = load_checkpoint(folder, _spec(model))
    assert checkpoint["num_updates"] == trainer.parameter_server.num_updates > 0
    for saved, final in zip(checkpoint["center"], model.get_weights()):
        np.testing.assert_array_equal(saved, final)
    assert checkpoint["trainer"] == "ADAG"


def test_bad_checkpoint_settings_are_refused(fashion_train, tmp_path):
    with pytest.raises(ValueError, match="resume=True needs the checkpoint_dir"):
        _adag().train(fashion_train, resume=True)
    with pytest.raises(ValueError, match="keeps no center variable"):
        SingleTrainer(build_mlp(), "adam", "categorical_crossentropy").train(
            fashion_train, checkpoint_dir=str(tmp_path))
    import keras

    other = keras.Sequential([keras.Input((784,)), keras.layers.Dense(10)])
    folder = str(tmp_path / "mismatch")
    _adag().train(fashion_train.limit(300), verbose=0, checkpoint_dir=folder)
    with pytest.raises(ValueError, match="does not fit this model"):
        load_checkpoint(folder, _spec(other))


class FailingLateWorker(ADAGWorker):
    """Worker 1 fails, on every attempt, once it has committed a few windows."""

    def communicate(self):
        if self.worker_id == 1 and self.iteration > 8:
            raise ValueError("disk full on this executor")
        super().communicate()


class FailingLateADAG(ADAG):
    def allocate_worker(self):
        return FailingLateWorker(self.master_model)


def test_a_failed_training_leaves_the_center_it_reached_to_resume_from(fashion_train,
                                                                        tmp_path, caplog):
    """The center was saved every checkpoint_every seconds and at a successful end only: a
    training that failed before its first periodic checkpoint left nothing, and
    resume=True started again from the model's weights."""
    folder = str(tmp_path / "ckpt")
    trainer = FailingLateADAG(keras_model=build_mlp(), worker_optimizer="adam",
                              loss="categorical_crossentropy", num_workers=2,
                              communication_window=2)
    with caplog.at_level("WARNING", logger="distkeras"):
        with pytest.raises(TrainingError, match="disk full on this executor"):
            trainer.train(fashion_train.limit(1000), verbose=0, checkpoint_dir=folder)
    server = trainer.parameter_server
    saved = load_checkpoint(folder, _spec(build_mlp()))
    assert saved is not None and saved["num_updates"] == server.num_updates > 0
    for kept, center in zip(saved["center"], server.center_variable):
        np.testing.assert_array_equal(kept, center)
    assert "resume=True) goes on from it" in caplog.text


DRIVER = textwrap.dedent("""
    import sys
    from distkeras.session import local_spark_session
    spark = local_spark_session("local[2]")
    sys.path.insert(0, {tests!r})
    from conftest import build_mlp
    from distkeras.trainers import ADAG
    data = spark.read.parquet({data!r})
    trainer = ADAG(keras_model=build_mlp(), worker_optimizer="adam",
                   loss="categorical_crossentropy", num_workers=2, communication_window=2,
                   num_epoch=20)
    trainer.train(data, verbose=0, checkpoint_dir={folder!r}, checkpoint_every=0.5)
""")


def test_resume_after_the_driver_was_killed(fashion_train, fashion_test, tmp_path):
    data = str(tmp_path / "data.parquet")
    fashion_train.limit(3000).write.parquet(data)
    folder = str(tmp_path / "ckpt")
    tests = os.path.dirname(os.path.dirname(__file__))
    script = DRIVER.format(tests=tests, data=data, folder=folder)
    driver = subprocess.Popen([sys.executable, "-c", script], start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:  # until a checkpoint holds some training
            assert driver.poll() is None, "the training driver died on its own"
            if os.path.exists(checkpoint_path(folder)) and \
                    load_checkpoint(folder, _spec(build_mlp()))["num_updates"] > 0:
                break
            time.sleep(0.2)
    finally:
        os.killpg(driver.pid, signal.SIGKILL)  # the driver, Spark's JVM and the workers
        driver.wait(timeout=30)
    saved = load_checkpoint(folder, _spec(build_mlp()))
    assert saved is not None and saved["num_updates"] > 0

    trainer = _adag(communication_window=4)
    model = trainer.train(fashion_train.limit(3000), verbose=0, checkpoint_dir=folder,
                          resume=True)
    assert trainer.parameter_server.num_updates > saved["num_updates"]
    assert accuracy(model, fashion_test) > 0.6


def test_resuming_another_trainers_checkpoint_warns(tmp_path, caplog):
    from distkeras import parameter_servers
    from distkeras.training.checkpoints import restore, save_checkpoint

    model = build_mlp(32)
    written = parameter_servers.ADAGParameterServer(model)
    written.num_updates = 7
    save_checkpoint(str(tmp_path), written, "ADAG")

    server = parameter_servers.DeltaParameterServer(model)
    with caplog.at_level("WARNING", logger="distkeras"):
        restore(server, str(tmp_path), "DOWNPOUR")  # as a DOWNPOUR run resumes
    assert server.num_updates == 7
    assert "written by ADAG; resuming it with DOWNPOUR" in caplog.text


class _Center:
    """What `save_checkpoint` reads of a parameter server."""

    def __init__(self, center):
        import threading

        self.mutex, self.center_variable, self.num_updates = threading.Lock(), center, 7


@pytest.mark.parametrize("damage", ["cut short", "garbage", "empty"])
def test_a_damaged_checkpoint_is_called_damaged_not_another_models(tmp_path, damage):
    from distkeras.training.checkpoints import save_checkpoint

    center = [np.ones((3, 4), np.float32), np.zeros(4, np.float32)]
    save_checkpoint(str(tmp_path), _Center(center), "ADAG")
    path = checkpoint_path(str(tmp_path))
    whole = open(path, "rb").read()
    damaged = {"cut short": whole[:len(whole) // 2], "garbage": b"x" * 64, "empty": b""}
    with open(path, "wb") as handle:
        handle.write(damaged[damage])
    # It said "does not fit this model: Frame of 247 bytes exceeds the limit of 132", for
    # the very model that wrote it.
    with pytest.raises(ValueError, match=rf"The checkpoint {path} is damaged .*Delete it"):
        load_checkpoint(str(tmp_path), [(w.shape, w.dtype) for w in center])
    with open(path, "wb") as handle:
        handle.write(whole)
    assert load_checkpoint(str(tmp_path), [(w.shape, w.dtype) for w in center])[
        "num_updates"] == 7
    with pytest.raises(ValueError, match="does not fit this model: Field 'center' array 0 is "
                                         r"float32\[3, 4\]; the model expects float32\[3, 5\]"):
        load_checkpoint(str(tmp_path), [((3, 5), np.float32), ((4,), np.float32)])


def test_resuming_at_learning_rate_zero_returns_the_checkpoint_bit_for_bit(fashion_train,
                                                                          tmp_path):
    """A resumed run starts from the saved center, on the server and in every worker, and a
    retried worker from the current center (never from the model's weights): at learning
    rate 0 nothing moves it."""
    import keras

    from distkeras import parameter_servers
    from distkeras.training.checkpoints import save_checkpoint

    saved_model = build_mlp()
    rng = np.random.default_rng(5)
    saved_model.set_weights([weight + rng.normal(scale=0.05, size=weight.shape).astype(
        weight.dtype) for weight in saved_model.get_weights()])
    save_checkpoint(str(tmp_path), parameter_servers.ADAGParameterServer(saved_model), "ADAG")
    trainer = FailingOnceADAG(keras_model=build_mlp(), worker_optimizer=keras.optimizers.SGD(
        0.0), loss="categorical_crossentropy", num_workers=2, communication_window=2)
    model = trainer.train(fashion_train.limit(2000), verbose=0, checkpoint_dir=str(tmp_path),
                          resume=True)
    assert trainer.parameter_server.num_updates > 0  # both workers committed, zeros
    assert {record.get("attempt") for record in trainer.get_executor_history(1)} == {1}
    for got, want, initial in zip(model.get_weights(), saved_model.get_weights(),
                                  trainer.master_model.get_weights()):
        assert got.tobytes() == want.tobytes()
        assert not np.array_equal(got, initial)
