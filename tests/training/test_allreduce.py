"""AllReduceTrainer on the shared local[2] Spark session: a real barrier stage of two
workers whose steps all-reduce; what it refuses before any Spark job."""

import json

import numpy as np
import pytest

from conftest import accuracy, build_mlp


def _trainer(**kwargs):
    from distkeras.trainers import AllReduceTrainer

    return AllReduceTrainer(build_mlp(64), "adam", "categorical_crossentropy",
                            metrics=["accuracy"], batch_size=32, **kwargs)


def test_two_workers_learn_in_one_barrier_job(fashion_train, fashion_test):
    trainer = _trainer(num_workers=2, num_epoch=2)
    # verbose=2: the workers' steps reach the driver's progress from their child processes.
    model = trainer.train(fashion_train.limit(3000).repartition(2), verbose=2)
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


def test_checkpoints_are_refused(fashion_train, tmp_path):
    with pytest.raises(ValueError, match="checkpoint_dir and resume need"):
        _trainer().train(fashion_train, verbose=0, checkpoint_dir=str(tmp_path))


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
