"""The trainers' ``compression`` on real local Spark: bfloat16 and top-k exchanges that
learn, and the settings that cannot be compressed, refused with a clear error."""

import pytest

from conftest import accuracy, build_mlp


def trained(fashion_train, trainer_class, compression, **options):
    import keras

    keras.utils.set_random_seed(5)
    trainer = trainer_class(build_mlp(32), "adam", "categorical_crossentropy",
                            num_workers=2, compression=compression, **options)
    model = trainer.train(fashion_train.limit(3000), verbose=0)
    return model, trainer


@pytest.mark.parametrize("name,compression,options", [
    ("ADAG", "bfloat16", {}),
    ("DOWNPOUR", "topk:0.05", {"overlap_communication": True}),
])
def test_compressed_exchanges_train_on_spark(spark, fashion_train, fashion_test, name,
                                             compression, options):
    from distkeras import trainers
    from distkeras.transport import compression as codecs

    model, trainer = trained(fashion_train, getattr(trainers, name), compression, **options)
    server = trainer.parameter_server
    assert server.compression == codecs.parse(compression)
    assert trainer.num_updates() > 4 and server.center.refused == 0
    assert not server.transport.errors
    assert trainer.get_config()["compression"] == compression
    assert accuracy(model, fashion_test) > 0.5  # it learned (chance: 0.1)


def test_compression_is_checked_before_any_spark_job():
    from distkeras import parameter_servers
    from distkeras.trainers import ADAG, AsynchronousDistributedTrainer, Experimental

    assert "compression" not in ADAG(build_mlp(8), "adam",
                                     "categorical_crossentropy").get_config()
    with pytest.raises(ValueError, match="topk:F"):
        ADAG(build_mlp(8), "adam", "categorical_crossentropy",
             compression="int8").validate_arguments()

    class EscapeHatch(AsynchronousDistributedTrainer):
        def allocate_worker(self):
            raise AssertionError("not reached")

    with pytest.raises(ValueError, match="has no algorithm.*compression=None"):
        EscapeHatch(build_mlp(8), "adam", "categorical_crossentropy",
                    compression="bfloat16").validate_arguments()

    class OwnServer(ADAG):
        def allocate_parameter_server(self):
            return parameter_servers.DeltaParameterServer(self.master_model, 0)

    trainer = OwnServer(build_mlp(8), "adam", "categorical_crossentropy",
                        compression="bfloat16")
    with pytest.raises(ValueError, match="does not serve compression='bfloat16'"):
        trainer.checked_parameter_server()
    with pytest.raises(ValueError, match="carry the center the worker pulled"):
        Experimental(build_mlp(8), "adam", "categorical_crossentropy",
                     compression="topk").allocate_parameter_server()
