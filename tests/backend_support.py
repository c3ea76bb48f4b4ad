"""Trains on local Spark under the Keras backend named in KERAS_BACKEND; prints a JSON line.

Run by tests/test_backends.py in a process of its own: a Keras backend is chosen once per
process, and the shared test session runs JAX.
"""

import json
import sys

from distkeras.session import local_spark_session, warm_up_executors


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
    spark.stop()
    sys.stdout.write(json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
