"""``num_server_shards`` on real local Spark: a sharded center trains, and the settings
that cannot be sharded are refused before any Spark job."""

import math
import time

import pytest

from conftest import accuracy, build_mlp


@pytest.mark.parametrize("compression", [None, "topk:0.1"])
def test_adag_with_two_server_shards_learns(spark, fashion_train, fashion_test,
                                            compression):
    import keras

    from distkeras.trainers import ADAG

    keras.utils.set_random_seed(5)
    rows, batch_size = 2000, 32
    trainer = ADAG(build_mlp(32), "adam", "categorical_crossentropy", num_workers=2,
                   batch_size=batch_size, num_server_shards=2, compression=compression)
    assert trainer.get_config()["num_server_shards"] == 2
    trained = trainer.train(fashion_train.limit(rows), verbose=0)
    assert trainer.parameter_server.shards is not None
    assert accuracy(trained, fashion_test) > 0.3  # it learned (chance: 0.1)
    # The steps reach the driver once (through shard 0), not once per shard.
    steps = len(trainer.get_history())
    assert 0 < steps <= math.ceil(rows / batch_size) + 2
    assert 0 < trainer.num_updates() <= steps


def test_a_shard_whose_rule_raises_fails_the_training_and_cancels_its_job(
        spark, fashion_train):
    import keras
    from pyspark import cloudpickle

    import shard_failure_support
    from distkeras.errors import TrainingError
    from distkeras.trainers import trainer_for

    # The workers run the rule's commit: the executors get its module with the task.
    cloudpickle.register_pickle_by_value(shard_failure_support)
    keras.utils.set_random_seed(5)
    rows, batch_size, epochs = 2000, 32, 20
    trainer = trainer_for(shard_failure_support.BreaksInAShard)(
        build_mlp(16), "adam", "categorical_crossentropy", num_workers=2,
        batch_size=batch_size, num_epoch=epochs, num_server_shards=2, fail_at=3)
    started = time.monotonic()
    with pytest.raises(TrainingError) as raised:
        trainer.train(fashion_train.limit(rows), verbose=0)
    assert str(raised.value).startswith("The AlgorithmServer failed: parameter server "
                                        "shard 1 of 2 (pid ")
    assert str(raised.value).endswith("ArithmeticError: the rule broke at update 3")
    # The job was cancelled as the shard failed: a small part of the 20 epochs ran (a
    # hang guard besides, far above the seconds it takes).
    steps = len(trainer.get_history())
    assert steps < epochs * math.ceil(rows / batch_size) / 10
    assert time.monotonic() - started < 300
    assert spark.sparkContext.statusTracker().getActiveJobsIds() == []


def test_settings_that_cannot_be_sharded_are_refused_before_any_job():
    from distkeras.trainers import ADAG, AsynchronousDistributedTrainer

    assert "num_server_shards" not in ADAG(build_mlp(8), "adam",
                                           "categorical_crossentropy").get_config()

    class EscapeHatch(AsynchronousDistributedTrainer):
        def allocate_worker(self):
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match="escape hatch.*num_server_shards=1"):
        EscapeHatch(build_mlp(8), "adam", "categorical_crossentropy",
                    num_server_shards=2).validate_arguments()
    ADAG(build_mlp(8), "adam", "categorical_crossentropy", compression="topk",
         num_server_shards=2).validate_arguments()
    ADAG(build_mlp(8), "adam", "categorical_crossentropy", compression="bfloat16",
         num_server_shards=2).validate_arguments()
    with pytest.raises(ValueError, match="parameter_server_location='driver' to keep the "
                                         "shards, or num_server_shards=1"):
        ADAG(build_mlp(8), "adam", "categorical_crossentropy", num_server_shards=2,
             parameter_server_location="executor").validate_arguments()
    with pytest.raises(ValueError, match="num_server_shards"):
        ADAG(build_mlp(8), "adam", "categorical_crossentropy",
             num_server_shards=0).validate_arguments()
