"""AllReduceTrainer on the shared local[2] Spark session: a real barrier stage of two
workers whose steps all-reduce; what it refuses before any Spark job."""

import json

import numpy as np
import pytest

from conftest import accuracy, build_mlp


def _trainer(model=None, **kwargs):
    from distkeras.trainers import AllReduceTrainer

    return AllReduceTrainer(model or build_mlp(64), "adam", "categorical_crossentropy",
                            metrics=["accuracy"], batch_size=32, **kwargs)


def _trainer_from(weights, **kwargs):
    trainer = _trainer(**kwargs)
    trainer.master_model.set_weights(weights)
    return trainer


def _steps(trainer):
    return sum(1 for record in trainer.get_history() if record["worker_id"] == 0)


@pytest.fixture(scope="module")
def two_epochs(fashion_train):
    """Two epochs in one barrier job: ``(frame, initial weights, trainer, model)``."""
    frame = fashion_train.limit(3000).repartition(2)
    start = build_mlp(64).get_weights()
    trainer = _trainer_from(start, num_workers=2, num_epoch=2)
    # verbose=2: the workers' steps reach the driver's progress from their child processes.
    return frame, start, trainer, trainer.train(frame, verbose=2)


def test_two_workers_learn_in_one_barrier_job(two_epochs, fashion_test):
    _, _, trainer, model = two_epochs
    assert accuracy(model, fashion_test) > 0.7
    history = trainer.get_history()
    by_worker = {worker: [r for r in history if r["worker_id"] == worker] for worker in (0, 1)}
    # The same steps on both workers: a global batch each, with the same logs.
    assert len(by_worker[0]) == len(by_worker[1]) > 0
    assert [r["loss"] for r in by_worker[0]] == pytest.approx([r["loss"] for r in by_worker[1]])
    assert {r["epoch"] for r in history} == {0, 1}
    assert trainer.get_training_time() > 0
    assert len(trainer.get_averaged_history()["loss"]) == len(by_worker[0])
    # The returned optimizer goes on where the workers' ended (Adam's step count).
    assert int(model.optimizer.iterations.numpy()) == len(by_worker[0])


def test_validation_and_callbacks_run_between_epoch_jobs(fashion_train, fashion_test):
    import keras

    seen = []
    trainer = _trainer(num_workers=2, num_epoch=2)
    model = trainer.train(fashion_train.limit(1500).repartition(2), verbose=0,
                          validation_data=(fashion_test[0][:500],
                                           np.eye(10)[fashion_test[1][:500]]),
                          callbacks=[keras.callbacks.LambdaCallback(
                              on_epoch_end=lambda epoch, logs: seen.append(epoch))])
    records = trainer.get_validation_history()
    assert [record["epoch"] for record in records] == [1, 2]
    assert records[-1]["val_accuracy"] > 0.5
    assert seen == [0, 1]
    held_out = (fashion_test[0][:500], fashion_test[1][:500])
    assert accuracy(model, held_out) == pytest.approx(records[-1]["val_accuracy"], abs=1e-6)


def test_too_few_slots_are_refused_before_the_job(fashion_train):
    with pytest.raises(ValueError, match=r"needs 3 task slots at once.*has 2"):
        _trainer(num_workers=3).train(fashion_train, verbose=0)


def test_a_checkpoint_after_each_epoch_and_a_run_that_resumes_it(two_epochs, tmp_path):
    from distkeras.training.checkpoints import load_checkpoint

    # The two epochs of one job again: one with a checkpoint, then one resumed from it.
    frame, start, _, expected = two_epochs
    spec = [(weight.shape, weight.dtype) for weight in start]
    folder = str(tmp_path / "checkpoints")
    first = _trainer_from(start, num_epoch=1)
    model = first.train(frame, verbose=0, checkpoint_dir=folder)
    steps = _steps(first)
    saved = load_checkpoint(folder, spec)
    assert (saved["epoch"], saved["num_updates"], saved["trainer"]) == (
        1, steps, "AllReduceTrainer")
    for weight, returned in zip(saved["center"], model.get_weights()):
        np.testing.assert_array_equal(weight, returned)

    resumed_trainer = _trainer_from(start, num_epoch=2)
    resumed = resumed_trainer.train(frame, verbose=0, checkpoint_dir=folder, resume=True)
    assert {record["epoch"] for record in resumed_trainer.get_history()} == {1}
    assert _steps(resumed_trainer) == steps
    # Adam's step count went on from the checkpoint's optimizer state.
    assert int(resumed.optimizer.iterations.numpy()) == 2 * steps
    saved = load_checkpoint(folder, spec)
    assert (saved["epoch"], saved["num_updates"]) == (2, 2 * steps)
    for weight, whole in zip(resumed.get_weights(), expected.get_weights()):
        np.testing.assert_allclose(weight, whole, rtol=1e-5, atol=1e-6)


def _adam_state(model, iterations):
    import keras

    model.compile(keras.optimizers.Adam(), "categorical_crossentropy")
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(iterations)
    return [np.array(variable.value) for variable in model.optimizer.variables]


def test_a_run_resumed_after_its_last_epoch_returns_the_checkpoint(fashion_train, tmp_path):
    from distkeras.training.checkpoints import save_epoch_checkpoint

    saved = build_mlp(64)
    save_epoch_checkpoint(str(tmp_path), saved.get_weights(), _adam_state(saved, 7), 1, 7,
                          "AllReduceTrainer")
    model = _trainer(num_epoch=1).train(fashion_train, verbose=0,
                                        checkpoint_dir=str(tmp_path), resume=True)
    for weight, returned in zip(saved.get_weights(), model.get_weights()):
        np.testing.assert_array_equal(weight, returned)
    assert int(model.optimizer.iterations.numpy()) == 7


def test_bad_resumes_are_refused_before_the_job(fashion_train, tmp_path):
    import keras

    from distkeras.training.checkpoints import save_epoch_checkpoint

    with pytest.raises(ValueError, match="resume=True needs the checkpoint_dir"):
        _trainer().train(fashion_train, verbose=0, resume=True)
    saved = build_mlp(64)
    saved.compile(keras.optimizers.SGD(momentum=0.9), "categorical_crossentropy")
    saved.optimizer.build(saved.trainable_variables)
    save_epoch_checkpoint(str(tmp_path), saved.get_weights(),
                          [np.array(v.value) for v in saved.optimizer.variables], 1, 3,
                          "AllReduceTrainer")
    with pytest.raises(ValueError, match="holds the state of another optimizer"):
        _trainer(num_epoch=2).train(fashion_train, verbose=0, checkpoint_dir=str(tmp_path),
                                    resume=True)
    with pytest.raises(ValueError, match="does not fit this model"):
        _trainer(build_mlp(32), num_epoch=2).train(
            fashion_train, verbose=0, checkpoint_dir=str(tmp_path), resume=True)


@pytest.mark.parametrize("backend", ["torch", "tensorflow"])
def test_other_backends_are_refused(backend):
    from distkeras.training.allreduce import check_backend

    with pytest.raises(ValueError, match=f"JAX backend only.*'{backend}'"):
        check_backend(backend)


def test_the_trainer_is_registered_and_round_trips_its_config():
    from distkeras import trainers
    from distkeras.training.registry import get_trainer_class

    assert get_trainer_class("AllReduceTrainer") is trainers.AllReduceTrainer
    trainer = _trainer(num_workers=2, collective_timeout=30)
    config = trainer.get_config()
    assert "parallelism_factor" not in config and config["collective_timeout"] == 30
    again = type(trainer).from_config(json.loads(json.dumps(config)),
                                      keras_model=build_mlp(8))
    assert again.get_config() == config
    with pytest.raises(ValueError, match="collective_timeout"):
        _trainer(collective_timeout=0).validate_arguments()
