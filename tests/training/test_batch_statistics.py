"""BatchNormalization statistics measured again for averaged weights (`batch_statistics`)."""

import numpy as np
import pytest


def _bn_model(width=4, seed=0):
    import keras

    keras.utils.set_random_seed(seed)
    inputs = keras.Input((width,))
    hidden = keras.layers.BatchNormalization(name="bn")(inputs)
    outputs = keras.layers.Dense(2, activation="softmax")(hidden)
    return keras.Model(inputs, outputs)


def _rows(count, width=4, seed=1):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(count, width)) * [1.0, 3.0, 0.5, 2.0][:width]
            + [5.0, -2.0, 0.0, 1.0][:width]).astype("float32")


def test_the_statistics_become_the_mean_over_batches_exactly():
    from distkeras.training.batch_statistics import recompute

    model = _bn_model()
    layer = model.get_layer("bn")
    layer.moving_mean.assign(np.full(4, 100.0, "float32"))
    layer.moving_variance.assign(np.full(4, 100.0, "float32"))
    x = _rows(300)  # batches of 128, 128 and 44: each weighs the same, as in training
    assert recompute(model, x, batch_size=128) == 1
    batches = [x[0:128], x[128:256], x[256:300]]
    np.testing.assert_allclose(layer.moving_mean.numpy(),
                               np.mean([b.mean(axis=0) for b in batches], axis=0), rtol=1e-5)
    np.testing.assert_allclose(layer.moving_variance.numpy(),
                               np.mean([b.var(axis=0) for b in batches], axis=0), rtol=1e-4)
    assert layer.momentum == 0.99  # the layer's own, back


def test_frozen_layers_and_models_without_batch_normalization_are_left_alone():
    import keras

    from distkeras.training.batch_statistics import recompute

    model = _bn_model()
    layer = model.get_layer("bn")
    layer.trainable = False
    layer.moving_mean.assign(np.full(4, 7.0, "float32"))
    assert recompute(model, _rows(64)) == 0
    np.testing.assert_array_equal(layer.moving_mean.numpy(), np.full(4, 7.0))
    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    before = [w.copy() for w in plain.get_weights()]
    assert recompute(plain, _rows(64)) == 0
    for now, then in zip(plain.get_weights(), before):
        np.testing.assert_array_equal(now, then)


def test_a_nested_layer_is_measured_too():
    import keras

    from distkeras.training.batch_statistics import recompute

    inner = keras.Sequential([keras.Input((4,)), keras.layers.BatchNormalization(name="bn")])
    outer = keras.Sequential([keras.Input((4,)), inner, keras.layers.Dense(1)])
    x = _rows(256)
    assert recompute(outer, x, batch_size=256) == 1
    np.testing.assert_allclose(inner.get_layer("bn").moving_mean.numpy(), x.mean(axis=0),
                               rtol=1e-5)


def test_no_rows_is_refused():
    from distkeras.training.batch_statistics import recompute

    with pytest.raises(ValueError, match="No rows"):
        recompute(_bn_model(), _rows(0))


@pytest.mark.parametrize("trainer_name", ["AEASGD", "AveragingTrainer", "ADAG"])
def test_averaging_trainers_return_statistics_measured_with_the_returned_weights(
        spark, trainer_name):
    """The BN layer reads the features directly, so its statistics measured again are the
    features' own, whatever the weights: AEASGD and AveragingTrainer return exactly those;
    ADAG (a center the workers' steps move, not an average) returns the workers' own."""
    from distkeras import trainers
    from distkeras.training.batch_statistics import SAMPLE_ROWS

    x = _rows(512)
    labels = (x[:, 0] > 5.0).astype("int64")
    frame = spark.createDataFrame([(row.tolist(), [float(1 - l), float(l)])
                                   for row, l in zip(x, labels)],
                                  "features array<float>, label array<float>").coalesce(1)
    assert len(x) < SAMPLE_ROWS  # every row is read back, in one batch... of 256
    trainer = getattr(trainers, trainer_name)(
        _bn_model(), worker_optimizer="adam", loss="categorical_crossentropy",
        num_workers=2, batch_size=32, num_epoch=1)
    model = trainer.train(frame)
    mean = model.get_layer("bn").moving_mean.numpy()
    expected = np.mean([x[:256].mean(axis=0), x[256:].mean(axis=0)], axis=0)
    if trainer_name == "ADAG":
        assert not np.allclose(mean, expected, rtol=1e-3)
    else:
        np.testing.assert_allclose(mean, expected, rtol=1e-4)
