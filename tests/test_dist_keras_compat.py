"""A script written for the original dist-keras: its trainer setters and utils run here."""

import logging

import numpy as np
import pytest

from conftest import accuracy, build_mlp


def test_setters_store_what_the_getters_and_the_config_read(spark):
    # spark: started before Keras (JAX) is imported, as in every test that builds a model.
    from distkeras.trainers import ADAG, AEASGD, SingleTrainer

    trainer = ADAG(build_mlp(), "adam", "categorical_crossentropy")
    trainer.set_minibatch_size(20)
    trainer.set_num_epoch(3)
    trainer.set_num_workers(4)
    trainer.set_parallelism_factor(2)
    trainer.set_learning_rate(0.5)
    assert (trainer.get_minibatch_size(), trainer.get_num_epoch(), trainer.get_num_workers(),
            trainer.get_parallelism_factor(), trainer.get_learning_rate()) == (20, 3, 4, 2, 0.5)
    config = trainer.get_config()
    assert (config["batch_size"], config["num_epoch"], config["num_workers"],
            config["parallelism_factor"], config["learning_rate"]) == (20, 3, 4, 2, 0.5)
    assert trainer.num_partitions() == 8
    assert (trainer.get_features_column(), trainer.get_label_column()) == ("features", "label")
    assert trainer.num_updates() == 0 and not trainer.has_history()
    assert AEASGD(build_mlp(), "sgd", "mse").get_learning_rate() == 0.1
    replacement = build_mlp(16)
    single = SingleTrainer(build_mlp(), "adam", "categorical_crossentropy")
    single.set_model(replacement)
    assert single.master_model is replacement
    assert not hasattr(single, "set_parallelism_factor")  # one replica: nothing to set


def test_a_bad_value_given_to_a_setter_is_refused_by_train_with_its_name(fashion_train):
    from distkeras.trainers import DOWNPOUR

    trainer = DOWNPOUR(build_mlp(), "adam", "categorical_crossentropy")
    trainer.set_parallelism_factor(0)
    with pytest.raises(ValueError, match="parallelism_factor"):
        trainer.train(fashion_train.limit(100), verbose=0)


def test_a_dist_keras_script_trains_as_written(fashion_train, fashion_test, caplog):
    """The original's way: shuffle and precache the data, configure with setters."""
    from distkeras.trainers import ADAG
    from distkeras.utils import (deserialize_keras_model, precache, serialize_keras_model,
                                 shuffle)

    dataset = precache(shuffle(fashion_train.limit(2000), seed=1), 2)
    assert dataset.rdd.getNumPartitions() == 2 and dataset.is_cached
    trainer = ADAG(keras_model=build_mlp(), worker_optimizer="adam",
                   loss="categorical_crossentropy", num_workers=2, batch_size=32,
                   communication_window=5, num_epoch=1, features_col="features",
                   label_col="label")
    trainer.set_parallelism_factor(2)
    trainer.set_minibatch_size(20)
    trainer.set_num_epoch(2)
    with caplog.at_level(logging.WARNING, logger="distkeras.compat"):
        trainer.set_max_prefetch(100)
    assert any("no effect" in record.getMessage() for record in caplog.records)
    trained = trainer.train(dataset, verbose=0)

    history = trainer.get_history()
    assert trainer.has_history()
    assert {record["batch_size"] for record in history} == {20}
    assert sum(record["batch_size"] for record in history) == 2 * 2000  # two epochs
    # Four partitions (2 workers x parallelism 2), each a Spark task of its own.
    assert len({record["worker_id"] for record in history}) == 4
    # Every commit the server applied: one per window of 5 steps or at a partition's end.
    assert trainer.num_updates() == len(trainer.get_staleness()) >= len(history) // 5
    assert accuracy(trained, fashion_test) > 0.6
    again = deserialize_keras_model(serialize_keras_model(trained))
    assert all(np.array_equal(a, b) for a, b in zip(again.get_weights(),
                                                       trained.get_weights()))


def test_precache_refuses_a_bad_number_of_workers(spark):
    from distkeras.utils import precache

    with pytest.raises(ValueError, match="num_workers=0"):
        precache(spark.range(3), 0)
