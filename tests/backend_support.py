"""Trains on local Spark under the Keras backend named in KERAS_BACKEND (the library's
trainers, and a model with the train_step of that backend's Keras guide); prints a JSON line.

Run by tests/product/test_backends.py in a process of its own: a Keras backend is chosen once per
process, and the shared test session runs JAX.
"""

import json
import sys

from distkeras.session import local_spark_session, warm_up_executors


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


def check_guide_step(spark):
    """Trains the guide's model with `fit` and with SingleTrainer on ``spark``; returns
    fit's epoch loss, SingleTrainer's step losses and the largest weight difference."""
    import keras
    import numpy as np

    from distkeras.trainers import SingleTrainer

    # Defined once Keras is imported (after Spark); it travels with the task as any
    # class of the driver's script (see `distkeras.keras_io.custom_objects`).
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
    return {
        "fit_loss": fitted.history["loss"][0],
        "losses": [record["loss"] for record in trainer.get_history()],
        "weight_error": max(float(np.max(np.abs(got - expected))) for got, expected in
                            zip(trained.get_weights(), reference.get_weights())),
    }


def main():
    spark = local_spark_session("local[2]", app_name="distkeras-backend-test")
    executors = warm_up_executors(spark)
    import keras
    import numpy as np

    from distkeras.datasets import load_fashion_mnist, load_fashion_mnist_numpy
    from distkeras.predictors import ModelPredictor
    from distkeras.trainers import ADAG, AveragingTrainer, SingleTrainer

    train = load_fashion_mnist(spark, "train", limit=3000).cache()
    test = load_fashion_mnist(spark, "test", limit=1000)
    _, labels = load_fashion_mnist_numpy("test")

    def mlp():
        return keras.Sequential([keras.Input((784,)), keras.layers.Dense(64, activation="relu"),
                                 keras.layers.Dense(10, activation="softmax")])

    results = {"driver": keras.backend.backend(),
               "executors": sorted({worker.split(":")[1] for worker in executors})}
    # Validating: SingleTrainer's one task goes on with its optimizer state at the epoch end.
    for trainer in (SingleTrainer(mlp(), "adam", "categorical_crossentropy", num_epoch=2),
                    ADAG(mlp(), "adam", "categorical_crossentropy", num_workers=2,
                         communication_window=4, num_epoch=2),
                    # Both epochs in one job: the workers' optimizers reset at the average.
                    AveragingTrainer(mlp(), "adam", "categorical_crossentropy",
                                     num_workers=2, num_epoch=2)):
        model = trainer.train(train, verbose=0, validation_data=test.limit(200))
        # Prediction on the executors too, in the test set's order.
        predicted = ModelPredictor(model).predict(test).select("prediction").collect()
        guesses = np.array([row["prediction"] for row in predicted]).argmax(axis=1)
        results[type(trainer).__name__] = {
            "accuracy": float(np.mean(guesses == labels[:1000])),
            "steps": len(trainer.get_history()),
            "validation_epochs": [record["epoch"]
                                  for record in trainer.get_validation_history()],
            "compiled": bool(model.compiled),
            "one_job": getattr(trainer, "parameter_server", None) is not None,
        }
    # A model's own train_step (the backend's guide: x, y = data) on the executors.
    results["own_train_step"] = check_guide_step(spark)
    spark.stop()
    sys.stdout.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
