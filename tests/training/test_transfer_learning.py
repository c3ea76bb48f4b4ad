"""Transfer learning with the trainers: a base pre-trained with plain Keras, frozen
(``trainable = False``, BatchNormalization in it then in inference mode) under a new head,
trained on the shared local Spark session, then partly unfrozen and trained again from the
returned model, as a user fine-tunes with ``fit``."""

import numpy as np
import pytest

ROWS = 240


@pytest.fixture(scope="module")
def separable(spark):
    """A few hundred rows of a two-class problem, in 3 partitions."""
    from pyspark.sql import Row

    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 8)).astype("float32")
    y = np.eye(2, dtype="float32")[(x[:, 0] + x[:, 1] > 0).astype(int)]
    rows = [Row(features=x[i].tolist(), label=y[i].tolist()) for i in range(ROWS)]
    return x, y, spark.createDataFrame(rows).repartition(3).cache()


def _pretrained_base(x, y):
    """A small Dense-BatchNorm base trained briefly by `fit`, as a nested `keras.Model`."""
    import keras

    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    hidden = keras.layers.BatchNormalization()(hidden)
    hidden = keras.layers.Dense(8, activation="relu")(hidden)
    base = keras.Model(inputs, hidden, name="base")
    pretraining = keras.Sequential([base, keras.layers.Dense(2, activation="softmax")])
    pretraining.compile("adam", "categorical_crossentropy")
    pretraining.fit(x, y, epochs=1, batch_size=32, verbose=0)
    return base


def _frozen_base_model(x, y):
    import keras

    base = _pretrained_base(x, y)
    base.trainable = False
    model = keras.Sequential([keras.Input((8,)), base,
                              keras.layers.Dense(2, activation="softmax")])
    model.compile(keras.optimizers.Adam(1e-2), "categorical_crossentropy")
    return model, base


def _assert_bitwise(before, after):
    assert len(before) == len(after)
    for index, (old, new) in enumerate(zip(before, after)):
        assert old.dtype == new.dtype and old.tobytes() == new.tobytes(), index


def test_averaging_keeps_a_frozen_base_bit_for_bit(separable):
    # Three replicas hold the same frozen kernels; their mean was (w + w + w) / 3, which
    # float32 rounds: the frozen base and its BatchNorm statistics drifted by an ulp.
    from distkeras.trainers import AveragingTrainer

    x, y, frame = separable
    model, base = _frozen_base_model(x, y)
    before = [np.array(weight) for weight in base.get_weights()]
    trainer = AveragingTrainer(model, batch_size=16, num_workers=3, num_epoch=1)
    trained = trainer.train(frame, verbose=0)
    assert trained.layers[0].trainable is False
    _assert_bitwise(before, trained.layers[0].get_weights())


def test_single_trainer_refuses_unfreezing_without_compiling_again(separable):
    # `fit` refuses it; SingleTrainer failed on the executor, after every attempt, with
    # 'The optimizer has 10 variables; the state given has 6'.
    import keras

    from distkeras.trainers import SingleTrainer

    x, y, frame = separable
    model, base = _frozen_base_model(x, y)
    model.fit(x[:32], y[:32], batch_size=16, verbose=0)
    base.trainable = True  # `fit` now raises "... the optimizer was built with 2 variables"
    with pytest.raises(ValueError, match=r"Call `model.compile\(...\)` again"):
        SingleTrainer(model, batch_size=16).train(frame.limit(32), verbose=0)
    model.compile(keras.optimizers.Adam(1e-4), "categorical_crossentropy")
    trained = SingleTrainer(model, batch_size=16).train(frame.limit(32), verbose=0)
    assert len(trained.trainable_weights) == len(model.trainable_weights)
