"""Models whose training is more than a loss on Dense layers: their own losses and steps."""

import numpy as np

import keras


class ReconstructionPenalty(keras.layers.Layer):
    """Adds the mean squared distance between its two inputs to the model's losses."""

    def call(self, outputs, targets):
        self.add_loss(keras.ops.mean(keras.ops.square(outputs - targets)))
        return outputs


def _autoencoder():
    """An autoencoder whose whole loss is `add_loss`, compiled with ``loss=None``."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((8,))
    code = keras.layers.Dense(3)(inputs)
    outputs = ReconstructionPenalty()(keras.layers.Dense(8)(code), inputs)
    model = keras.Model(inputs, outputs)
    model.compile(optimizer="sgd")
    return model


def _frame(spark, x):
    rows = [(row.tolist(),) for row in x]
    return spark.createDataFrame(rows, "features array<float>").coalesce(1)


def test_a_model_compiled_without_a_loss_trains_on_its_own_as_fit_does(spark):
    from distkeras.trainers import SingleTrainer

    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    reference = _autoencoder()
    fitted = reference.fit(x, batch_size=16, epochs=1, shuffle=False, verbose=0)

    # `fit(x)` needs no labels: the features column stands for them (the loss ignores it).
    trainer = SingleTrainer(_autoencoder(), batch_size=16, features_col="features",
                            label_col="features")
    trained = trainer.train(_frame(spark, x), verbose=0)

    losses = [record["loss"] for record in trainer.get_history()]
    np.testing.assert_allclose(np.mean(losses), fitted.history["loss"][0], rtol=1e-4)
    for got, expected in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    assert trained.loss is None
