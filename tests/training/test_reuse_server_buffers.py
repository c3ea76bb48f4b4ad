"""The trainers' opt-in ``reuse_server_buffers`` on real local Spark: the same training,
bit for bit, as the default server's (one worker: a deterministic run)."""

import numpy as np
import pytest

from conftest import accuracy, build_mlp


def trained_weights(fashion_train, trainer_class, reuse, **options):
    import keras

    keras.utils.set_random_seed(3)
    model = build_mlp(32)
    trainer = trainer_class(model, "adam", "categorical_crossentropy", num_workers=1,
                            reuse_server_buffers=reuse, **options)
    trained = trainer.train(fashion_train.limit(2000), verbose=0)
    server_class = type(trainer.parameter_server) if trainer.parameter_server else None
    return trained, trainer, server_class


@pytest.mark.parametrize("name", ["ADAG", "DOWNPOUR"])
def test_reuse_server_buffers_trains_the_same_model_bit_for_bit(spark, fashion_train,
                                                                fashion_test, name):
    from distkeras import trainers

    trainer_class = getattr(trainers, name)
    plain, _, _ = trained_weights(fashion_train, trainer_class, False)
    reused, trainer, _ = trained_weights(fashion_train, trainer_class, True)
    assert trainer.get_config()["reuse_server_buffers"] is True
    for want, have in zip(plain.get_weights(), reused.get_weights()):
        np.testing.assert_array_equal(have, want)
    assert accuracy(reused, fashion_test) > 0.2  # it trained (chance: 0.1)


def test_reuse_server_buffers_reaches_the_server_and_is_checked():
    from distkeras.trainers import ADAG, DOWNPOUR

    for trainer_class in (ADAG, DOWNPOUR):
        trainer = trainer_class(build_mlp(8), "adam", "categorical_crossentropy",
                                reuse_server_buffers=True)
        assert trainer.allocate_parameter_server().reuse_buffers is True
        assert "reuse_server_buffers" not in trainer_class(
            build_mlp(8), "adam", "categorical_crossentropy").get_config()
    trainer = ADAG(build_mlp(8), "adam", "categorical_crossentropy",
                   reuse_server_buffers="yes")
    with pytest.raises(ValueError, match="reuse_server_buffers"):
        trainer.validate_arguments()
