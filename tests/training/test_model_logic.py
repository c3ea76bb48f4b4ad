"""Models whose training is more than a loss on Dense layers: their own losses and steps."""

import numpy as np
import pytest

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


class ZeroingModel(keras.Model):
    """Its own `train_step` (Keras 3, JAX): every trainable weight becomes 0, loss 42."""

    def train_step(self, state, data):
        trainable, non_trainable, optimizer, metrics = state
        zeros = [keras.ops.zeros_like(value) for value in trainable]
        return ({"loss": keras.ops.convert_to_tensor(42.0)},
                (zeros, non_trainable, optimizer, metrics))


class ZeroingSubclass(ZeroingModel):
    """The same step, with layers called in `call`: no known inputs."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = keras.layers.Dense(2, activation="softmax")

    def call(self, inputs):
        return self.dense(inputs)


def test_wrapping_a_subclass_with_its_own_train_step_is_not_advised(spark):
    from distkeras.trainers import SingleTrainer

    model = ZeroingSubclass()
    model(np.zeros((1, 8), "float32"))
    model.compile("sgd", "categorical_crossentropy")
    frame = spark.createDataFrame([([0.0] * 8, [1.0, 0.0])],
                                  "features array<float>, label array<float>")
    with pytest.raises(ValueError, match="would train without its own train_step.*"
                                         r"ZeroingSubclass\(inputs, outputs\)"):
        SingleTrainer(model).train(frame, verbose=0)


def test_the_functional_form_of_a_subclass_trains_with_its_own_train_step(spark):
    from distkeras.trainers import SingleTrainer

    inputs = keras.Input((8,))
    model = ZeroingModel(inputs, keras.layers.Dense(2, activation="softmax")(inputs))
    model.compile("sgd", "categorical_crossentropy")
    frame = spark.createDataFrame([([1.0] * 8, [1.0, 0.0])] * 32,
                                  "features array<float>, label array<float>").coalesce(1)
    trainer = SingleTrainer(model, batch_size=16)
    trained = trainer.train(frame, verbose=0)

    assert isinstance(trained, ZeroingModel)
    assert all(not np.any(weight) for weight in trained.get_weights())
    assert [record["loss"] for record in trainer.get_history()] == [42.0, 42.0]


class StepCounter(keras.Model):
    """Reports as its loss how often its Python `train_step` ran: once per step when run
    eagerly, once for all steps under jit (the trace)."""

    calls = 0

    def train_step(self, state, data):
        self.calls += 1
        return {"loss": keras.ops.convert_to_tensor(float(self.calls))}, state


def test_workers_run_a_model_compiled_with_run_eagerly_eagerly(spark):
    from distkeras.trainers import ADAG, SingleTrainer

    frame = spark.createDataFrame([([1.0] * 8, [1.0, 0.0])] * 64,
                                  "features array<float>, label array<float>").coalesce(2)
    for cls, settings in ((SingleTrainer, {}), (ADAG, {"num_workers": 1})):
        inputs = keras.Input((8,))
        model = StepCounter(inputs, keras.layers.Dense(2, activation="softmax")(inputs))
        model.compile("sgd", "categorical_crossentropy", run_eagerly=True)
        trainer = cls(model, batch_size=16, **settings)
        trainer.train(frame, verbose=0)

        # As `model.fit(x, y, batch_size=16)` logs them: 1, 2, 3, 4.
        assert [record["loss"] for record in trainer.get_history()] == [1.0, 2.0, 3.0, 4.0]


class GuideStepModel(keras.Model):
    """The `train_step` of Keras's JAX guide: it unpacks ``x, y = data`` and reports a
    `Mean` of its own as the loss."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_tracker = keras.metrics.Mean(name="loss")

    def _loss(self, trainable, non_trainable, x, y):
        y_pred, non_trainable = self.stateless_call(trainable, non_trainable, x,
                                                    training=True)
        return keras.ops.mean(keras.ops.square(y - y_pred)), non_trainable

    def train_step(self, state, data):
        import jax

        trainable, non_trainable, optimizer, metrics = state
        x, y = self._unpack(data)
        (loss, non_trainable), grads = jax.value_and_grad(self._loss, has_aux=True)(
            trainable, non_trainable, x, y)
        trainable, optimizer = self.optimizer.stateless_apply(optimizer, grads, trainable)
        metrics = self.loss_tracker.stateless_update_state(metrics, loss)
        return ({"loss": self.loss_tracker.stateless_result(metrics)},
                (trainable, non_trainable, optimizer, metrics))

    @staticmethod
    def _unpack(data):
        x, y = data
        return x, y

    @property
    def metrics(self):
        return [self.loss_tracker]


def _guide_model(**options):
    keras.utils.set_random_seed(2)
    inputs = keras.Input((4,))
    model = GuideStepModel(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer="sgd", **options)
    return model


def test_a_train_step_unpacking_x_and_y_trains_as_with_fit(spark):
    from distkeras.trainers import SingleTrainer

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    reference = _guide_model()
    fitted = reference.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)

    frame = spark.createDataFrame([(a.tolist(), b.tolist()) for a, b in zip(x, y)],
                                  "features array<float>, label array<float>").coalesce(1)
    trainer = SingleTrainer(_guide_model(), batch_size=16)
    trained = trainer.train(frame, verbose=0)  # fit passes (x, y), not (x, y, None)

    losses = [record["loss"] for record in trainer.get_history()]
    np.testing.assert_allclose(np.mean(losses), fitted.history["loss"][0], rtol=1e-4)
    for got, expected in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("options", [{"run_eagerly": True}, {"jit_compile": False}])
def test_a_train_step_unpacking_x_and_y_trains_as_with_fit_off_the_fast_path(spark, options):
    from distkeras.trainers import SingleTrainer
    from distkeras.executor.replica import overrides_train_step

    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    reference = _guide_model(**options)
    fitted = reference.fit(x, y, batch_size=16, epochs=1, shuffle=False, verbose=0)

    frame = spark.createDataFrame([(a.tolist(), b.tolist()) for a, b in zip(x, y)],
                                  "features array<float>, label array<float>").coalesce(1)
    trainer = SingleTrainer(_guide_model(**options), batch_size=16)
    # The workers step through Keras's train_on_batch here, which passed (x, y, None): "too
    # many values to unpack (expected 2)" on every executor.
    trained = trainer.train(frame, verbose=0)

    losses = [record["loss"] for record in trainer.get_history()]
    np.testing.assert_allclose(np.mean(losses), fitted.history["loss"][0], rtol=1e-4)
    for got, expected in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    # Models with Keras's own train_step keep Keras's train_on_batch as it is.
    assert overrides_train_step(reference)
    assert not overrides_train_step(keras.Sequential([keras.Input((4,)),
                                                      keras.layers.Dense(1)]))


class FeaturesOnlyStepModel(GuideStepModel):
    """The `train_step` of Keras's VAE example, for ``fit(x)``: its batch is ``x`` alone
    (``x = data``), which it reconstructs."""

    @staticmethod
    def _unpack(data):
        x = data
        return x, x


def _features_only_model():
    keras.utils.set_random_seed(3)
    inputs = keras.Input((8,))
    model = FeaturesOnlyStepModel(inputs, keras.layers.Dense(8)(keras.layers.Dense(3)(inputs)))
    model.compile(optimizer="sgd")
    return model


def test_label_col_none_trains_a_model_of_its_own_loss_as_fit_x_does(spark):
    from distkeras.trainers import ADAG, SingleTrainer

    x = np.random.default_rng(0).normal(size=(64, 8)).astype("float32")
    reference = _features_only_model()
    fitted = reference.fit(x, batch_size=16, epochs=1, shuffle=False, verbose=0)

    # label_col=None: no targets, as fit(x); the step gets x alone, and so does the
    # validation, given as fit takes it, (x,).
    trainer = SingleTrainer(_features_only_model(), batch_size=16, label_col=None)
    trained = trainer.train(_frame(spark, x), validation_data=(x[:16],), verbose=0)

    losses = [record["loss"] for record in trainer.get_history()]
    np.testing.assert_allclose(np.mean(losses), fitted.history["loss"][0], rtol=1e-4)
    for got, expected in zip(trained.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    assert len(trainer.get_validation_history()) == 1
    # Keras's own train_step, on a model whose loss is add_loss, through a worker's window.
    adag = ADAG(_autoencoder(), batch_size=16, num_workers=1, label_col=None)
    adag.train(_frame(spark, x), verbose=0)
    assert len(adag.get_history()) == 4 and np.isfinite(adag.get_history()[-1]["loss"])


def test_label_col_none_is_refused_where_fit_x_could_not_train(spark):
    from distkeras.trainers import SingleTrainer

    frame = _frame(spark, np.zeros((4, 8), "float32"))
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(8)])
    model.compile("sgd", "mse")
    with pytest.raises(ValueError, match="label_col=None trains without targets.*"
                                         "loss='mse'.*label_col='features'"):
        SingleTrainer(model, label_col=None).train(frame, verbose=0)
    with pytest.raises(ValueError, match="with label_col=None there are none"):
        SingleTrainer(_autoencoder(), label_col=None).train(
            frame.selectExpr("*", "1.0 AS weight"), sample_weight_col="weight", verbose=0)
