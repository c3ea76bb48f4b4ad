"""A trainer's settings apart from its runs (issue #34): the constructor stores, `train()`
never changes what it stored, and each run owns its state."""

import copy
import pickle
import threading

import pytest
from conftest import build_mlp


def _compiled_mlp():
    import keras

    inputs = keras.Input((784,), name="pixels")
    outputs = keras.layers.Dense(10, activation="softmax", name="digit")(
        keras.layers.Dense(16, activation="relu")(inputs))
    model = keras.Model(inputs, outputs)
    model.compile("adam", "categorical_crossentropy", metrics=["accuracy"])
    return model


def test_settings_are_resolved_per_run_and_the_trainer_keeps_what_it_was_given():
    from distkeras.trainers import ADAG

    model = _compiled_mlp()
    trainer = ADAG(model, features_col={"pixels": "features"}, label_col={"digit": "label"})
    before = trainer.get_config()
    settings = trainer.settings()
    # The compiled model lends its optimizer, loss and metrics; dicts become lists.
    assert settings.worker_optimizer is model.optimizer
    assert settings.loss == "categorical_crossentropy"
    assert settings.features_col == ["features"] and settings.label_col == ["label"]
    trainer.validate_arguments()
    assert trainer.worker_optimizer is None and trainer.metrics is None
    assert trainer.features_col == {"pixels": "features"}
    assert trainer.get_config() == before
    with pytest.raises(AttributeError, match="frozen"):
        settings.batch_size = 64
    assert trainer.settings(num_epoch=3).num_epoch == 3 and trainer.num_epoch == 1
    with pytest.raises(ValueError, match="no setting 'epochs'"):
        trainer.settings(epochs=3)


def test_a_bad_setting_is_refused_without_changing_the_trainer():
    from distkeras.trainers import EnsembleTrainer

    trainer = EnsembleTrainer(build_mlp(8), "adam", "categorical_crossentropy",
                              num_ensembles=3)
    assert trainer.settings().num_workers == 3
    trainer.num_ensembles = 0
    with pytest.raises(ValueError, match="num_ensembles"):
        trainer.validate_arguments()
    assert trainer.num_workers == 3  # EnsembleTrainer's num_workers was rewritten here


def test_the_plans_declare_what_they_can_do():
    from distkeras.trainers import ADAG, AveragingTrainer, EnsembleTrainer, SingleTrainer

    assert ADAG.plan.keeps_center and not SingleTrainer.plan.keeps_center
    assert not EnsembleTrainer.plan.watches_one_model
    assert all(cls.plan.follows_learning_rate_callbacks
               for cls in (ADAG, AveragingTrainer, SingleTrainer))
    assert not EnsembleTrainer.plan.follows_learning_rate_callbacks


@pytest.mark.parametrize("name", ["SingleTrainer", "ADAG", "AveragingTrainer",
                                  "EnsembleTrainer"])
def test_get_config_is_the_same_before_and_after_train(name, fashion_train):
    from distkeras import trainers

    cls = getattr(trainers, name)
    options = {} if name == "SingleTrainer" else \
        {"num_ensembles": 2} if name == "EnsembleTrainer" else {"num_workers": 2}
    # Compiled, with columns by name: train() resolves the optimizer, loss, metrics and
    # columns (validate_arguments wrote them back before).
    trainer = cls(_compiled_mlp(), features_col={"pixels": "features"},
                  label_col={"digit": "label"}, num_epoch=2, **options)
    before = copy.deepcopy(trainer.get_config())
    trainer.train(fashion_train.limit(256), verbose=0)
    assert trainer.get_config() == before
    assert trainer.worker_optimizer is None and trainer.features_col == {"pixels": "features"}
    assert len(trainer.get_history()) > 0 and trainer.get_training_time() > 0


def test_a_trained_trainer_cloudpickles_with_its_results(fashion_train):
    from pyspark import cloudpickle

    from distkeras.trainers import ADAG

    trainer = ADAG(build_mlp(8), "adam", "categorical_crossentropy", num_workers=2)
    trainer.train(fashion_train.limit(256), verbose=0)
    twin = cloudpickle.loads(cloudpickle.dumps(trainer))
    assert twin.get_history() == trainer.get_history()
    assert twin.get_staleness() == trainer.get_staleness()
    assert twin.num_updates() == trainer.num_updates() > 0
    assert pickle.loads(pickle.dumps(twin)).get_config() == trainer.get_config()


def test_two_threads_train_one_trainer_each_with_its_own_run(fashion_train):
    from distkeras.trainers import SingleTrainer

    trainer = SingleTrainer(build_mlp(8), "sgd", "categorical_crossentropy")
    frames = [fashion_train.limit(128), fashion_train.limit(256)]
    models, errors = [None, None], []

    def train(index):
        try:
            models[index] = trainer.train(frames[index], verbose=0)
        except Exception as error:  # reported below, in the test's thread
            errors.append(error)

    threads = [threading.Thread(target=train, args=(index,)) for index in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and all(model is not None for model in models)
    # The getters read one whole run, the one that ended last: never a mix of the two.
    assert sum(record["batch_size"] for record in trainer.get_history()) in (128, 256)
