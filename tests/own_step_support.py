"""Trains a model with the `train_step` of Keras's guide for the backend named in
KERAS_BACKEND (``x, y = data``) with `fit` and with SingleTrainer; prints a JSON line.

Run by tests/test_model_logic.py in a process of its own: a Keras backend is chosen once per
process, and the shared test session runs JAX.
"""

import json
import sys

from distkeras.session import local_spark_session


def _guide_class(keras):
    """The model of Keras's "Customizing what happens in fit()" guide for this backend."""
    backend = keras.backend.backend()

    def report(model, loss, y, y_pred):
        for metric in model.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            else:
                metric.update_state(y, y_pred)
        return {metric.name: metric.result() for metric in model.metrics}

    if backend == "torch":
        import torch

        class TorchGuideModel(keras.Model):
            def train_step(self, data):
                x, y = data
                self.zero_grad()
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
                loss.backward()
                variables = list(self.trainable_weights)
                with torch.no_grad():
                    self.optimizer.apply([v.value.grad for v in variables], variables)
                return report(self, loss, y, y_pred)

        return TorchGuideModel

    import tensorflow as tf

    class TensorFlowGuideModel(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables),
                                 self.trainable_variables)
            return report(self, loss, y, y_pred)

    return TensorFlowGuideModel


def main():
    spark = local_spark_session("local[2]", app_name="distkeras-own-step-test")
    import keras
    import numpy as np

    from distkeras.trainers import SingleTrainer

    # Defined once Keras is imported (after Spark); it travels with the task as any
    # class of the driver's script (see `distkeras.custom_objects`).
    guide_model = _guide_class(keras)

    def model(**options):
        keras.utils.set_random_seed(3)
        inputs = keras.Input((4,))
        built = guide_model(inputs, keras.layers.Dense(1)(inputs))
        built.compile(optimizer="sgd", loss="mse", **options)
        return built

    rng = np.random.default_rng(0)
    x = rng.normal(size=(256, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    reference = model()
    fitted = reference.fit(x, y, batch_size=32, epochs=1, shuffle=False, verbose=0)
    frame = spark.createDataFrame([(a.tolist(), b.tolist()) for a, b in zip(x, y)],
                                  "features array<float>, label array<float>").coalesce(1)
    trainer = SingleTrainer(model(), batch_size=32)
    trained = trainer.train(frame, verbose=0)
    spark.stop()
    losses = [record["loss"] for record in trainer.get_history()]
    sys.stdout.write(json.dumps({
        "backend": keras.backend.backend(),
        "fit_loss": fitted.history["loss"][0],
        "losses": losses,
        "weight_error": max(float(np.max(np.abs(got - expected))) for got, expected in
                            zip(trained.get_weights(), reference.get_weights())),
    }) + "\n")


if __name__ == "__main__":
    main()
